"""Parameter sweeps through the hub sidekick (a real JupyterHub): the same grant as a
single job (``run`` on the backend, from the catalogue), the notebook sent as content,
and a user sees, cancels, retries and reads only their own sweeps (another user's is a
404, exactly like a missing one)."""

from __future__ import annotations

import base64
import json
import time

import pytest

from cloudtik_emulators.hub import start_hub

pytestmark = pytest.mark.slow

# records `score` the way a notebook without jupyter_cloudtik does (docs/hpc.md, Sweeps)
NOTEBOOK = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "cells": [
        {
            "cell_type": "code",
            "id": "p",
            "metadata": {"tags": ["parameters"]},
            "execution_count": None,
            "outputs": [],
            "source": "alpha = 1",
        },
        {
            "cell_type": "code",
            "id": "w",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": (
                "from IPython.display import display\n"
                "display({'application/scrapbook.scrap.json+json': {'name': 'score', "
                "'data': alpha * 10, 'encoder': 'json', 'version': 1}}, raw=True)"
            ),
        },
    ],
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub-sweeps"))
    yield h
    h.stop()


def test_sweeps_through_the_sidekick_are_the_users_own(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.browser("admin")
    body = {
        "notebook": "s.ipynb",
        "backend": "local",
        "grid": {"alpha": [1, 2]},
        "files": {"s.ipynb": base64.b64encode(json.dumps(NOTEBOOK).encode()).decode()},
    }
    r = alice.post(api + "jobs/sweeps", json=body)
    assert r.status_code == 404 and r.json()["field"] == "backend", r.text  # not offered
    r = admin.put(api + "hub/catalog/hpc/local", json={"spec": {}, "groups": ["physics"]})
    assert r.status_code == 200, r.text

    r = alice.post(api + "jobs/sweeps", json=body)
    assert r.status_code == 201, r.text
    sweep = r.json()["sweep"]
    assert sweep["user"] == "alice" and len(sweep["elements"]) == 2
    deadline = time.monotonic() + 120
    while (got := alice.get(api + f"jobs/sweeps/{sweep['id']}").json())["state"] not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert time.monotonic() < deadline, got
        time.sleep(0.3)
    assert got["state"] == "succeeded", got
    rows = alice.get(api + f"jobs/sweeps/{sweep['id']}/results").json()["rows"]
    assert [(r["alpha"], r["score"]) for r in rows] == [(1, 10), (2, 20)]
    for e in got["elements"]:  # its elements are alice's jobs
        assert alice.get(api + f"jobs/{e['job']}").json()["user"] == "alice"
        assert bob.get(api + f"jobs/{e['job']}").status_code == 404

    # bob: the very answer of a missing sweep, for every route; none listed
    missing = "s0000000"
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/cancel"),
        ("POST", "/retry"),
        ("GET", "/results"),
    ):
        mine = bob.request(method, api + f"jobs/sweeps/{sweep['id']}{path}", json={})
        none = bob.request(method, api + f"jobs/sweeps/{missing}{path}", json={})
        assert mine.status_code == none.status_code == 404, (method, path, mine.text)
        assert mine.json()["reason"] == none.json()["reason"]
    assert bob.get(api + "jobs/sweeps").json()["sweeps"] == []
    assert [s["id"] for s in alice.get(api + "jobs/sweeps").json()["sweeps"]] == [sweep["id"]]
    r = bob.post(api + "jobs/sweeps", json=body)  # bob is not granted the backend
    assert r.status_code == 404 and r.json()["field"] == "backend", r.text
    # a local path of the sidekick's machine is no user's
    r = alice.post(
        api + "jobs/sweeps",
        json={"notebook": "/etc/passwd", "backend": "local", "grid": {"alpha": [1]}},
    )
    assert r.status_code in (400, 403, 404) and r.json()["field"] == "notebook", r.text
