"""Fixtures for the Huawei Cloud tests: a real emulator process, per-test state folders.

The emulator runs as its own process (session scope), like the real cloud runs apart from
us: killing our process mid-`up` does not touch it, and the emulated servers' processes
are its children.  At the end of the session it is stopped and must leave no process.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from cloudtik_emulators.huaweicloud.process import start_emulator


@pytest.fixture(scope="session")
def hwc(tmp_path_factory):
    """The emulator: ``.ctl`` (admin client), ``.info`` (endpoint, keys), ``.dir``."""
    # workspaces are deleted and made again under the same names: OBS would hold a
    # deleted bucket's name ~30 min (test_workspace_faults tests that with its own value)
    h = start_emulator(tmp_path_factory.mktemp("hwc-emulator"), bucket_release_seconds=0)
    yield h
    left = h.stop()
    assert not left, f"emulated server processes left behind: {left}"


@pytest.fixture
def env(tmp_path, monkeypatch, hwc):
    """A private state folder and HOME; credentials from the emulator's file."""
    state = tmp_path / "state"
    state.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    for k in list(os.environ):
        if k.startswith("HUAWEICLOUD_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CLOUDTIK_STATE_DIR", str(state))
    monkeypatch.setenv("CLOUDTIK_LAUNCHER_IDLE", "5")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HUAWEICLOUD_CREDENTIALS_FILE", str(hwc.dir / "credentials"))
    return state


@pytest.fixture
def faults(hwc):
    """Inject faults; every fault is cleared when the test ends."""
    yield hwc.ctl
    hwc.ctl.clear_faults()
    hwc.ctl.set_options(quotas={"instances": 200, "cores": 800, "vpc": 5})


@pytest.fixture
def core(env):
    """(ClusterManager, WorkspaceManager) on one store, and a runner for their coroutines."""
    from jupyter_cloudtik.clusters.manager import ClusterManager
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.workspaces.manager import WorkspaceManager

    settings = CloudTik(state_dir=str(env), start_reaper=False, operation_timeout=180)
    cm = ClusterManager(settings=settings)
    wm = WorkspaceManager(settings=settings, store=cm.store)
    loop = asyncio.new_event_loop()

    class C:
        clusters, workspaces = cm, wm

        @staticmethod
        def run(coro):
            return loop.run_until_complete(coro)

    yield C
    loop.close()
