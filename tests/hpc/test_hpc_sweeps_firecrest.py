"""Sweeps on FirecREST (the emulator) as one Slurm job array: one submit, one
``GET /compute/{system}/jobs`` per poll for every element, the ``%`` limit honoured,
partial failure and retry, cancelling one element (by its marker: FirecREST refuses an
array task's id) and the whole array, and the results table.

The emulator is shared by the worker's tests: its request log is read from a time on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from jupyter_cloudtik.hpc.api import Job

from .conftest import wait_for
from .test_hpc_sweeps import sweep_nb  # noqa: F401  (the fixture)

JOBS = "/compute/testsys/jobs"


def _compute(firecrest, t0: float, t1: float | None = None) -> list[dict]:
    return [r for r in firecrest.requests() if r["t"] >= t0 and (t1 is None or r["t"] <= t1)
            and r["path"].startswith(JOBS)]


def _most_at_once(firecrest, array: str, n: int) -> int:
    """The most tasks of the array that ran at one time, from the emulator's records of
    each task (``started`` and ``exitcode`` written when it started and ended)."""
    run = Path(firecrest.info["root"]) / ".f7t" / "run"
    edges = []
    for i in range(n):
        folder = run / f"{array}_{i}"
        edges += [((folder / "started").stat().st_mtime, 1),
                  ((folder / "exitcode").stat().st_mtime, -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
        now += step
        most = max(most, now)
    return most


def _polls(c, n: int) -> tuple[float, float]:
    """``n`` polls of the backend in a row, with the background poller kept out (it
    skips a backend whose lock is held): the window they ran in."""
    mgr = c.manager

    async def run():
        lock = mgr._backend_locks.setdefault("firecrest", asyncio.Lock())
        async with lock:
            t0 = time.time()
            for _ in range(n):
                await mgr._poll_backend_locked("firecrest")
            return t0, time.time()

    return c._run(run())


@pytest.mark.slow
def test_firecrest_sweep_is_one_array_with_limit_retry_and_results(
        make_client, backend_configs, firecrest, sweep_nb):  # noqa: F811
    cfg, secrets = backend_configs["firecrest"]()
    c = make_client({"firecrest": cfg}, secrets=secrets)
    nb, flag = sweep_nb
    t0 = time.time()
    s = Job.sweep(str(nb), backend="firecrest", zip={"alpha": [1, 3, 5, 7], "n": [2, 2, 4, 1]},
                  client=c, max_concurrent=2, time="5m")
    info = s.info
    assert info.mode == "array"
    natives = [e["native_id"] for e in info.elements]
    array = natives[0].split("_")[0]
    assert natives == [f"{array}_{i}" for i in range(4)], natives
    # three polls for the four elements: one GET /compute/testsys/jobs each, nothing else
    a, b = _polls(c, 3)
    asked = [(r["method"], r["path"]) for r in _compute(firecrest, a, b)]
    assert asked == [("GET", JOBS)] * 3, asked
    info = s.wait(240)
    # Slurm's %2, as the emulator ran the tasks (our states lag: an element reads running
    # until its results are fetched): at most two tasks between start and exit at once
    assert _most_at_once(firecrest, array, 4) == 2
    assert info.counts == {"queued": 0, "running": 0, "succeeded": 3, "failed": 1,
                           "cancelled": 0, "unknown": 0}, str(s)
    sent = _compute(firecrest, t0)
    assert [r for r in sent if r["method"] == "POST"] == [
        r for r in sent if r["method"] == "POST" and r["path"] == JOBS]
    assert len([r for r in sent if r["method"] == "POST"]) == 1  # one sbatch --array
    assert not [r for r in sent if r["path"] != JOBS]  # never a task by its id (a 400)

    flag.write_text("ok")
    t1 = time.time()
    s.retry()
    retried = s.info.elements[1]
    assert retried["attempts"] == 2 and retried["native_id"].split("_")[0] != array
    assert [e["attempts"] for e in s.info.elements] == [1, 2, 1, 1]
    info = s.wait(240)
    assert info.state == "succeeded", str(s)
    assert len([r for r in _compute(firecrest, t1) if r["method"] == "POST"]) == 1
    rows = c.sweep_results(s.id)
    assert [r["score"] for r in rows] == [2, 6, 20, 7]
    assert all("out.txt" in r["outputs"] for r in rows), rows
    assert all(r["location"].startswith("firecrest:") for r in rows), rows


@pytest.mark.slow
def test_firecrest_sweep_cancel_one_element_then_the_array(
        make_client, backend_configs, firecrest, notebooks):
    cfg, secrets = backend_configs["firecrest"]()
    c = make_client({"firecrest": cfg}, secrets=secrets)
    t0 = time.time()
    s = Job.sweep(str(notebooks["long"]), backend="firecrest",
                  grid={"seconds": [120, 121, 122, 123]}, client=c, max_concurrent=2,
                  time="5m")
    wait_for(lambda: [e["state"] for e in s.info.elements] ==
             ["running", "running", "queued", "queued"], timeout=120,
             what="elements 0 and 1 running, 2 and 3 held back by %2")
    s.cancel(element=0)  # running: its marker ends it, and frees a slot for element 2
    wait_for(lambda: s.info.elements[0]["state"] == "cancelled", timeout=60,
             what="element 0 cancelled: " + str(s))
    wait_for(lambda: s.info.elements[2]["state"] == "running", timeout=60,
             what="element 2 started in element 0's slot: " + str(s))
    s.cancel(element=3)  # pending: cancelled at once, its task exits when it starts
    assert s.info.elements[3]["state"] == "cancelled", str(s)
    assert s.info.elements[1]["state"] == "running", str(s)
    s.cancel()
    info = s.wait(60)
    assert info.state == "cancelled" and info.counts["cancelled"] == 4, str(s)
    deletes = [r["path"] for r in _compute(firecrest, t0) if r["method"] == "DELETE"]
    array = s.info.elements[0]["native_id"].split("_")[0]
    assert deletes == [f"{JOBS}/{array}"], deletes  # one scancel of the whole array


@pytest.mark.slow
def test_an_array_slurm_never_starts_is_failed_and_cancelled_whole(
        make_client, backend_configs, firecrest, sweep_nb):  # noqa: F811
    """Over the partition's time limit, Slurm keeps the array pending for ever: every
    element fails with Slurm's reason and the array is cancelled (FirecREST takes only
    the array's id), not left in the queue."""
    cfg, secrets = backend_configs["firecrest"]()
    c = make_client({"firecrest": cfg}, secrets=secrets)
    nb, _ = sweep_nb
    t0 = time.time()
    s = Job.sweep(str(nb), backend="firecrest", grid={"alpha": [1, 5]}, client=c,
                  time="2h")
    info = s.wait(60)
    assert info.counts["failed"] == 2, str(s)
    assert all("PartitionTimeLimit" in (e["reason"] or "") for e in info.elements), str(s)
    array = info.elements[0]["native_id"].split("_")[0]
    deletes = {r["path"] for r in _compute(firecrest, t0) if r["method"] == "DELETE"}
    assert deletes == {f"{JOBS}/{array}"}, deletes
    states = {j["jobId"]: j["status"]["state"] for j in firecrest_jobs(firecrest, array)}
    assert states and all(v.startswith("CANCELLED") for v in states.values()), states


def firecrest_jobs(firecrest, array: str) -> list[dict]:
    """The array as FirecREST lists it (a plain request with a token of our own)."""
    import httpx

    from .conftest import CLIENT_SECRET

    tok = httpx.post(firecrest.info["token_uri"], data={
        "grant_type": "client_credentials", "client_id": "cloudtik",
        "client_secret": CLIENT_SECRET}).json()["access_token"]
    jobs = httpx.get(f"{firecrest.url}{JOBS}", headers={"Authorization": f"Bearer {tok}"},
                     timeout=30).json()["jobs"]
    return [j for j in jobs if j["jobId"].split("_")[0] == array]


def test_waiting_elements_are_queued_from_the_first_poll(make_client, backend_configs,
                                                         firecrest, sweep_nb):  # noqa: F811
    """The real FirecREST lists an array's waiting tasks as one entry under the bare id,
    and its ``GET /jobs/<id>`` shows them one by one only about a second after submit
    (scripts/firecrest_beside.py).  An element that is only waiting must read as queued
    from the first poll on, never as a job FirecREST forgot (FAILED)."""
    cfg, secrets = backend_configs["firecrest"]()
    c = make_client({"firecrest": cfg}, secrets=secrets)
    nb, _flag = sweep_nb
    s = Job.sweep(str(nb), backend="firecrest", zip={"alpha": [1, 3, 5], "n": [30, 30, 30]},
                  client=c, max_concurrent=1, time="5m")
    try:
        _polls(c, 3)  # at once: within the emulator's second before the array splits
        states = [e["state"] for e in s.info.elements]
        assert states[1:] == ["queued", "queued"], (states, s.info.elements)
        assert states[0] in ("queued", "running"), states
    finally:
        s.cancel()
        wait_for(lambda: all(e["state"] == "cancelled" for e in s.info.elements), 60,
                 what="the sweep cancelled")


def test_a_firecrest_sweep_builds_the_sessions_environment_once(make_client, backend_configs,
                                                                tmp_path):
    """A sweep's elements are jobs like any other: asked for a package the system's
    Python lacks, the array's tasks run in the session's environment built on the system
    (staged once with the first element, built under a lock by whichever task starts
    first, reused by the others)."""
    from .conftest import _nb

    config, secrets = backend_configs["firecrest"]()
    config = {k: v for k, v in config.items() if k != "environment"}
    c = make_client({"firecrest": config}, secrets)
    nb = tmp_path / "toolz_sweep.ipynb"
    nb.write_text(__import__("json").dumps(_nb(
        ("n = 1", ["parameters"]),
        ("import sys, toolz\nprint('prefix', sys.prefix)\n"
         "print('sum', sum(toolz.take(n, toolz.iterate(lambda x: x + 1, 1))))", []))))
    s = Job.sweep(str(nb), backend="firecrest", grid={"n": [2, 3]}, packages=["toolz"],
                  client=c)
    assert s.info.mode == "array"
    info = s.wait(timeout=300)
    assert info.state == "succeeded", str(s)
    logs = [Job(e["job"], c).logs() for e in info.elements]
    env = Job(info.elements[0]["job"], c).info.environment
    assert env["mode"] == "built", env
    assert all(f".cloudtik-envs/{env['hash']}" in log for log in logs), logs[0][-1500:]
    built = sum("building environment" in log for log in logs)
    assert built == 1, [log[-800:] for log in logs]
