"""A cluster with a storage: section: its nodes use the same remote with the same rclone,
credentials in a 0600 file in the node's folder, nowhere in the state database."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from jupyter_cloudtik.clusters.manager import ClusterManager
from jupyter_cloudtik.core.errors import ConfigError, NotFoundError

# what a user's task on a worker would run: the node's rclone with the node's config
NODE_SCRIPT = (
    'set -e; "$CLOUDTIK_RCLONE" lsjson -- shared: ; echo "@@$RCLONE_CONFIG"; '
    'stat -c "@@%a" "$RCLONE_CONFIG"'
)


@pytest.mark.slow
def test_cluster_nodes_get_the_storage(client, settings, s3_server):
    (s3_server.root / "cluster-data").mkdir(exist_ok=True)
    (s3_server.root / "cluster-data" / "shared.txt").write_text("for every node")
    client.add("shared", "s3", s3_server.storage_options(), source="cluster-data")
    manager = ClusterManager(settings=settings)

    with pytest.raises(NotFoundError) as e:  # the access policy's answer (core/grants.py)
        asyncio.run(manager.start_up({"cluster_name": "bad", "storage": {"remotes": ["nope"]}},
                                     workers=1))
    assert e.value.field == "storage.remotes[0]" and "nope" in e.value.message
    assert "storages: shared" in e.value.message  # one person's folder: their own, as a hint

    async def scenario():
        info = await manager.up({"cluster_name": "withdata",
                                 "storage": {"remotes": ["shared"]}}, workers=1)
        try:
            from distributed import Client

            async with Client(info.scheduler_address, asynchronous=True) as c:
                return await c.submit(subprocess.run, ["sh", "-c", NODE_SCRIPT],
                                      capture_output=True, text=True, pure=False)
        finally:
            await manager.down("withdata")

    res = asyncio.run(scenario())
    assert res.returncode == 0, res.stderr
    listing, conf, mode = res.stdout.split("@@")
    assert [e["Name"] for e in json.loads(listing)] == ["shared.txt"]
    assert mode.strip() == "600" and conf.strip().endswith("rclone.conf")
    assert str(settings.state_dir) in conf
    dump = "\n".join(str(tuple(r)) for t in ("clusters", "nodes", "operations", "events")
                     for r in manager.store.query(f"SELECT * FROM {t}"))
    assert s3_server.password not in dump


def test_huaweicloud_gets_storages_at_run_time_not_at_boot(client, settings, s3_server):
    """huaweicloud nodes get the config over TLS once up (a worker plugin): nothing of it
    goes into what the provider puts in user data (tests/huaweicloud/test_realistic.py
    reads a remote on such nodes)."""
    from jupyter_cloudtik.storage.cluster import node_runtime

    client.add("shared3", "s3", s3_server.storage_options())
    manager = ClusterManager(settings=settings)
    cfg = {"cluster_name": "x", "provider": {"type": "huaweicloud"},
           "storage": {"remotes": ["shared3"]}}
    assert node_runtime(manager, cfg, "worker") == {"env": {"CLOUDTIK_STORAGES": "shared3"}}


@pytest.mark.parametrize("provider", ["dask-gateway", "slurm"])
def test_providers_that_deliver_at_run_time_get_nothing_private_at_boot(
        client, settings, s3_server, provider):
    from jupyter_cloudtik.storage.cluster import node_runtime

    client.add("shared4", "s3", s3_server.storage_options())
    manager = ClusterManager(settings=settings)
    cfg = {"cluster_name": "x", "provider": {"type": provider},
           "storage": {"remotes": ["shared4"]}}
    assert node_runtime(manager, cfg, "worker") == {"env": {"CLOUDTIK_STORAGES": "shared4"}}


NO_DELIVERY_PROVIDER = """
from jupyter_cloudtik.providers.base import NodeProvider


class NoDelivery(NodeProvider):
    provider_type = "nodelivery"
"""


def test_a_provider_that_cannot_deliver_secrets_is_refused(client, settings, s3_server,
                                                           tmp_path, monkeypatch):
    """A third-party provider that declares neither way of handing nodes credentials."""
    import sys

    from jupyter_cloudtik.core import plugins
    from jupyter_cloudtik.storage.cluster import node_runtime

    (tmp_path / "nodelivery_provider.py").write_text(NO_DELIVERY_PROVIDER)
    info = tmp_path / "nodelivery_provider-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nodelivery-provider\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[jupyter_cloudtik.providers]\nnodelivery = nodelivery_provider:NoDelivery\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._entry_points.cache_clear()
    try:
        client.add("shared2", "s3", s3_server.storage_options())
        manager = ClusterManager(settings=settings)
        cfg = {"cluster_name": "x", "provider": {"type": "nodelivery"},
               "storage": {"remotes": ["shared2"]}}
        with pytest.raises(ConfigError) as e:
            node_runtime(manager, cfg, "head")
        assert e.value.field == "storage.remotes" and "nodelivery" in e.value.message
        assert node_runtime(manager, {**cfg, "storage": {}}, "head") == {}
    finally:
        sys.modules.pop("nodelivery_provider", None)
        monkeypatch.undo()
        plugins._entry_points.cache_clear()
