"""The dask-gateway provider against a real dask-gateway-server (local backend)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from dask_gateway import BasicAuth, Gateway

from jupyter_cloudtik.clusters.manager import ClusterManager
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
        def scheduler_workers() -> set[str]:
            ident = client.sync(client.scheduler.identity)
            return {str(w.get("name")) for w in ident["workers"].values()}

        try:
            assert await asyncio.to_thread(lambda: client.submit(sum, [1, 2]).result()) == 3
            # The gateway's scheduler picks which worker retires: whichever it was, the
            # manager's record must be the survivor, and no replacement may follow (a worker
            # retired behind the scheduler's back reads as a failure it makes up for).
            # Data on the worker the manager would retire (the last one it lists) makes the
            # scheduler close the other (it closes the workers holding the least data).
            ident = await asyncio.to_thread(client.sync, client.scheduler.identity)
            last = list(ident["workers"])[-1]
            held = await asyncio.to_thread(client.scatter, b"x" * 20_000_000, workers=[last])
            info = await mgr.scale("gw1", 1)
            assert info.running_workers == 1
            assert await asyncio.to_thread(lambda: len(held.result())) == 20_000_000
            assert {n.node_id for n in info.workers if n.status == "running"} == \
                await asyncio.to_thread(scheduler_workers)
            await asyncio.sleep(3)  # a few of the scheduler's heartbeats to the gateway
            info = mgr.get("gw1")
            assert info.running_workers == 1
            assert len(await asyncio.to_thread(scheduler_workers)) == 1
            info = await mgr.scale("gw1", 3)
            assert info.running_workers == 3
            assert {n.node_id for n in info.workers if n.status == "running"} == \
                await asyncio.to_thread(scheduler_workers)
        finally:
            await asyncio.to_thread(client.close)
        await mgr.down("gw1")
        assert mgr.get("gw1").state == "stopped"

    try:
        asyncio.run(run())
    finally:  # one failure here must not leave a gateway cluster for the next tests
        asyncio.run(mgr.down("gw1"))
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


def test_a_storage_reaches_the_gateway_workers(gateway, state, tmp_path):
    """storage.remotes on a gateway cluster: the rclone config (with the WebDAV password)
    reaches every worker, a later one too, over the gateway's TLS connection, lands 0600
    on a tmpfs, and is not in the cluster's options the gateway keeps."""
    from jupyter_cloudtik.providers.dask_gateway import DaskGatewayNodeProvider
    from jupyter_cloudtik.storage.manager import StorageManager
    from jupyter_cloudtik.storage.servers import start_server

    (tmp_path / "data" / "in").mkdir(parents=True)
    (tmp_path / "data" / "in" / "hello.txt").write_text("read on a gateway worker")
    mgr = ClusterManager(settings=CloudTik(state_dir=str(state), start_reaper=False))

    def read_storage():
        import os
        import stat
        import subprocess

        conf = os.environ["RCLONE_CONFIG"]
        r = subprocess.run([os.environ["CLOUDTIK_RCLONE"], "cat", "data:hello.txt"],
                           capture_output=True, text=True, timeout=60)
        return {"out": r.stdout, "err": r.stderr[-300:], "conf": conf,
                "mode": oct(stat.S_IMODE(os.stat(conf).st_mode))}

    with start_server("webdav", tmp_path / "data", workdir=tmp_path / "dav") as dav:
        storage = StorageManager(settings=mgr.settings, store=mgr.store, supervise=False)
        storage.add("data", "webdav", dav.storage_options(), source="in")
        cfg = _config(gateway, "gwdata", 1)
        cfg["storage"] = {"remotes": ["data"]}

        async def run():
            info = await mgr.up(cfg)
            assert info.state == "running", info.reason
            await mgr.scale("gwdata", 2)  # a worker that joins after the plugin was sent
            _, connect = mgr.connect_info("gwdata")
            client = await asyncio.to_thread(DaskGatewayNodeProvider.make_client, connect,
                                             set_as_default=False)
            try:
                seen = await asyncio.to_thread(client.run, read_storage)
                options = await asyncio.to_thread(
                    lambda: Gateway(gateway.address, auth=BasicAuth(
                        "alice", gateway.password)).list_clusters()[0].options)
            finally:
                await asyncio.to_thread(client.close)
            await mgr.down("gwdata")
            return seen, options

        seen, options = asyncio.run(run())
    assert len(seen) == 2, seen
    for worker, r in seen.items():
        assert r["out"] == "read on a gateway worker", (worker, r)
        assert r["conf"].startswith("/dev/shm/") and r["mode"] == "0o600", r
    assert dav.password not in json.dumps(options, default=str)


def test_the_docs_configs(gateway, state, tmp_path):
    """README's provider section and docs/dask-gateway.md's config, as files `up` reads,
    with this gateway's addresses for the docs' gateway.example.org."""
    import doc_examples
    import yaml

    def ours(text: str) -> str:
        port = gateway.address.rsplit(":", 1)[1]
        return (text.replace("https://gateway.example.org", gateway.address)
                .replace("gateway://gw.example.org:8786", f"gateway://127.0.0.1:{port}"))

    readme = doc_examples.block("README.md", "The `dask-gateway` provider")
    guide = doc_examples.block("docs/dask-gateway.md", "Config")
    section = yaml.safe_load(ours(readme.text))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(
        {"cluster_name": "small", **section, "available_node_types": {
            "head": {"resources": {"CPU": 0}},
            "worker": {"resources": {"CPU": 2}, "min_workers": 1, "max_workers": 2}},
         "head_node_type": "head"}))
    (tmp_path / "big.yaml").write_text(ours(guide.text))
    env = {**os.environ}
    for name, workers in (("small", 1), ("big", 4)):
        r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "up",
                            str(tmp_path / f"{name}.yaml"), "--json"], env=env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert len([n for n in got["nodes"] if n["kind"] == "worker"]) == workers, got
        r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "down", name], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert _gateway_clusters(gateway) == []
