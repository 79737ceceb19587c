"""The ``dask`` backend: a notebook as a task on one of our clusters (local provider)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import wait_for


@pytest.fixture(scope="module")
def dask_state(tmp_path_factory):
    return tmp_path_factory.mktemp("dask-state")


@pytest.fixture(autouse=True)
def hpc_state(dask_state, monkeypatch, tmp_path):
    """All tests of this module share one state folder: the cluster lives there."""
    monkeypatch.setenv("CLOUDTIK_STATE_DIR", str(dask_state))
    monkeypatch.setenv("CLOUDTIK_LAUNCHER_IDLE", "5")
    monkeypatch.delenv("CLOUDTIK_API_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    yield dask_state
    from jupyter_cloudtik.hpc.client import forget_clients

    forget_clients()


@pytest.fixture(scope="module")
def cluster(dask_state):
    import os

    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(dask_state), "CLOUDTIK_LAUNCHER_IDLE": "5"}
    up = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "up", "--name", "jobs",
                         "--workers", "1", "--json"], env=env, capture_output=True, text=True,
                        timeout=180)
    assert up.returncode == 0, up.stderr
    yield "jobs"
    subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "down", "jobs"], env=env,
                   capture_output=True, timeout=120)


def test_from_cluster_to_job_in_two_lines(cluster, notebooks, tmp_path):
    from jupyter_cloudtik.hpc import Job

    job = Job.submit(str(notebooks["param"]), backend="dask", parameters={"factor": 5},
                     inputs=[str(notebooks["data"])])
    info = job.wait(120)
    assert info.state == "succeeded", (info.reason, job.logs())
    assert "result 30" in job.logs()
    paths = {p.name: p for p in job.fetch(tmp_path / "out")}
    assert paths["result.txt"].read_text() == "30"
    assert "result 30" in json.dumps(json.loads(paths["param.out.ipynb"].read_text()))


def test_named_cluster_failing_notebook_and_cancel(cluster, notebooks, make_client):
    client = make_client({"mine": {"type": "dask", "cluster": cluster}})
    bad = client.wait(client.submit(build_spec(str(notebooks["fail"])), "mine").id, 120)
    assert bad.state == "failed" and bad.error["ename"] == "ZeroDivisionError"
    assert "cell 2" in bad.reason
    long = client.submit(build_spec(str(notebooks["long"])), f"dask:{cluster}")
    wait_for(lambda: "sleeping" in client.logs(long.id).text, 90, what="output")
    assert client.get(long.id).state == "running"
    t0 = time.monotonic()
    client.cancel(long.id)
    assert client.wait(long.id, 60).state == "cancelled"
    assert time.monotonic() - t0 < 20


def test_dask_logs_stream_and_outlive_the_submitter(cluster, notebooks, make_client):
    script = (
        "import os, sys\n"
        "from jupyter_cloudtik.hpc import Job\n"
        f"j = Job.submit({str(notebooks['ticks'])!r}, backend='dask', "
        "parameters={'n': 10, 'delay': 0.4})\n"
        "print(j.id, flush=True)\n"
        "os._exit(0)\n")
    import os

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ}, timeout=120)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    client = make_client({"dask": {"type": "dask"}})
    partial = wait_for(lambda: (t := client.logs(job_id).text) and "tick 1" in t and
                       "tick 9" not in t and t, 60, interval=0.05, what="partial log")
    assert "tick 0" in partial
    info = client.wait(job_id, 120)
    assert info.state == "succeeded", info.reason
    assert "tick 9" in client.logs(job_id).text
