"""Parameter sweeps (hpc.sweeps): one Slurm job array on the real Slurm, a bounded set of
jobs on the local backend; partial failure and retry, cancel, the results table, and bad
input refused before anything is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.api import Job, Sweep
from jupyter_cloudtik.hpc.sweeps import expand, read_recorded

from .conftest import _nb, wait_for


@pytest.fixture
def sweep_nb(tmp_path):
    """alpha * n recorded as `score`, a file per element; alpha == 3 fails unless the
    file `allow3` exists next to the notebook (so a retry can succeed)."""
    d = tmp_path / "sweepnb"
    d.mkdir()
    flag = d / "allow3"
    nb = _nb(
        ("alpha = 1\nn = 2", ["parameters"]),
        (
            "import os\n"
            f"assert alpha != 3 or os.path.exists({str(flag)!r}), 'alpha 3 refused'\n"
            "from jupyter_cloudtik.hpc import record\n"
            "record('score', alpha * n)\n"
            "open('out.txt', 'w').write(str(alpha * n))",
            [],
        ),
    )
    path = d / "sweep.ipynb"
    path.write_text(json.dumps(nb))
    return path, flag


def test_recorded_values_of_a_notebook_of_another_shape_are_none():
    """The output notebook is what the job wrote (the user's code): a shape that is no
    notebook's records nothing, it never fails the sweep's results (a 500)."""
    scrap = {"application/scrapbook.scrap.json+json": {"name": "x", "data": 1}}
    good = {"cells": [{"outputs": [{"data": scrap}]}]}
    assert read_recorded(json.dumps(good)) == {"x": 1}
    for bad in ("[]", "3", '{"cells": {"a": 1}}', '{"cells": ["text"]}',
                '{"cells": [{"outputs": "x"}]}', '{"cells": [{"outputs": [1, null]}]}',
                b"\xff"):
        assert read_recorded(bad) == {}, bad


def test_expand_grid_zip_and_elements():
    assert expand({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    assert expand(zip={"a": [1, 2], "b": [3, 4]}) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
    assert expand({"c": [0, 1]}, zip={"a": [1, 2], "b": [3, 4]}) == [
        {"c": 0, "a": 1, "b": 3},
        {"c": 0, "a": 2, "b": 4},
        {"c": 1, "a": 1, "b": 3},
        {"c": 1, "a": 2, "b": 4},
    ]
    assert expand(elements=[{"a": 1}, {"a": 2, "b": 0}]) == [{"a": 1}, {"a": 2, "b": 0}]
    for kwargs, field in [
        ({}, "grid"),
        ({"grid": {"a": []}}, "grid.a"),
        ({"zip": {"a": [1], "b": [1, 2]}}, "zip.b"),
        ({"elements": [{"a": 1}, 3]}, "elements[1]"),
        ({"elements": []}, "elements"),
    ]:
        with pytest.raises(ConfigError) as e:
            expand(**kwargs)
        assert e.value.field == field, (kwargs, e.value.message)


def test_bad_sweeps_are_refused_before_anything_is_recorded(make_client, sweep_nb):
    c = make_client({"local": {"type": "local"}}, max_sweep_elements=5)
    nb, _ = sweep_nb
    cases = [
        (dict(grid={}), "grid", "the sweep is empty"),
        (dict(grid={"alpha": [1], "beta": [1, 2]}), "grid.beta", "beta=1 is not a parameter"),
        (
            dict(elements=[{"alpha": 1}, {"alpha": 2, "gamma": 0}]),
            "elements[1].gamma",
            "gamma=0 is not a parameter",
        ),
        (
            dict(grid={"alpha": [1, 2, 3], "n": [1, 2]}),
            "grid",
            "6 elements, more than HPC.max_sweep_elements (5)",
        ),
        (dict(grid={"alpha": [1]}, max_concurrent=0), "max_concurrent", "at least 1"),
    ]
    for kwargs, field, text in cases:
        with pytest.raises(ConfigError) as e:
            Job.sweep(str(nb), client=c, **kwargs)
        assert e.value.field == field and text in e.value.message, e.value.message
        assert "\n" not in e.value.message
    assert c.list() == [] and c.list_sweeps() == []


@pytest.mark.slow
def test_local_sweep_is_bounded_partial_failure_retry_and_results(make_client, sweep_nb):
    c = make_client({"local": {"type": "local"}})
    nb, flag = sweep_nb
    s = Job.sweep(
        str(nb), grid={"alpha": [1, 3, 5]}, parameters={"n": 10}, client=c, max_concurrent=2
    )
    assert s.info.mode == "bounded"
    # never more than 2 of its jobs submitted and not ended
    peak = 0

    def watch():
        nonlocal peak
        info = s.info
        peak = max(
            peak,
            sum(1 for e in info.elements if e["native_id"] and e["state"] in ("queued", "running")),
        )
        return info.done

    wait_for(watch, timeout=180, interval=0.05, what="the local sweep to end")
    assert peak <= 2
    info = s.info
    assert info.state == "failed"
    assert info.counts["succeeded"] == 2 and info.counts["failed"] == 1
    failed = [e for e in info.elements if e["state"] == "failed"]
    assert [e["parameters"] for e in failed] == [{"alpha": 3}]
    assert "alpha 3 refused" in failed[0]["reason"]
    old_jobs = {e["index"]: e["job"] for e in info.elements}
    flag.write_text("ok")
    s.retry()
    info = s.wait(180)
    assert info.state == "succeeded", str(s)
    # only the failed element got a new job
    new_jobs = {e["index"]: e["job"] for e in info.elements}
    assert [i for i in new_jobs if new_jobs[i] != old_jobs[i]] == [1]
    table = s.results()
    assert list(table["score"]) == [10, 30, 50]
    assert list(table["alpha"]) == [1, 3, 5] and list(table["state"]) == ["succeeded"] * 3
    assert all(outs == ["out.txt"] for outs in table["outputs"])
    # each element's provenance record (hpc.provenance), where its results are fetched to
    assert all((Path(c) / "ro-crate-metadata.json").is_file() for c in table["crate"])
    assert "sweep" in str(s) and "succeeded" in s._repr_html_()


def test_cancel_one_element_then_the_local_sweep(make_client, notebooks):
    c = make_client({"local": {"type": "local"}})
    s = Job.sweep(
        str(notebooks["long"]), grid={"seconds": [60, 61, 62, 63]}, client=c, max_concurrent=2
    )
    wait_for(
        lambda: sum(e["state"] == "running" for e in s.info.elements) == 2,
        timeout=120,
        what="two elements running",
    )
    # True is no element 1 (bool is an int to Python), and 4 (of 0-3) is out of range
    for bad in (True, 4):
        with pytest.raises(ConfigError) as e:
            s.cancel(element=bad)
        assert e.value.field == "element" and "0-3" in e.value.message, e.value.message
    s.cancel(element=0)
    wait_for(
        lambda: s.info.elements[0]["state"] == "cancelled", timeout=60, what="element 0 cancelled"
    )
    assert s.info.state in ("running", "queued")
    assert [e["state"] for e in s.info.elements].count("cancelled") == 1, s.info.elements
    s.cancel()
    info = s.wait(60)
    assert info.state == "cancelled" and info.counts["cancelled"] == 4, str(s)


@pytest.mark.slow
def test_slurm_sweep_is_one_array_with_retry_and_results(make_client, backend_configs, sweep_nb):
    cfg, _ = backend_configs["slurm"]()
    c = make_client({"slurm": cfg})
    nb, flag = sweep_nb
    s = Job.sweep(
        str(nb),
        backend="slurm",
        zip={"alpha": [1, 3, 5], "n": [2, 2, 4]},
        client=c,
        max_concurrent=2,
        time="5m",
    )
    info = s.info
    assert info.mode == "array"
    natives = [e["native_id"] for e in info.elements]
    array = natives[0].split("_")[0]
    assert natives == [f"{array}_{i}" for i in range(3)]  # one sbatch --array
    info = s.wait(240)
    assert info.counts == {
        "queued": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 0,
        "unknown": 0,
    }, str(s)
    flag.write_text("ok")
    s.retry()
    retried = s.info.elements[1]
    assert retried["attempts"] == 2 and retried["native_id"].split("_")[0] != array
    info = s.wait(240)
    assert info.state == "succeeded", str(s)
    rows = c.sweep_results(s.id)
    assert [r["score"] for r in rows] == [2, 6, 20]
    assert [r["outputs"] for r in rows] == [["out.txt"]] * 3
    assert all(r["location"].startswith("slurm:") for r in rows)


@pytest.mark.slow
def test_slurm_sweep_cancel_element_and_whole_array(make_client, backend_configs, notebooks):
    cfg, _ = backend_configs["slurm"]()
    c = make_client({"slurm": cfg})
    s = Job.sweep(
        str(notebooks["long"]),
        backend="slurm",
        grid={"seconds": [120, 121, 122]},
        client=c,
        max_concurrent=1,
        time="5m",
    )
    wait_for(
        lambda: s.info.elements[0]["state"] == "running", timeout=120, what="element 0 running"
    )
    assert [e["state"] for e in s.info.elements[1:]] == ["queued", "queued"], str(s)  # %1
    s.cancel(element=2)
    wait_for(
        lambda: s.info.elements[2]["state"] == "cancelled",
        timeout=60,
        what="element 2 cancelled: " + str(s),
    )
    s.cancel()
    info = s.wait(60)
    assert info.state == "cancelled" and info.counts["cancelled"] == 3, str(s)
    assert Sweep.get(s.id, c).state == "cancelled"


@pytest.mark.slow
def test_sweep_magic_and_cli(ip, sweep_nb, capsys):
    import os
    import subprocess
    import sys

    from IPython.core.error import UsageError

    nb, _ = sweep_nb
    s = ip.run_line_magic("hpc", f"sweep {nb} -p alpha 1,5 -p n 2 --wait")
    assert s.state == "succeeded", str(s)
    assert [e["parameters"] for e in s.info.elements] == [
        {"alpha": 1, "n": 2},
        {"alpha": 5, "n": 2},
    ]
    assert "succeeded" in ip.run_line_magic("hpc", f"sweeps {s.id[:4]}")._repr_html_()
    table = ip.run_line_magic("hpc", f"sweep-results {s.id}")
    assert list(table["score"]) == [2, 10]
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("hpc", f"sweep {nb} -p alpha 1,2 -p beta 3")
    assert str(e.value).startswith("grid.beta: beta=3 is not a parameter")

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "jupyter_cloudtik", "jobs", *args],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ},
        )

    r = cli("sweep", str(nb), "--zip", "-p", "alpha", "1,5", "-p", "n", "3,4", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    sweep = json.loads(r.stdout)
    assert sweep["state"] == "succeeded" and sweep["counts"]["succeeded"] == 2
    r = cli("sweep-results", sweep["id"])
    assert r.returncode == 0 and "score" in r.stdout.splitlines()[0], r.stdout
    assert [
        json.loads(cli("sweep-results", sweep["id"], "--json").stdout)[i]["score"] for i in (0, 1)
    ] == [3, 20]
    r = cli("sweep", str(nb), "--zip", "-p", "alpha", "1,5", "-p", "n", "3")
    assert r.returncode == 2 and "zip.n: 1 values, but zip.alpha has 2" in r.stderr
    assert "Traceback" not in r.stderr
    assert sweep["id"] in cli("sweeps").stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arc"])
def test_sweep_on_backends_without_an_array(kind, make_client, backend_configs, sweep_nb):
    """ARC (the emulator): a bounded set of jobs, at most max_concurrent at once, and the
    results table.  (FirecREST has Slurm's arrays: test_hpc_sweeps_firecrest.py.)"""
    cfg, secrets = backend_configs[kind]()
    c = make_client({kind: cfg}, secrets=secrets)
    nb, _ = sweep_nb
    s = Job.sweep(
        str(nb),
        backend=kind,
        grid={"alpha": [1, 5]},
        parameters={"n": 3},
        client=c,
        max_concurrent=1,
    )
    assert s.info.mode == "bounded"
    peak = 0

    def watch():
        nonlocal peak
        info = s.info
        peak = max(
            peak,
            sum(1 for e in info.elements if e["native_id"] and e["state"] in ("queued", "running")),
        )
        return info.done

    wait_for(watch, timeout=240, interval=0.1, what=f"the {kind} sweep to end")
    assert peak <= 1
    assert s.state == "succeeded", str(s)
    rows = c.sweep_results(s.id)
    assert [(r["alpha"], r["score"]) for r in rows] == [(1, 3), (5, 15)]
    assert all("out.txt" in r["outputs"] for r in rows), rows


def test_results_read_at_most_the_budget_and_say_what_was_not_read(make_client, tmp_path):
    """The results table is read in the server for whoever asks: past
    HPC.sweep_results_max_bytes of executed notebooks, the rows say their values were
    not read and why, and still list their outputs."""
    nb = tmp_path / "big.ipynb"
    nb.write_text(json.dumps(_nb(
        ("alpha = 1", ["parameters"]),
        ("from jupyter_cloudtik.hpc import record\nrecord('big', 'x' * 200_000)\n"
         "record('alpha2', alpha * 2)\nopen('out.txt', 'w').write('x')", []),
    )))
    c = make_client({"local": {"type": "local"}})
    s = Job.sweep(str(nb), grid={"alpha": [1, 2, 3]}, client=c, max_concurrent=3)
    info = s.wait(180)
    assert info.state == "succeeded", str(s)
    rows = c.sweep_results(s.id)
    assert [r["alpha2"] for r in rows] == [2, 4, 6] and not any("unread" in r for r in rows)
    first = {o.name: o.size for o in c.outputs(rows[0]["job"])}
    size = max(v for k, v in first.items() if k.endswith(".ipynb"))
    assert size > 200_000
    # room for one and a half notebooks: the first is read, the others are not
    c.manager.hpc.sweep_results_max_bytes = size * 3 // 2
    rows = c.sweep_results(s.id)
    assert rows[0]["alpha2"] == 2 and len(rows[0]["big"]) == 200_000
    assert "unread" not in rows[0]
    for r in rows[1:]:
        assert "alpha2" not in r and "big" not in r, r.keys()
        assert "HPC.sweep_results_max_bytes" in r["unread"] and "\n" not in r["unread"]
        assert r["outputs"] == ["out.txt"] and r["state"] == "succeeded"
