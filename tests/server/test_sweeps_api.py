"""Parameter sweeps over REST against a real JupyterLab: POST jobs/sweeps, the sweep's
counts and elements, the results table, cancel and bad input named by field; every
answer validated against openapi.yaml."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import checked


def _nb(*cells) -> dict:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "cells": [
            {
                "cell_type": "code",
                "id": f"c{i}",
                "metadata": {"tags": tags},
                "execution_count": None,
                "outputs": [],
                "source": src,
            }
            for i, (src, tags) in enumerate(cells)
        ],
    }


RECORDS = _nb(
    ("alpha = 1\nn = 1", ["parameters"]),
    (
        "from jupyter_cloudtik.hpc import record\nrecord('score', alpha * n)\n"
        "open('out.txt', 'w').write('x')",
        [],
    ),
)
LONG = _nb(("seconds = 300", ["parameters"]), ("import time\ntime.sleep(seconds)", []))


@pytest.fixture(scope="module")
def sweep_files(lab):
    d = lab.root / "sweeps-api"
    d.mkdir(exist_ok=True)
    (d / "records.ipynb").write_text(json.dumps(RECORDS))
    (d / "long.ipynb").write_text(json.dumps(LONG))
    return d


def wait_sweep(lab, sweep_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sweep = lab.get(f"jobs/sweeps/{sweep_id}").json()
        if sweep["state"] in ("succeeded", "failed", "cancelled"):
            return sweep
        time.sleep(0.3)
    raise AssertionError(f"sweep {sweep_id} did not end: {sweep}")


def test_sweep_over_rest_results_and_cancel(lab, spec_checker, sweep_files):
    resp = checked(
        spec_checker,
        lab.request(
            "POST",
            "jobs/sweeps",
            json={
                "notebook": "sweeps-api/records.ipynb",
                "grid": {"alpha": [1, 2]},
                "parameters": {"n": 10},
                "max_concurrent": 2,
            },
        ),
    )
    assert resp.status_code == 201, resp.text
    sweep = resp.json()["sweep"]
    assert resp.headers["Location"].endswith(f"/jobs/sweeps/{sweep['id']}")
    assert sweep["mode"] == "bounded" and len(sweep["elements"]) == 2
    done = wait_sweep(lab, sweep["id"])
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 2, done
    checked(spec_checker, lab.get(f"jobs/sweeps/{sweep['id']}"))
    rows = checked(spec_checker, lab.get(f"jobs/sweeps/{sweep['id']}/results")).json()["rows"]
    assert [(r["alpha"], r["score"], r["outputs"]) for r in rows] == [
        (1, 10, ["out.txt"]),
        (2, 20, ["out.txt"]),
    ]
    listed = checked(spec_checker, lab.get("jobs/sweeps")).json()["sweeps"]
    assert sweep["id"] in {s["id"] for s in listed}
    # each element is a job that names its sweep; the panel's list leaves them out
    element_jobs = {e["job"] for e in done["elements"]}
    every = checked(spec_checker, lab.get("jobs")).json()["jobs"]
    assert {j["sweep"] for j in every if j["id"] in element_jobs} == {sweep["id"]}
    alone = checked(spec_checker, lab.get("jobs?sweep_elements=false")).json()["jobs"]
    assert not element_jobs & {j["id"] for j in alone}
    assert all(j["sweep"] is None for j in alone)
    # cancel one element, then the rest
    resp = checked(
        spec_checker,
        lab.request(
            "POST",
            "jobs/sweeps",
            json={"notebook": "sweeps-api/long.ipynb", "zip": {"seconds": [300, 301]}},
        ),
    )
    long = resp.json()["sweep"]
    one = checked(
        spec_checker, lab.request("POST", f"jobs/sweeps/{long['id']}/cancel", json={"element": 1})
    ).json()
    assert one["id"] == long["id"]
    checked(spec_checker, lab.request("DELETE", f"jobs/sweeps/{long['id']}"))
    ended = wait_sweep(lab, long["id"], timeout=60)
    assert ended["state"] == "cancelled" and ended["counts"]["cancelled"] == 2, ended


def test_bad_sweeps_over_rest_name_the_field(lab, spec_checker, sweep_files):
    nb = "sweeps-api/records.ipynb"
    cases = [
        ({"notebook": nb, "grid": {}}, 400, "grid"),
        ({"notebook": nb, "grid": {"alpha": [1], "beta": [2]}}, 400, "grid.beta"),
        ({"notebook": nb, "zip": {"alpha": [1, 2], "n": [1]}}, 400, "zip.n"),
        ({"notebook": nb, "elements": [{"alpha": 1}, {"gamma": 1}]}, 400, "elements[1].gamma"),
        (
            {"notebook": nb, "grid": {"alpha": list(range(100)), "n": list(range(11))}},
            400,
            "grid",
        ),  # 1100 elements > HPC.max_sweep_elements (1000)
        ({"notebook": nb, "grid": {"alpha": [1]}, "backend": "nope"}, 400, "backend"),
        ({"grid": {"alpha": [1]}}, 400, "body"),
        # HPC.sweep_max_concurrent (32 here) is a ceiling, not a default a user raises
        ({"notebook": nb, "grid": {"alpha": [1]}, "max_concurrent": 33}, 400, "max_concurrent"),
    ]
    before = len(lab.get("jobs").json()["jobs"])
    for body, status, field in cases:
        resp = checked(spec_checker, lab.request("POST", "jobs/sweeps", json=body))
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["field"] == field, (body, resp.json())
        assert "Traceback" not in resp.text
    assert len(lab.get("jobs").json()["jobs"]) == before  # nothing was recorded
    assert checked(spec_checker, lab.get("jobs/sweeps/sfeedbee")).status_code == 404

    resp = lab.request("POST", "jobs/sweeps", json={
        "notebook": nb, "grid": {"alpha": [1]}, "max_concurrent": 1000})
    msg = resp.json()["message"]
    assert "\n" not in msg and "1000" in msg and "at most 32" in msg, msg


def test_cancel_element_of_another_type_or_range_is_400(lab, spec_checker, sweep_files):
    """``true`` is no element 1, and "1", 1.0 or 2 (of 0-1) are bad input, not a 404."""
    long = lab.request(
        "POST", "jobs/sweeps",
        json={"notebook": "sweeps-api/long.ipynb", "zip": {"seconds": [300, 301]}},
    ).json()["sweep"]
    try:
        for bad in (True, False, "1", 1.0, [1], 2, -1):
            resp = checked(spec_checker, lab.request(
                "POST", f"jobs/sweeps/{long['id']}/cancel", json={"element": bad}))
            assert resp.status_code == 400, (bad, resp.text)
            body = resp.json()
            assert body["field"] == "element" and "\n" not in body["message"], body
            assert "Traceback" not in resp.text
        sweep = lab.get(f"jobs/sweeps/{long['id']}").json()
        assert sweep["counts"]["cancelled"] == 0, sweep  # nothing was cancelled
    finally:
        lab.request("DELETE", f"jobs/sweeps/{long['id']}")
        wait_sweep(lab, long["id"], timeout=60)
