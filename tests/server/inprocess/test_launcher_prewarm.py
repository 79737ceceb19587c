"""The server extension's start begins the local launcher's (so a notebook's first
`%cluster up` finds Dask imported), and that launcher still stops when idle."""

from __future__ import annotations

import time

import psutil
import pytest

from jupyter_cloudtik.providers.local import launcher


@pytest.fixture
def jp_server_config(state_dir):
    return {"ServerApp": {"jpserver_extensions": {"jupyter_cloudtik": True}},
            "CloudTik": {"state_dir": str(state_dir)}}  # prewarm on, as installed


def _hello(state_dir):
    try:
        return launcher.request(state_dir, {"op": "hello"}, timeout=10)
    except launcher.LauncherUnavailable:
        return None


async def test_server_start_prewarms_the_launcher_which_exits_when_idle(
        jp_serverapp, state_dir):
    deadline = time.monotonic() + 30
    hello = None
    while hello is None and time.monotonic() < deadline:
        hello = _hello(state_dir)
        time.sleep(0.1)
    assert hello is not None, "the server's start did not start the launcher"
    proc = psutil.Process(hello["pid"])
    assert "launcher" in " ".join(proc.cmdline())
    # CLOUDTIK_LAUNCHER_IDLE=3 (tests/conftest.py): no node, no request -> it ends itself
    proc.wait(timeout=30)
    assert _hello(state_dir) is None
