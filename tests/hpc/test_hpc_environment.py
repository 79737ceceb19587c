"""The session's environment travels with the job (hpc/environment.py), tested as a real
site is: the real Slurm over a real sshd, the job running as another Unix account whose
Python is Debian's stock /usr/bin/python3 (no packages) and which cannot run the
session's interpreter; plus the refusals at submit and the repair of a half-built
environment on the local backend."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import _nb
from .test_hpc_slurm_ssh import SSHD, Sshd

ACCOUNT = "ctenvjob"  # the job's own Unix account (made here, as a site has one)
PY = "{}.{}".format(*sys.version_info[:2])

REPORT = ("import getpass, importlib.metadata as md, json, sys\n"
          "json.dump({'user': getpass.getuser(), 'executable': sys.executable,\n"
          "           'python': '%d.%d' % sys.version_info[:2],\n"
          "           'path': sys.path,\n"
          "           'dists': {d.metadata['Name'].lower().replace('_', '-'): d.version\n"
          "                     for d in md.distributions()}},\n"
          "          open('env.json', 'w'))\n"
          "import toolz\nprint('toolz', toolz.__version__)")


@pytest.fixture
def report_nb(tmp_path):
    p = tmp_path / "report.ipynb"
    p.write_text(json.dumps(_nb((REPORT, []))))
    return p


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _env_json(client, job_id: str, tmp_path: Path) -> dict:
    got = {p.name: p for p in client.fetch(job_id, tmp_path / job_id)}
    return json.loads(got["env.json"].read_text())


def _runuser(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", ACCOUNT, "--", *argv], capture_output=True,
                          text=True, timeout=60, cwd="/")


@pytest.fixture(scope="module")
def job_account():
    """A Unix account of its own for the jobs (``useradd``), with a login shell and no
    password (key-only SSH): what a site gives its users."""
    if os.getuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make the job's own account")
    try:
        pw = pwd.getpwnam(ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-p", "*", ACCOUNT], check=True)
        pw = pwd.getpwnam(ACCOUNT)
    return pw


@pytest.fixture(scope="module")
def env_sshd(tmp_path_factory, job_account):
    if not os.path.exists(SSHD) or os.getuid() != 0:
        pytest.skip("needs openssh-server and root (scripts/install-system-deps.sh)")
    d = Sshd(tmp_path_factory.mktemp("sshd-env"))
    # sshd reads a user's keys as that user: the account's own ~/.ssh, as on a site
    ssh = Path(job_account.pw_dir) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_bytes(d.client_key.export_public_key())
    for p in (ssh, ssh / "authorized_keys"):
        os.chown(p, job_account.pw_uid, job_account.pw_gid)
    d.use_account_keys()
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def site_slurm():
    """The project's real Slurm (cloudtik_emulators/slurm.py), in a folder other accounts can reach
    (as a site's Slurm config and munge socket are): pytest's own temp folders are 0700
    and pytest resets them, so it cannot be the session's ``slurm`` fixture."""
    import tempfile

    from cloudtik_emulators.slurm import SlurmCluster, missing_programs

    if missing_programs():
        pytest.skip("Slurm is not installed (scripts/install-system-deps.sh)")
    folder = Path(tempfile.mkdtemp(prefix="ct-site-slurm-", dir="/var/tmp"))
    folder.chmod(0o711)
    cluster = SlurmCluster(folder, cpus=2, memory_mb=2000, max_time_minutes=60,
                           accounting=False)
    try:
        cluster.start()
        (folder / "munge").chmod(0o711)  # the socket, not the key, is for everyone
        (folder / "slurm.conf").chmod(0o644)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_job_runs_as_another_account_with_the_sessions_exact_packages(
        make_client, site_slurm, env_sshd, job_account, report_nb, tmp_path):
    slurm = site_slurm
    # the site as it is: the session's interpreter is out of reach of the job's account,
    # and the system's own Python has none of the notebook's packages
    assert _runuser(sys.executable, "-c", "pass").returncode != 0
    assert _runuser("/usr/bin/python3", "-c", "import papermill").returncode != 0
    assert _runuser("/usr/bin/python3", "-c", "import toolz").returncode != 0
    workdir = f"{job_account.pw_dir}/t-{uuid.uuid4().hex[:8]}"  # never seen before
    backend = {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port,
               "user": ACCOUNT, "known_hosts": str(env_sshd.folder / "known_hosts"),
               "env": slurm.env, "workdir": workdir,
               "environment": {"packages": ["toolz"]}}
    client = make_client({"site": backend}, {("site", "ssh_key"): env_sshd.private_key})
    try:
        # two jobs at once on an environment the system has never seen: built once
        a = client.submit(build_spec(str(report_nb), time="10m"), "site")
        b = client.submit(build_spec(str(report_nb), time="10m"), "site")
        a, b = client.wait(a.id, 300), client.wait(b.id, 300)
        logs = {j.id: client.logs(j.id).text for j in (a, b)}
        for j in (a, b):
            assert j.state == "succeeded", (j.reason, logs[j.id][-2000:])
        assert sum("building environment" in t for t in logs.values()) == 1, logs
        plan = client.manager._row(a.id)["plan"]
        build = json.loads(plan)["environment"]["build"]
        assert build["mode"] == "built" and build["python"] == PY
        assert a.environment == {"mode": "built", "hash": build["hash"], "python_version": PY,
                                 "python": f"{workdir}/.cloudtik-envs/{build['hash']}/bin/python",
                                 "system": build["system"], "packages": len(build["pins"])}
        got = _env_json(client, a.id, tmp_path)
        assert got["user"] == ACCOUNT and got["python"] == PY
        assert got["executable"].startswith(f"{workdir}/.cloudtik-envs/{build['hash']}/")
        assert not any(p.startswith(sys.prefix) for p in got["path"] if p)
        # exactly the session's versions: every package the job has, the session has
        # with the same version, and toolz and the runner are among them
        session = {_norm(d.metadata["Name"]): d.version for d in md.distributions()}
        assert {"toolz", "papermill", "ipykernel", "nbclient"} <= set(got["dists"])
        for name, version in got["dists"].items():
            if name != "pip":
                assert session.get(_norm(name)) == version, (name, version)
        assert got["dists"] == {**{n: v for n, v in build["pins"].items()}}
    finally:
        client.close()
        subprocess.run(["rm", "-rf", "--", workdir], check=False)


# --- the local backend: refusals at submit, a half-built environment, old ones --------------


def _wheel(folder: Path, name: str, tag: str, requires_python: str | None = None) -> Path:
    """A real wheel file (PEP 427) of a one-module package."""
    version = "1.0"
    path = folder / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        meta += f"Requires-Python: {requires_python}\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "X = 1\n")
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def _check_refusals(make_client, report_nb, tmp_path) -> None:
    """Refused at submit, one line each, nothing recorded."""
    other = sorted(Path("/root/.pyenv/versions").glob("3.1[!1]*/bin/python3"))
    reqs = tmp_path / "requirements.txt"
    mac = _wheel(tmp_path, "macpkg", "py3-none-macosx_11_0_arm64")
    future = _wheel(tmp_path, "futurepkg", "py3-none-any", requires_python=">=3.99")
    backends = {"mac": {"type": "local", "environment": {"requirements": str(reqs)}}}
    if other:  # another Python than the session's: a version mismatch
        backends["old"] = {"type": "local", "environment": {
            "packages": [], "base_python": str(other[0])}}
    client = make_client(backends)
    reqs.write_text(f"six==1.17.0\n{mac.name}\n")
    with pytest.raises(ConfigError) as e:
        client.submit(build_spec(str(report_nb)), "mac")
    msg = str(e.value)
    assert "\n" not in msg and "package macpkg 1.0 cannot be installed on backend 'mac'" in msg
    assert "is not for Python" in msg
    reqs.write_text(f"{future}\n")
    with pytest.raises(ConfigError, match=r"package futurepkg 1\.0 .*requires Python >=3\.99"):
        client.submit(build_spec(str(report_nb)), "mac")
    if other:
        with pytest.raises(ConfigError, match=rf"the session runs Python {PY} and backend "
                                              r"'old' has no Python"):
            client.submit(build_spec(str(report_nb)), "old")
    with pytest.raises(ConfigError, match=r"environment\.packages: 7 is not allowed"):
        make_client({"bad": {"type": "local", "environment": {"packages": 7}}}).submit(
            build_spec(str(report_nb)), "bad")
    assert client.list() == []  # nothing recorded, nothing queued


def _full_disk(make_client, report_nb, tmp_path) -> None:
    """A work folder on a full file system (a 1 MiB tmpfs): the wheels cannot be staged,
    the job fails at its submission with one line saying so and is never queued."""
    if os.getuid() != 0:
        return
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        return  # no tmpfs mounts here (a container without the capability)
    try:
        client = make_client({"full": {"type": "local", "workdir": str(mnt / "jobs"),
                                       "environment": {"packages": ["toolz"]}}})
        info = client.submit(build_spec(str(report_nb)), "full")
        assert info.state == "failed" and info.native_id is None, info
        assert "cannot stage the job's environment in" in info.reason, info.reason
        assert info.reason.endswith("the disk is full"), info.reason
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_refusals_at_submit_half_built_repair_and_old_envs_collected(
        make_client, report_nb, tmp_path, hpc_state):
    _check_refusals(make_client, report_nb, tmp_path)
    root = tmp_path / "jobs" / ".cloudtik-envs"
    old = root / "0123456789abcdef"  # an environment nobody used for 60 days
    (old / "bin").mkdir(parents=True)
    (root / "0123456789abcdef.txt").write_text(f"{root}/wheels/gone-1.0-py3-none-any.whl\n")
    (root / "wheels").mkdir()
    orphan = root / "wheels" / "gone-1.0-py3-none-any.whl"
    orphan.write_bytes(b"")
    past = time.time() - 60 * 86400
    os.utime(old, (past, past))
    # a build cut off half-way (a folder without the completion marker) where the job's
    # environment goes: found by the job, removed and built again
    from jupyter_cloudtik.hpc import environment as envs
    from jupyter_cloudtik.transport.shell import LocalShell

    system = envs.find_python(LocalShell(), "loc", [], None)
    cache = hpc_state / "hpc" / "wheels"  # the session's wheels (make_client's state)
    h = envs.lock(["toolz"], None, cache, system, permit=None)[2]
    (root / h / "bin").mkdir(parents=True)
    (root / h / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    client = make_client({"loc": {"type": "local", "workdir": str(tmp_path / "jobs"),
                                  "environment": {"packages": ["toolz"], "keep_days": 30}}})
    _full_disk(make_client, report_nb, tmp_path)
    job = client.wait(client.submit(build_spec(str(report_nb)), "loc").id, 300)
    text = client.logs(job.id).text
    assert job.state == "succeeded", text[-2000:]
    assert "was left half-built; building it again" in text
    assert not old.exists() and not orphan.exists()  # collected at the first staging
    build = json.loads(client.manager._row(job.id)["plan"])["environment"]["build"]
    assert build["hash"] == h
    env = root / h
    assert (env / ".cloudtik-complete").exists() and (env / ".cloudtik-used").exists()
    got = _env_json(client, job.id, tmp_path)
    assert got["dists"]["toolz"] == md.version("toolz")
    assert got["executable"].startswith(str(env))


def test_a_direct_reference_in_packages_is_refused_before_anything_is_built(
        make_client, report_nb, tmp_path):
    """``packages`` are names of the session's packages: ``NAME @ URL`` would have
    ``pip wheel`` fetch and build a folder or an archive on the submitting side (the
    sidekick's machine on a hub, past its location policy), running its setup code."""
    project = tmp_path / "evil"
    project.mkdir()
    marker = tmp_path / "built-here"
    (project / "setup.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from setuptools import setup\nsetup(name='evil', version='1.0')\n")
    client = make_client({"loc": {"type": "local", "workdir": str(tmp_path / "jobs")}})
    for i, entry in enumerate([f"evil @ {project.as_uri()}",
                               "evil @ https://example.invalid/evil-1.0.tar.gz"]):
        spec = build_spec(str(report_nb), packages=["toolz", entry][i:])
        with pytest.raises(ConfigError) as e:
            client.submit(spec, "loc")
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"environment.packages.{1 - i}: "), msg
        assert "is a direct reference (NAME @ URL)" in msg, msg
        assert e.value.field == f"environment.packages.{1 - i}"
    assert not marker.exists()  # its setup code never ran here
    assert client.list() == []  # nothing recorded


# --- FirecREST: staged through its file API, probed and built by jobs -----------------------


@pytest.mark.slow
def test_firecrest_stages_through_its_file_api_and_jobs_build_once(
        make_client, backend_configs, firecrest, report_nb, tmp_path):
    """FirecREST runs no command: the system's Python is asked by a batch job (its answer
    kept for a day), the wheels go up through FirecREST's file API, the first job builds
    the environment in ``<workdir>/.cloudtik-envs`` and the second reuses it; old
    environments are collected by the jobs themselves."""
    config, secrets = backend_configs["firecrest"]()
    config["environment"] = {"packages": ["toolz"]}
    workdir = Path(config["workdir"])
    root = workdir / ".cloudtik-envs"
    old = root / "0123456789abcdef"  # an environment nobody used for 60 days
    (old / "bin").mkdir(parents=True)
    past = time.time() - 60 * 86400
    os.utime(old, (past, past))
    client = make_client({"firecrest": config}, secrets)
    t0 = time.time()  # the emulator is shared by the worker's tests: count only ours
    a = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "firecrest").id, 300)
    log_a = client.logs(a.id).text
    assert a.state == "succeeded", (a.reason, log_a[-2000:])
    build = json.loads(client.manager._row(a.id)["plan"])["environment"]["build"]
    h = build["hash"]
    assert "building environment" in log_a and (root / h / ".cloudtik-complete").exists()
    assert not old.exists()  # collected by the job
    probes = [r for r in firecrest.requests() if r["method"] == "POST" and r["t"] >= t0
              and r["path"].endswith("/compute/testsys/jobs")]
    assert len(probes) == 2  # the probe job, then the job
    wheels = sorted(p.name for p in (root / "wheels").iterdir())
    assert any(w.startswith("toolz-") for w in wheels)
    staged = {p: p.stat().st_mtime_ns for p in (root / "wheels").iterdir()}
    b = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "firecrest").id, 300)
    log_b = client.logs(b.id).text
    assert b.state == "succeeded", (b.reason, log_b[-2000:])
    assert "building environment" not in log_b and f"environment {h}" in log_b
    assert {p: p.stat().st_mtime_ns for p in (root / "wheels").iterdir()} == staged
    probes = [r for r in firecrest.requests() if r["method"] == "POST" and r["t"] >= t0
              and r["path"].endswith("/compute/testsys/jobs")]
    assert len(probes) == 3  # no second probe: the answer was kept
    got = _env_json(client, b.id, tmp_path)
    assert got["executable"].startswith(f"{root}/{h}/")
    assert got["dists"]["toolz"] == md.version("toolz")
    assert not any(p.startswith(sys.prefix) for p in got["path"] if p)


# --- ARC: the environment's files are the job's input files ---------------------------------


@pytest.mark.slow
def test_arc_jobs_get_the_environment_as_input_files(
        make_client, backend_configs, arc, report_nb, tmp_path):
    """A-REX has no file API outside a job: the wheels, lock and build script are input
    files of the job (listed in its xRSL, uploaded into its session folder).  Without a
    shared folder each job builds its own environment in its session folder; with
    ``envs_folder`` the first job builds it there and the next one reuses it."""
    config, secrets = backend_configs["arc"]()
    config["environment"] = {"packages": ["toolz"]}
    client = make_client({"arc": config}, secrets)
    a = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "arc").id, 300)
    log_a = client.logs(a.id).text
    assert a.state == "succeeded", (a.reason, log_a[-2000:])
    assert "building environment" in log_a
    got = _env_json(client, a.id, tmp_path)
    assert "/.cloudtik-envs/" in got["executable"], got["executable"]
    assert got["dists"]["toolz"] == md.version("toolz")
    assert not any(p.startswith(sys.prefix) for p in got["path"] if p)
    outputs = [p.name for p in client.fetch(a.id, tmp_path / "all")]
    assert "env.json" in outputs  # the results, not the environment's files
    assert not any(n.endswith(".whl") or ".cloudtik-env" in n for n in outputs), outputs
    shared = tmp_path / "site-envs"
    config = {**config, "envs_folder": str(shared)}
    client = make_client({"arc": config}, secrets)
    b = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "arc").id, 300)
    c = client.wait(client.submit(build_spec(str(report_nb), time="10m"), "arc").id, 300)
    logs = {j.id: client.logs(j.id).text for j in (b, c)}
    for j in (b, c):
        assert j.state == "succeeded", (j.reason, logs[j.id][-2000:])
    assert "building environment" in logs[b.id] and "building environment" not in logs[c.id]
    h = json.loads(client.manager._row(c.id)["plan"])["environment"]["build"]["hash"]
    assert (shared / h / ".cloudtik-complete").exists()
    assert _env_json(client, c.id, tmp_path)["executable"].startswith(f"{shared}/{h}/")


def test_backends_whose_jobs_run_elsewhere_build_the_sessions_environment_by_default(
        make_client):
    """The default is decided by where the jobs run: as this account on this machine
    (local, Slurm here) the session's interpreter *is* its environment; as another
    account on machines that never saw the session (Slurm over SSH, FirecREST, ARC) it is
    built there — unless the backend (its admin) or the job names a Python."""
    from jupyter_cloudtik.hpc import environment as envs
    from jupyter_cloudtik.hpc.base import Environment

    client = make_client({
        "here": {"type": "local"},
        "f7t": {"type": "firecrest", "url": "https://f7t.example.org",
                "token_uri": "https://auth.example.org/token", "client_id": "me",
                "system": "daint"},
        "ce": {"type": "arc", "url": "https://ce.example.org/arex"},
        "named": {"type": "firecrest", "url": "https://f7t.example.org",
                  "token_uri": "https://auth.example.org/token", "client_id": "me",
                  "system": "daint", "environment": {"python": "/opt/site/bin/python3"}}})
    reg = client.manager.registry
    modes = {}
    for name in ("here", "f7t", "ce", "named"):
        be = reg.get(name)
        explicit = {k for k, v in (be.config.get("environment") or {}).items() if v}
        modes[name] = envs.mode(be.default_environment(), explicit, be.builds_environment())
    assert modes == {"here": "session-interpreter", "f7t": "built", "ce": "built",
                     "named": "named"}
    assert envs.mode(Environment(packages="system"), set(), True) == "system"
