"""Fixtures of the storage tests: real rclone servers on loopback, a private state folder.

The three servers (``rclone serve s3|webdav|sftp``) start once per session with generated
credentials.  Every test gets its own state folder (``state_dir`` of tests/conftest.py) and
working folder; ``make_client`` stops the mount supervisor and checks that nothing stays
mounted.  A session fixture fails the run if an rclone process started here is left behind.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from traitlets.config import Config

from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.storage.client import StorageClient
from jupyter_cloudtik.storage.manager import StorageManager
from jupyter_cloudtik.storage.mounts import mount_entry, stop_supervisor
from jupyter_cloudtik.storage.servers import start_server


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("storage-servers")


def _server(kind, servers_dir):
    srv = start_server(kind, servers_dir / f"root-{kind}", workdir=servers_dir / "work")
    return srv


@pytest.fixture(scope="session")
def s3_server(servers_dir):
    srv = _server("s3", servers_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def webdav_server(servers_dir):
    srv = _server("webdav", servers_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def sftp_server(servers_dir):
    srv = _server("sftp", servers_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="session", autouse=True)
def no_rclone_left_behind(tmp_path_factory):
    """Fail the session if a mount or rclone process started here survives it."""
    base = str(tmp_path_factory.getbasetemp())
    yield
    time.sleep(0.2)
    left = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if base in cmd and ("rclone" in cmd or "storage.mountd" in cmd):
            ppid = p.info["ppid"] or 0
            if "storage.mountd" not in cmd and ppid not in (0, 1, me) \
                    and psutil.pid_exists(ppid):
                # the child of a process that still runs: a copy of a session-scoped
                # server of another conftest whose teardown may come after this one (it
                # stops that server and checks its children itself); a leak is an
                # orphan, a daemon, or a child of this test process
                continue
            left.append(f"{p.info['pid']}: {cmd[:200]}")
            p.kill()
    mounted = [line for line in Path("/proc/mounts").read_text().splitlines() if base in line]
    for line in mounted:
        subprocess.run(["fusermount3", "-uz", line.split()[1]], check=False)
    assert not left, f"processes left behind: {left}"
    assert not mounted, f"mounts left behind: {mounted}"


def make_settings(state_dir: Path, workdir: Path, **storage) -> CloudTik:
    c = Config()
    c.Storage.working_dir = str(workdir)
    c.Storage.health_interval = 0.3
    c.Storage.dir_cache_time = "1s"
    c.Storage.mount_timeout = 20.0
    for k, v in storage.items():
        c.Storage[k] = v
    return CloudTik(config=c, state_dir=str(state_dir))


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def settings(state_dir, workdir):
    return make_settings(state_dir, workdir)


@pytest.fixture
def make_client(state_dir, workdir):
    """make_client(**c_Storage_values) -> a StorageClient on this test's state folder."""
    made = []

    def make(**storage):
        c = StorageClient(manager=StorageManager(
            settings=make_settings(state_dir, workdir, **storage)))
        made.append(c)
        return c

    yield make
    stop_supervisor(state_dir)
    for c in made:
        rows = c.manager.store.query("SELECT mount_path FROM storage_mounts")
        c.close()
        for r in rows:
            assert mount_entry(r[0]) is None, f"{r[0]} is still mounted"


@pytest.fixture
def client(make_client):
    return make_client()

