"""A Dask cluster on Slurm over SSH runs with the session's environment, built on the
system as HPC jobs build theirs and shared with them: the real Slurm of the environment
tests, reached over a real sshd as another Unix account whose Python has no Dask and
cannot run the session's interpreter (tests/hpc/test_hpc_environment.py's site)."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import subprocess
import sys
import uuid

import pytest

from jupyter_cloudtik.hpc.commands import build_spec

from . import test_hpc_environment as site
from .test_hpc_environment import ACCOUNT, PY, _runuser

# the site's fixtures (module fixtures there: the account, its sshd, the Slurm)
env_sshd, job_account, report_nb, site_slurm = (
    site.env_sshd, site.job_account, site.report_nb, site.site_slurm)

pytest.importorskip("dask_jobqueue")


def _squeue(slurm) -> list[str]:
    return slurm.run("squeue", "-h", "-o", "%i|%k").stdout.splitlines()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_dask_cluster_over_ssh_runs_the_sessions_environment_shared_with_jobs(
        manager, make_client, site_slurm, env_sshd, job_account, report_nb, tmp_path,
        monkeypatch):
    from jupyter_cloudtik.core.secrets import SecretStore
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider
    from jupyter_cloudtik.providers.slurm_environment import packages_of

    assert _runuser(sys.executable, "-c", "pass").returncode != 0
    assert _runuser("/usr/bin/python3", "-c", "import distributed").returncode != 0
    workdir = f"{job_account.pw_dir}/t-{uuid.uuid4().hex[:8]}"  # never seen before
    backend = {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port,
               "user": ACCOUNT, "known_hosts": str(env_sshd.folder / "known_hosts"),
               "env": site_slurm.env, "workdir": workdir}
    hpc_file = tmp_path / "hpc.yaml"
    hpc_file.write_text(json.dumps({"backends": {"site": backend}}))
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(hpc_file))
    SecretStore(manager.store).put("hpc:site", "ssh_key", env_sshd.private_key)
    cfg = {"cluster_name": "envc",
           "provider": {"type": "slurm", "backend": "site", "walltime": "00:20:00",
                        "cores": 1, "memory": "300MiB",
                        "workdir": f"{workdir}/cluster"},
           "available_node_types": {"worker": {"min_workers": 1, "max_workers": 2,
                                               "resources": {}}}}
    try:
        info = asyncio.run(manager.up(cfg))
        assert info.state == "running", info.reason
        _, connect = manager.connect_info("envc")

        def where():
            import getpass
            import sys

            import cloudpickle
            import dask
            import distributed
            return {"user": getpass.getuser(), "executable": sys.executable,
                    "python": "{}.{}".format(*sys.version_info[:2]), "dask": dask.__version__,
                    "distributed": distributed.__version__,
                    "cloudpickle": cloudpickle.__version__}

        with SlurmNodeProvider.make_client(connect, timeout=30) as c:
            got = c.submit(where, pure=False).result(timeout=60)
            sched = c.run_on_scheduler(where)
        envs = f"{workdir}/.cloudtik-envs"
        assert got["user"] == ACCOUNT and got["python"] == PY, got
        assert got["executable"].startswith(f"{envs}/") and \
            got["executable"].endswith("/bin/python"), got
        env_hash = got["executable"][len(envs) + 1:].split("/", 1)[0]
        assert sched["executable"] == got["executable"]  # the scheduler job too
        for name in ("dask", "distributed", "cloudpickle"):
            assert got[name] == md.version(name), (name, got[name])

        asyncio.run(manager.down("envc"))  # the site's 2 cores, for the job below
        assert not [j for j in _squeue(site_slurm) if "cluster=envc" in j]
        # an HPC job with the same packages on the same system: the same environment,
        # found built (its log says which, and nothing was built again)
        client = make_client({"site": {**backend, "environment": {
            "packages": packages_of(None)}}}, {("site", "ssh_key"): env_sshd.private_key})
        job = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "site").id,
                          300)
        log = client.logs(job.id).text
        assert job.state == "succeeded", (job.reason, log[-2000:])
        assert job.environment["hash"] == env_hash, (job.environment, env_hash)
        assert f"jupyter_cloudtik: environment {env_hash}" in log
        assert "building environment" not in log, log[-2000:]
    finally:
        try:
            asyncio.run(manager.down("envc"))
        except Exception:  # already down (or never up): nothing of it to stop
            pass
        subprocess.run(["rm", "-rf", "--", workdir], check=False)


def test_runtime_packages_for_slurm_clusters_by_where_the_jobs_run(tmp_path):
    """Over SSH without ``python``: names, built there (a folder or a direct reference
    refused, naming runtime.pip.I); on this machine: this Python's packages; with a named
    ``python``: refused (that Python is used as it is)."""
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider
    from jupyter_cloudtik.providers.slurm_environment import packages_of

    def cfg(provider: dict, **runtime) -> dict:
        return {"provider": {"type": "slurm", **provider}, "runtime": runtime}

    ssh = {"host": "login.example.org"}
    SlurmNodeProvider.check_packages(cfg(ssh, pip=["toolz", "six==1.17.0"]))
    SlurmNodeProvider.check_packages(cfg(ssh, sync_env=True))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")  # a project
    for i, pip in ((1, ["toolz", str(tmp_path)]),
                   (0, ["evil @ https://evil.example/e.tar.gz", "toolz"])):
        with pytest.raises(ConfigError) as e:
            SlurmNodeProvider.check_packages(cfg(ssh, pip=pip))
        assert e.value.field == f"runtime.pip.{i}", e.value.message
        assert "is not a package name" in e.value.message and "\n" not in e.value.message
    SlurmNodeProvider.check_packages(cfg({}, pip=["toolz"]))  # installed here
    with pytest.raises(ConfigError, match="is not installed here"):
        SlurmNodeProvider.check_packages(cfg({}, pip=["no-such-pkg-ctk"]))
    with pytest.raises(ConfigError, match="cannot install packages") as e:
        SlurmNodeProvider.check_packages(cfg({**ssh, "python": "python3"}, sync_env=True))
    assert e.value.field == "runtime.sync_env"
    assert packages_of({"sync_env": True}) == "session"
    names = packages_of({"pip": ["toolz"]})
    assert names[:4] == ["dask", "distributed", "cloudpickle", "msgpack"]
    assert names[-1] == "toolz"
