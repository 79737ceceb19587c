"""The dask-gateway provider against a real dask-gateway-server (local backend)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from dask_gateway import BasicAuth, Gateway

from jupyter_cloudtik.core.cluster_manager import ClusterManager
from jupyter_cloudtik.core.errors import CloudTikError
from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.providers.dask_gateway import close_gateway

# dask-gateway's Gateway.__del__ closes a second time and fails once its loop has stopped
# (at the end of the session); harmless, and not ours.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _config(gateway, name, workers, **extra):
    return {"cluster_name": name,
            "provider": {"type": "dask-gateway", "address": gateway.address,
                         "auth": {"type": "basic", "username": "alice"}, **extra},
            "available_node_types": {"head": {"resources": {"CPU": 0}},
                                     "worker": {"resources": {"CPU": 1}, "min_workers": workers,
                                                "max_workers": 4}},
            "head_node_type": "head"}


def _gateway_clusters(gateway):
    g = Gateway(gateway.address, auth=BasicAuth("alice", gateway.password))
    try:
        return g.list_clusters()
    finally:
        close_gateway(g)


def test_up_compute_scale_down(gateway, state):
    mgr = ClusterManager(settings=CloudTik(state_dir=str(state), start_reaper=False))

    async def run():
        info = await mgr.up(_config(gateway, "gw1", 2))
        assert info.state == "running" and info.running_workers == 2
        assert info.dashboard_link.startswith(gateway.address)
        assert len(_gateway_clusters(gateway)) == 1
        from jupyter_cloudtik.providers.dask_gateway import DaskGatewayNodeProvider

        _, connect = mgr.connect_info("gw1")
        client = await asyncio.to_thread(DaskGatewayNodeProvider.make_client, connect,
                                         set_as_default=False)
        try:
            assert await asyncio.to_thread(lambda: client.submit(sum, [1, 2]).result()) == 3
        finally:
            await asyncio.to_thread(client.close)
        info = await mgr.scale("gw1", 1)
        assert info.running_workers == 1
        info = await mgr.scale("gw1", 3)
        assert info.running_workers == 3
        await mgr.down("gw1")
        assert mgr.get("gw1").state == "stopped"

    asyncio.run(run())
    assert _gateway_clusters(gateway) == []


def test_cli_up_and_down_with_events(gateway, state, tmp_path):
    import yaml

    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(_config(gateway, "gwcli", 1)))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "up", str(cfg), "--json"],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "running"
    assert "1/1 workers connected" in r.stderr
    assert gateway.password not in r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "down", "gwcli"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _gateway_clusters(gateway) == []


def test_wrong_password_is_a_clear_error(gateway, state, monkeypatch):
    monkeypatch.setenv("DASK_GATEWAY_PASSWORD", "wrong")
    mgr = ClusterManager(settings=CloudTik(state_dir=str(state), start_reaper=False))
    with pytest.raises(CloudTikError) as e:
        asyncio.run(mgr.up(_config(gateway, "gwbad", 1)))
    assert "401" in e.value.message or "Unauthorized" in e.value.message
    assert "wrong" not in e.value.message


def test_unknown_cluster_option_names_the_field(gateway, state):
    mgr = ClusterManager(settings=CloudTik(state_dir=str(state), start_reaper=False))
    with pytest.raises(CloudTikError) as e:
        asyncio.run(mgr.up(_config(gateway, "gwopt", 1, cluster_options={"gpus": 2})))
    assert "cluster_options.gpus" in e.value.message
    asyncio.run(mgr.down("gwopt"))
    assert _gateway_clusters(gateway) == []
