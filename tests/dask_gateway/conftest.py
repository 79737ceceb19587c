from __future__ import annotations

import os

import psutil
import pytest

from cloudtik_emulators.dask_gateway import GatewayServer


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A real dask-gateway-server, for the tests of one module: it is gone before other
    features' session-end checks look for leftover processes."""
    server = GatewayServer(tmp_path_factory.mktemp("gateway")).start()
    yield server
    pgid = server.proc.pid
    server.stop()
    left = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except (psutil.Error, OSError):
            continue
    assert not left, f"gateway processes left behind: {left}"


@pytest.fixture
def state(tmp_path, monkeypatch, gateway):
    monkeypatch.setenv("CLOUDTIK_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("CLOUDTIK_LAUNCHER_IDLE", "5")
    monkeypatch.setenv("DASK_GATEWAY_PASSWORD", gateway.password)
    return tmp_path
