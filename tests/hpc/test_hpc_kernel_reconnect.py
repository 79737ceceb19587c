"""Issue 33: a server killed while a notebook's HPC kernel runs; the next server on the
same state folder reconnects that notebook's kernel to the job, variables and all.

The first server is SIGKILLed (no shutdown); its kernel's job runs on, listed by the next
server as kept for its notebook; opening the notebook again (a session of the same path
and kernel spec, as JupyterLab makes it) reaches the same kernel: a variable set before
the kill is still there, and no second job was submitted.  A kernel of another notebook
is not adopted by it, and one whose notebook does not come back within
``HPCKernels.reconnect_within`` is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import requests

from .conftest import wait_for, write_hpc_kernel_config
from .test_hpc_docs_kernels import _execute, _job_ids

pytestmark = pytest.mark.slow
SPEC = "cloudtik-hpc-daint-debug"


def _session(server, path: str) -> str:
    (server.root / path).write_text('{"cells": [], "metadata": {}, "nbformat": 4, '
                                    '"nbformat_minor": 5}')
    r = requests.post(server.url + "api/sessions", headers=server.headers(), timeout=300,
                      json={"path": path, "type": "notebook", "name": path,
                            "kernel": {"name": SPEC}})
    assert r.status_code == 201, r.text[:2000]
    return r.json()["kernel"]["id"]


def test_a_killed_servers_notebook_kernel_is_reconnected(slurm, tmp_path):
    from tests.server.conftest import _start_server, _stop

    write_hpc_kernel_config(tmp_path, slurm)
    with open(tmp_path / "config" / "jupyter_server_config.py", "a") as f:
        f.write("c.HPCKernels.reconnect_within = 20\n")
    args = ["--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"]
    first = _start_server(tmp_path, "server", args, {})
    try:
        kid = _session(first, "analysis.ipynb")
        other = _session(first, "other.ipynb")
        status, out = asyncio.run(_execute(first, kid, "x = 41 + 1\nimport os\n"
                                                       "print(os.environ['SLURM_JOB_ID'])"))
        assert status == "ok", out
        job = out.strip()
        status, out = asyncio.run(_execute(first, other, "import os\n"
                                                         "print(os.environ['SLURM_JOB_ID'])"))
        other_job = out.strip()
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
    finally:
        _stop(first)
    jobs_before = set(_job_ids(slurm.env))
    assert {job, other_job} <= jobs_before

    second = _start_server(tmp_path, "server", args, {})
    try:
        # listed as kept for its notebook, the job still running
        kept = wait_for(lambda: [k for k in second.get("hpc/kernels").json()["kernels"]
                                 if k["id"] == kid and k.get("reconnectable")], 30,
                        what="GET hpc/kernels to list the killed server's kernel as kept")
        assert "reconnects to it if started within" in kept[0]["reason"], kept
        assert job in _job_ids(slurm.env)
        # the notebook opened again: the same kernel, its variables
        new = _session(second, "analysis.ipynb")
        status, out = asyncio.run(_execute(second, new, "print(x, os.environ['SLURM_JOB_ID'])"))
        assert (status, out.split()) == ("ok", ["42", job]), out
        assert set(_job_ids(slurm.env)) <= jobs_before  # no new job
        assert f"reconnected to job {job} on daint" in second.log_text()
        (mine,) = [k for k in second.get("hpc/kernels").json()["kernels"] if k["id"] == new]
        assert mine["state"] == "running" and mine["job"] == job, mine
        # the other notebook never came back: its job is cancelled after the 20 s
        wait_for(lambda: other_job not in _job_ids(slurm.env), 150,
                 what="the unclaimed kernel's job to be cancelled after reconnect_within")
        assert job in _job_ids(slurm.env)
        # shut down as any kernel: the job ends
        r = requests.delete(second.url + f"api/kernels/{new}", headers=second.headers(),
                            timeout=120)
        assert r.status_code == 204
        wait_for(lambda: job not in _job_ids(slurm.env), 60, what="the kernel's job to end")
    finally:
        problems = _stop(second)
    assert not problems, problems
