"""The faces: ``%hpc`` / ``%%hpc`` in a real IPython shell, and ``jupyter cloudtik jobs``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError

from .conftest import wait_for


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


def test_hpc_logs_follow_reads_until_the_job_ends(ip, notebooks, capsys):
    """``--follow`` prints the output as it is written and returns once the job has ended
    and all of it was read (the last ticks come after the first empty reads)."""
    job = ip.run_line_magic("hpc", f"submit {notebooks['ticks']} -p n 4 -p delay 0.4")
    capsys.readouterr()
    ip.run_line_magic("hpc", f"logs {job.id} --follow")
    out = capsys.readouterr().out
    assert [f"tick {i}" in out for i in range(4)] == [True] * 4, out
    assert ip.run_line_magic("hpc", f"status {job.id}").state == "succeeded"


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
    # the line as in the README, a comment with an apostrophe after the options
    job = ip.run_cell_magic("hpc", "-p a 5 --wait  # it's one cell", "print('got', a * 3)\n")
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


# --- parameters a notebook cannot receive (issue 20: no silent wrong results) ---------------

def _small(notebooks) -> str:
    """A notebook that assigns alpha in an untagged cell: papermill would inject -p alpha
    at the top, the notebook's own ``alpha = 1`` would win, and the job would succeed."""
    from .conftest import _nb

    path = notebooks["param"].parent / "small.ipynb"
    path.write_text(json.dumps(_nb(("alpha = 1\nprint('alpha is', alpha)", []))))
    return str(path)


def test_magic_refuses_parameters_the_notebook_cannot_receive(ip, notebooks, capsys):
    small = _small(notebooks)
    with pytest.raises(UsageError, match=r"^parameters\.alpha: 2 cannot reach the notebook: "
                       r"'small\.ipynb' has no cell tagged 'parameters'.*tag the cell"):
        ip.run_line_magic("hpc", f"submit {small} -p alpha 2")
    with pytest.raises(UsageError, match=r"^parameters\.alpha: alpha=2 is not a parameter "
                       r"of 'param\.ipynb'; its cell tagged `parameters` assigns: factor, "
                       r"input_name \(or pass --allow-unknown-parameters"):
        ip.run_line_magic("hpc", f"submit {notebooks['param']} -p factor 3 -p alpha 2")
    assert "No jobs" in repr(ip.run_line_magic("hpc", "status"))  # nothing was submitted

    # the opt-out: submitted, and the warning is everywhere the job is shown
    capsys.readouterr()
    job = ip.run_line_magic("hpc", f"submit {small} -p alpha 2 --allow-unknown-parameters "
                                   "--wait")
    err = capsys.readouterr().err
    assert f"WARNING: job {job.id}: parameters: 'small.ipynb' has no cell tagged" in err
    info = job.info
    assert info.state == "succeeded", info.reason
    assert len(info.warnings) == 1 and "no cell tagged 'parameters'" in info.warnings[0]
    assert "WARNING    parameters: 'small.ipynb' has no cell tagged" in str(job)
    assert "cloudtik-job-warning" in ip.run_line_magic("hpc", f"status {job.id}")._repr_html_()
    events = list(job.client.events(job.id))
    assert [(e.level, e.step) for e in events if e.level == "warning"] == [
        ("warning", "warning")]
    ip.run_line_magic("hpc", f"logs {job.id}")
    assert "alpha is 1" in capsys.readouterr().out  # what the warning warned about

    job = ip.run_line_magic("hpc", f"submit {notebooks['param']} -p alpha 2 "
                                   "--allow-unknown-parameters")
    assert "alpha=2 is not a parameter of 'param.ipynb'" in capsys.readouterr().err
    assert "factor, input_name" in job.info.warnings[0]
    # not left running past the test (its state folder's leak check); a loaded CI machine
    # took more than the check's 10 s to run it to its end
    job.cancel()


def test_cell_magic_parameters_always_have_a_cell(ip, capsys):
    job = ip.run_cell_magic("hpc", "-p a 5 -p b 1 --wait", "print('sum', a + b)\n")
    assert job.state == "succeeded" and job.info.warnings == []
    assert "WARNING" not in capsys.readouterr().err


def test_cli_refuses_parameters_the_notebook_cannot_receive(notebooks):
    small = _small(notebooks)
    r = _cli("submit", small, "-p", "alpha", "2")
    assert r.returncode == 2, r.stderr
    assert "parameters.alpha: 2 cannot reach the notebook" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("submit", str(notebooks["param"]), "-p", "alpha", "2", "--json")
    assert r.returncode == 2 and "its cell tagged `parameters` assigns: factor, input_name" \
        in r.stderr
    assert json.loads(r.stdout)["error"]["field"] == "parameters.alpha"
    r = _cli("submit", "--command", "true", "-p", "alpha", "2")
    assert r.returncode == 2 and "parameters.alpha: 2 has nowhere to go" in r.stderr
    assert json.loads(_cli("status", "--json").stdout) == []  # nothing was submitted

    r = _cli("submit", small, "-p", "alpha", "2", "--allow-unknown-parameters", "--wait",
             "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert f"warning: job {job['id']}: parameters: 'small.ipynb' has no cell" in r.stderr
    assert job["state"] == "succeeded" and "no cell tagged" in job["warnings"][0]
    r = _cli("status", job["id"])
    assert "WARNING    parameters: 'small.ipynb' has no cell tagged" in r.stdout


def test_python_api_refuses_parameters_the_notebook_cannot_receive(notebooks):
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.api import Job

    with pytest.raises(ConfigError, match=r"^parameters\.alpha: alpha=2 is not a parameter") \
            as e:
        Job.submit(str(notebooks["param"]), parameters={"alpha": 2})
    assert e.value.field == "parameters.alpha" and Job.list() == []
    job = Job.submit(str(notebooks["param"]), parameters={"factor": 2, "alpha": 2},
                     inputs=[str(notebooks["data"])], allow_unknown_parameters=True,
                     wait=True)
    assert job.state == "succeeded" and "alpha=2" in job.info.warnings[0]
    assert "warning:</b> parameters: alpha=2" in job._repr_html_()
