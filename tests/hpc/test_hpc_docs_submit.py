"""docs/hpc.md's "Submitting" block, every option at once, on the project's test Slurm
(slurmctld + slurmd + slurmdbd on this machine) configured as the doc's two backends:
``daint`` (partition, account) and ``cluster`` ("this machine is a login node").

What a test machine must differ in is replaced, each replacement asserted to be in the
block: the sizes (a 2-core test node, partition limit 60 min), the partition name, the
remote and web inputs (a file on the "system" and an HTTP server on loopback standing for
example.org) and the results folder.  The account ``proj42`` is made in Slurm's
accounting, as a site's admin would.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import doc_examples
import yaml

from .conftest import _nb, wait_for

STAND_INS = [
    ("cpus=8", "cpus=1"), ('memory="16GiB"', 'memory="300MiB"'), ('time="2h"', 'time="30m"'),
    ('queue="normal"', 'queue="{partition}"'),
    ('"ref=https://example.org/ref.nc"', '"ref={web}/ref.nc"'),
    ('"daint:/store/big.h5"', '"daint:{system}/store/big.h5"'),
    ('output="/home/me/results"', 'output="{results}"'),
]


@contextlib.contextmanager
def _account(slurm, name: str):
    """The account in Slurm's accounting while the test runs (the session's Slurm is
    shared: other tests list its accounts)."""
    user = os.environ.get("USER") or subprocess.run(
        ["id", "-un"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, **slurm.env}

    def sacctmgr(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    for args in (["add", "account", name, "Description=doc example"],
                 ["add", "user", user, f"Account={name}"]):
        r = sacctmgr(*args)
        assert r.returncode == 0 or "Nothing new added" in r.stdout + r.stderr, r
    try:
        yield
    finally:
        sacctmgr("delete", "user", user, f"account={name}")
        r = sacctmgr("delete", "account", name)
        assert r.returncode == 0, r


def test_every_submit_option_at_once_on_a_real_slurm(slurm, tmp_path, http_files,
                                                     monkeypatch):
    with _account(slurm, "proj42"):
        _run_the_block(slurm, tmp_path, http_files, monkeypatch)


def _run_the_block(slurm, tmp_path, http_files, monkeypatch):
    web, base_url = http_files
    (web / "ref.nc").write_text("reference\n")
    system = tmp_path / "system"
    (system / "store").mkdir(parents=True)
    (system / "store" / "big.h5").write_text("big\n")
    results = tmp_path / "results"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.csv").write_text("x\n1\n2\n3\n")
    (tmp_path / "train.py").write_text(
        "import sys\nprint('trained', sys.argv[1:])\n")
    (tmp_path / "analysis.ipynb").write_text(json.dumps(_nb(
        ("alpha = 1", ["parameters"]),
        ("import os, csv\n"
         "xs = [int(r['x']) for r in csv.DictReader(open('in.csv'))]\n"
         "assert open('ref').read() == 'reference\\n' and "
         "open('big.h5').read() == 'big\\n'\n"
         "open('result.csv', 'w').write(f'alpha,sum\\n{alpha},{alpha * sum(xs)}\\n')\n"
         "os.makedirs('plots', exist_ok=True)\n"
         "open('plots/p.txt', 'w').write('a plot')\n"
         "print('account', os.environ.get('SLURM_JOB_ACCOUNT'), "
         "'partition', os.environ.get('SLURM_JOB_PARTITION'))", []))))
    config = tmp_path / "hpc.yaml"
    config.write_text(yaml.safe_dump({"backends": {
        "daint": {"type": "slurm", "env": slurm.env, "partition": slurm.partition,
                  "account": "proj42", "workdir": str(tmp_path / "daint-jobs")},
        "cluster": {"type": "slurm", "env": slurm.env,
                    "workdir": str(tmp_path / "cluster-jobs")}}}))
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(config))

    b = doc_examples.block("docs/hpc.md", "Submitting", lang="python")
    text = b.text
    for old, new in STAND_INS:
        assert old in text, f"docs/hpc.md's Submitting block no longer has {old}"
        text = text.replace(old, new.format(partition=slurm.partition, web=base_url,
                                            system=system, results=results))
    scope: dict = {}
    exec(compile(text, b.id, "exec"), scope)  # the doc's block, with the stand-ins
    job = scope["job"]
    assert job.state == "succeeded", (job.state, job.logs())
    logs = job.logs()
    assert f"account proj42 partition {slurm.partition}" in logs, logs
    assert (results / "result.csv").read_text() == "alpha,sum\n0.5,3.0\n"
    assert (results / "plots" / "p.txt").read_text() == "a plot"
    kept = {o if isinstance(o, str) else o.get("path") for o in job.outputs()}
    assert {"result.csv", "plots/p.txt"} <= kept, kept
    # the cluster backend's command job, also a real Slurm job
    from jupyter_cloudtik.hpc import Job

    other = [j for j in Job.list() if j.id != job.id]
    assert len(other) == 1
    wait_for(lambda: other[0].refresh().state in ("succeeded", "failed"), 120,
             what="the command job to end")
    assert other[0].state == "succeeded", other[0].logs()
    assert "trained ['--epochs', '3']" in other[0].logs()
