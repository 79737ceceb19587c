"""The faces: ``%hpc`` / ``%%hpc`` in a real IPython shell, and ``jupyter cloudtik jobs``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError

from .conftest import wait_for


@pytest.fixture
def ip(hpc_state):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_cloudtik")
    yield shell
    shell.user_ns.clear()


def test_hpc_magics(ip, notebooks, capsys, tmp_path):
    ip.run_line_magic("hpc", "backends")
    assert "local" in capsys.readouterr().out
    job = ip.run_line_magic(
        "hpc", f"submit {notebooks['param']} -p factor 2 --inputs {notebooks['data']} --wait")
    assert job.state == "succeeded", job.info.reason
    jobs = ip.run_line_magic("hpc", "status")
    assert job.id in repr(jobs)
    one = ip.run_line_magic("hpc", f"status {job.id[:5]}")  # any unique beginning
    assert one.id == job.id and "succeeded" in one._repr_html_()
    capsys.readouterr()
    ip.run_line_magic("hpc", f"logs {job.id}")
    assert "result 12" in capsys.readouterr().out
    paths = ip.run_line_magic("hpc", f"fetch {job.id}")
    assert (tmp_path / "hpc-jobs" / job.id / "result.txt").read_text() == "12"
    assert len(paths) == 2
    assert ip.run_line_magic("hpc", f"outputs {job.id}") == ["param.out.ipynb", "result.txt"]

    long = ip.run_line_magic("hpc", f"submit {notebooks['long']}")
    wait_for(lambda: long.state == "running", 60, what="running")
    ip.run_line_magic("hpc", f"cancel {long.id}")
    assert "cancelled" in capsys.readouterr().out
    assert ip.run_line_magic("hpc", f"wait {long.id}").state == "cancelled"


def test_hpc_magic_errors_are_one_line(ip, notebooks, tmp_path):
    with pytest.raises(UsageError, match=r"notebook: .*missing\.ipynb' does not exist"):
        ip.run_line_magic("hpc", f"submit {tmp_path / 'missing.ipynb'}")
    with pytest.raises(UsageError, match="unknown backend 'nope'"):
        ip.run_line_magic("hpc", f"submit {notebooks['param']} --backend nope")
    with pytest.raises(UsageError, match="argument --nodes/-N: 'zero' is not a whole number"):
        ip.run_line_magic("hpc", f"submit {notebooks['param']} --nodes zero")
    with pytest.raises(UsageError, match="job: no job 'feedbeef'"):
        ip.run_line_magic("hpc", "status feedbeef")
    with pytest.raises(UsageError, match="invalid choice"):
        ip.run_line_magic("hpc", "frobnicate")


def test_hpc_cell_magic(ip, capsys):
    ip.user_ns.clear()
    job = ip.run_cell_magic("hpc", "-p a 5 --wait", "print('got', a * 3)\n")
    assert job.state == "succeeded", job.info.reason
    assert "got 15" in capsys.readouterr().out
    bad = ip.run_cell_magic("hpc", "--wait", "x = 1\nx / 0\n")
    assert bad.state == "failed"
    assert "ZeroDivisionError" in bad.info.reason


def _cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", *args],
                          capture_output=True, text=True, input=input, timeout=180,
                          env={**os.environ})


def test_jobs_cli(notebooks, tmp_path):
    r = _cli("submit", str(notebooks["param"]), "-p", "factor", "4", "--inputs",
             str(notebooks["data"]), "--wait", "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "succeeded" and job["parameters"] == {"factor": 4}
    r = _cli("status", "--json")
    assert [j["id"] for j in json.loads(r.stdout)] == [job["id"]]
    r = _cli("logs", job["id"])
    assert "result 24" in r.stdout
    r = _cli("fetch", job["id"], "--dest", str(tmp_path / "got"))
    assert r.returncode == 0 and (tmp_path / "got" / "result.txt").read_text() == "24"

    r = _cli("submit", str(notebooks["param"]), "--cpus", "999")
    assert r.returncode == 2 and "cpus: 999 per node is more than" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("submit", str(notebooks["fail"]), "--wait")
    assert r.returncode == 1 and "ZeroDivisionError" in r.stdout

    r = _cli("secret", "local", "token", input="very-secret-value\n")
    assert r.returncode == 0 and "very-secret-value" not in r.stdout + r.stderr
    r = _cli("secret", "nope", "token", input="x\n")
    assert r.returncode == 2 and "unknown backend 'nope'" in r.stderr


def test_backends_come_from_traitlets_and_a_config_file(tmp_path):
    cfg = tmp_path / "jupyter-config"
    cfg.mkdir()
    (cfg / "jupyter_cloudtik_config.py").write_text(
        "c.HPC.backends = {'daint': {'type': 'slurm', 'host': 'daint.example.org', "
        "'partition': 'normal'}}\nc.HPC.default_backend = 'daint'\n")
    (tmp_path / "hpc.yaml").write_text(
        "backends:\n  eiger:\n    type: slurm\n    partition: debug\n"
        "  nordugrid:\n    type: arc\n    url: https://arc.example.org\n")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(cfg),
           "CLOUDTIK_HPC_CONFIG": str(tmp_path / "hpc.yaml")}
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", "backends", "--json"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    got = {b["name"]: b for b in json.loads(r.stdout)}
    assert set(got) == {"daint", "eiger", "nordugrid", "local", "dask"}
    assert got["daint"]["default"] and got["daint"]["type"] == "slurm"
    assert got["eiger"]["type"] == got["daint"]["type"]  # two instances of one kind
    (tmp_path / "hpc.yaml").write_text("backends:\n  broken:\n    partition: x\n")
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", "backends"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "backends.broken.type: missing; one of arc, dask, " \
        "firecrest, local, slurm" in r.stderr
