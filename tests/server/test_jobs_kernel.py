"""A real kernel under the real server: ``%hpc`` and ``Job`` go through the REST API, so the
server's job manager (and its one poller) owns the jobs that every face shows."""

from __future__ import annotations

import json

import pytest

from .kernels import KernelError, running_kernel
from .test_jobs_api import PARAM


def test_kernel_hpc_magics_use_the_server(lab):
    folder = lab.root / "jobs-kernel"
    folder.mkdir(exist_ok=True)
    (folder / "param.ipynb").write_text(json.dumps(PARAM))
    (folder / "data.txt").write_text("7\n")
    with running_kernel(lab, "jobs-kernel/k.ipynb") as k:
        out = k.run("from jupyter_cloudtik.hpc.client import get_jobs_client\n"
                    "print(get_jobs_client().kind)")
        assert out.strip() == "rest"
        k.run("%load_ext jupyter_cloudtik")
        out = k.run("j = %hpc submit param.ipynb -p factor 6 --inputs data.txt --wait\n"
                    "print(j.id, j.state)")
        job_id, state = out.strip().splitlines()[-1].split()
        assert state == "succeeded"
        assert "result 42" in k.run(f"%hpc logs {job_id}")
        assert "result 42" in k.run(f"%hpc logs {job_id} --follow")  # ended: all, then back
        out = k.run(f"paths = %hpc fetch {job_id}\nprint(open(sorted(map(str, paths))[-1])"
                    ".read())")
        assert out.strip().splitlines()[-1] == "42"
        assert (folder / "hpc-jobs" / job_id / "result.txt").read_text() == "42"
        out = k.run("%%hpc -p a 4 --wait\nprint('cell says', a * 10)\n")
        assert "cell says 40" in out
        # a parameter the notebook cannot receive: refused by the server, one line
        with pytest.raises(KernelError, match=r"parameters\.alpha: alpha=2 is not a "
                           r"parameter of 'param\.ipynb'; its cell tagged `parameters` "
                           r"assigns: factor") as e:
            k.run("%hpc submit param.ipynb -p alpha 2")
        assert "'UsageError'" in str(e.value) and "'traceback': []" in str(e.value)
        out = k.run("w = %hpc submit param.ipynb -p factor 1 -p alpha 2 --inputs data.txt "
                    "--allow-unknown-parameters\nprint(w.info.warnings)")
        assert "WARNING: job " in out and "alpha=2 is not a parameter" in out
    job = lab.get(f"jobs/{job_id}").json()
    assert job["state"] == "succeeded"
    # the server's job manager submitted it: its operation belongs to the server process
    assert lab.get(f"operations/{job['op_id']}").json()["owner_pid"] == lab.proc.pid
