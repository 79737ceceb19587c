"""Fixtures for the HPC tests: real services on loopback, started once per session.

* ``slurm``: a single-node Slurm (munged, slurmctld, slurmd from Debian) in a temp folder.
* ``firecrest`` / ``arc``: the emulators as separate processes, with fault injection.
* ``http_files``: a loopback HTTP server for inputs given by URL.
* every test gets its own state folder (``CLOUDTIK_STATE_DIR``) and a ``make_client``
  that builds a jobs client for a set of backends and closes it after the test.
* at the end of the session no process may be left that runs in our temp folders.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

CLIENT_SECRET = "f7t-test-secret-9f8e7d"  # checked for leaks in the tests
F7T_USER = "service-account-cloudtik"  # the user name in the emulator's tokens

# --- notebooks --------------------------------------------------------------------------------


def _nb(*cells: tuple[str, list[str]]) -> dict:
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": tags},
                   "execution_count": None, "outputs": [], "source": src}
                  for i, (src, tags) in enumerate(cells)],
    }


@pytest.fixture
def notebooks(tmp_path):
    """Notebooks the tests submit, and the input file the parameterised one reads."""
    d = tmp_path / "nbs"
    d.mkdir()
    (d / "data.txt").write_text("6\n")
    books = {
        # reads data.txt (an input), multiplies by the parameter, writes result.txt
        "param": _nb(("factor = 1\ninput_name = 'data.txt'", ["parameters"]),
                     ("value = int(open(input_name).read())\n"
                      "result = value * factor\n"
                      "print('result', result)\n"
                      "open('result.txt', 'w').write(str(result))", [])),
        "fail": _nb(("x = 1", ["parameters"]), ("y = x + 1", []),
                    ("print('about to fail')\nz = y / 0", []), ("print('never')", [])),
        "long": _nb(("seconds = 120", ["parameters"]),
                    ("import time\nprint('sleeping', flush=True)\ntime.sleep(seconds)", [])),
        "ticks": _nb(("n = 6\ndelay = 0.7", ["parameters"]),
                     ("import sys, time\nfor i in range(n):\n"
                      "    print(f'tick {i}', flush=True)\n    time.sleep(delay)", [])),
    }
    paths = {}
    for name, nb in books.items():
        paths[name] = d / f"{name}.ipynb"
        paths[name].write_text(json.dumps(nb))
    paths["data"] = d / "data.txt"
    return paths


# --- state and clients --------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def hpc_state(state_dir, tmp_path, monkeypatch):
    """The shared per-test state folder (tests/conftest.py), the test's folder as the
    session's working folder, and no jobs client left open afterwards."""
    monkeypatch.delenv("CLOUDTIK_API_URL", raising=False)
    monkeypatch.delenv("CLOUDTIK_HPC_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    yield state_dir
    from jupyter_cloudtik.hpc.client import forget_clients

    forget_clients()


@pytest.fixture
def make_client(hpc_state):
    """make_client({name: config}, secrets={(backend, key): value}) -> JobsClient."""
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.settings import HPC

    made = []

    def make(backends: dict, secrets: dict | None = None, **hpc_options):
        settings = CloudTik(state_dir=str(hpc_state))
        hpc = HPC(backends=backends, **{"poll_interval": 0.2, "poll_interval_max": 1.0,
                                        "retry_interval_max": 2.0, **hpc_options})
        client = JobsClient(settings=settings, hpc=hpc)
        for (backend, key), value in (secrets or {}).items():
            client.manager.secrets.put(f"hpc:{backend}", key, value)
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()


#: what an admin of the emulated FirecREST and ARC sites names as their Python: one that
#: has papermill (the emulators run jobs on this machine, as this account).  Without it
#: those backends build the session's environment, their default (jobs run elsewhere,
#: as another account); the tests of that name packages or drop this
SITE_PYTHON = {"environment": {"python": sys.executable}}


def wait_for(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


# --- real services --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs
    from tests.conftest import outside_the_slurm_group

    outside = outside_the_slurm_group()
    if outside:
        pytest.fail(f"{outside} starts the machine's Slurm but is listed in tests/conftest.py "
                    "_OWN_UNITS: two workers would each run a Slurm; take it off that list",
                    pytrace=False)
    missing = missing_programs(accounting=True)
    if missing:
        pytest.skip(f"Slurm with accounting is not installed ({', '.join(missing)}); "
                    "run scripts/install-system-deps.sh")
    # with slurmdbd + MariaDB, as real sites (and FirecREST, which calls sacct) have it
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=2, memory_mb=2000,
                           max_time_minutes=60, accounting=True)
    cluster.start()
    yield cluster
    cluster.stop()


class Service:
    """An emulator process: its URL, token URL, and fault injection."""

    def __init__(self, module: str, root: Path, extra: list[str] | None = None) -> None:
        self.module, self.root, self.extra = module, root, extra or []
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.info: dict = {}

    def start(self) -> Service:
        env = {**os.environ, "EMULATOR_CLIENT_SECRET": CLIENT_SECRET,
               "EMULATOR_ADMIN_TOKEN": "admin-token-for-tests"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "--root", str(self.root), "--port",
             str(self.port), *self.extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.module} did not start: {self.proc.stderr.read()}")
        self.info = json.loads(line)
        self.port = int(self.info["url"].rsplit(":", 1)[1])
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return self.info["url"]

    def stop(self, crash: bool = False) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        self.proc.wait(20)
        self.proc = None

    def admin(self, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"{self.url}/_emulator/{path}", method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"X-Emulator-Admin": "admin-token-for-tests",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def faults(self, **faults) -> None:
        self.admin("faults", faults)

    def reset(self) -> None:
        self.faults(down=False, fail=[], throttle={"count": 0}, queue_delay=0, token_ttl=300)
        if self.module.endswith("firecrest"):
            self.admin("slurm", {"down": False, "qos": None, "age": 0})
            self.admin("system", {"max_ops_file_size": None, "command_timeout": None,
                                  "fs_delay": 0, "schedule_delay": None})
        if self.module.endswith(".arc"):
            self.faults(max_running=None, kill_delay=0)

    def requests(self) -> list[dict]:
        return self.admin("requests")["requests"]


@pytest.fixture(scope="session")
def firecrest_service(tmp_path_factory):
    svc = Service("cloudtik_emulators.firecrest", tmp_path_factory.mktemp("f7t"),
                  ["--system", "testsys", "--partitions",
                   json.dumps({"normal": {"max_time": 3600, "cpus": 2, "nodes": 1,
                                          "memory_mb": 2000, "default": True}})]).start()
    yield svc
    svc.stop()


@pytest.fixture
def firecrest(firecrest_service):
    firecrest_service.reset()
    yield firecrest_service
    if firecrest_service.proc is None:  # a test crashed it; bring it back for the next
        firecrest_service.start()
    firecrest_service.reset()


@pytest.fixture
def api(firecrest):
    """FirecREST's API through a plain HTTP client with a fresh token: the emulator's
    answers, unfiltered (test_hpc_firecrest_real, test_hpc_firecrest_limits)."""
    tok = httpx.post(firecrest.info["token_uri"], data={
        "grant_type": "client_credentials", "client_id": "cloudtik",
        "client_secret": CLIENT_SECRET}).json()["access_token"]
    with httpx.Client(base_url=firecrest.url, timeout=30,
                      headers={"Authorization": f"Bearer {tok}"}) as c:
        yield c


@pytest.fixture(scope="session")
def arc_service(tmp_path_factory):
    svc = Service("cloudtik_emulators.arc", tmp_path_factory.mktemp("arc"),
                  ["--queues", json.dumps({"main": {"max_wall_time": 3600,
                                                    "max_slots": 2}})]).start()
    yield svc
    svc.stop()


@pytest.fixture
def arc(arc_service):
    arc_service.reset()
    yield arc_service
    if arc_service.proc is None:
        arc_service.start()
    arc_service.reset()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def http_files(tmp_path_factory):
    """(folder, base URL): files put in the folder are served on loopback."""
    folder = tmp_path_factory.mktemp("www")
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# --- backends as the tests configure them ---------------------------------------------------------

@pytest.fixture
def backend_configs(request):
    """name -> (config, secrets) for every backend kind, created lazily."""

    def local():
        return {"type": "local"}, {}

    def slurm_():
        s = request.getfixturevalue("slurm")
        workdir = request.getfixturevalue("tmp_path") / "slurm-jobs"
        return {"type": "slurm", "env": s.env, "workdir": str(workdir)}, {}

    def firecrest_():
        f = request.getfixturevalue("firecrest")
        return ({"type": "firecrest", "url": f.url, "token_uri": f.info["token_uri"],
                 "client_id": "cloudtik", "system": "testsys",
                 # users may write only in <mount>/<user name>, as on the real systems
                 "workdir": f"{f.info['root']}/{F7T_USER}/jobs-{request.node.name[:40]}",
                 **SITE_PYTHON},
                {("firecrest", "client_secret"): CLIENT_SECRET})

    def arc_():
        a = request.getfixturevalue("arc")
        return ({"type": "arc", "url": a.url, "token_uri": a.info["token_uri"],
                 "client_id": "cloudtik", **SITE_PYTHON},
                {("arc", "client_secret"): CLIENT_SECRET})

    return {"local": local, "slurm": slurm_, "firecrest": firecrest_, "arc": arc_}


# --- nothing left behind -------------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def no_leftover_job_processes(request):
    """HPC jobs run as processes of their own (local backend, Slurm's, A-REX's): once
    every fixture of the worker is gone, nothing may be left under its base folder.  The
    check runs at the very end (``tests/conftest.py``, ``isolated_jupyter``): checked
    here, when the first HPC test of a worker came after another module's session
    fixtures (a JupyterLab, an emulator), it saw their processes, still running."""
    from tests.conftest import check_worker_processes_at_the_end

    check_worker_processes_at_the_end(request.config, "HPC job processes")
    yield


def dedent(s: str) -> str:
    return textwrap.dedent(s).lstrip()


@pytest.fixture
def ip(hpc_state):
    """An IPython shell with the magics loaded, on this test's HPC state (the faces'
    tests: %hpc in plain IPython)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_cloudtik")
    yield shell
    shell.user_ns.clear()



def write_hpc_kernel_config(tmp_path, slurm, custom: dict | None = None) -> Path:
    """A Jupyter server config (``tmp_path/config``) with the test Slurm as ``daint`` and
    one kernel profile, ``debug`` (30 min; ``custom``: its bounds of custom sizes);
    answers daint's job folder."""
    workdir = tmp_path / "daint-jobs"
    daint = {"type": "slurm", "env": slurm.env, "workdir": str(workdir)}
    profile = {"name": "debug", "backend": "daint", "time": "30m",
               **({"custom": custom} if custom is not None else {})}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        f"c.HPC.backends = {{'daint': {daint!r}}}\n"
        f"c.HPCKernels.profiles = [{profile!r}]\n"
        "c.HPCKernels.poll_interval = 0.5\n"
        "c.ServerApp.kernel_spec_manager_class = "
        "'jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager'\n")
    return workdir
