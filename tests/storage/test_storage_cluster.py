"""A cluster with a storage: section: its nodes use the same remote with the same rclone,
credentials in a 0600 file in the node's folder, nowhere in the state database."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from jupyter_cloudtik.core.cluster_manager import ClusterManager
from jupyter_cloudtik.core.errors import ConfigError

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

    with pytest.raises(ConfigError) as e:
        asyncio.run(manager.start_up({"cluster_name": "bad", "storage": {"remotes": ["nope"]}},
                                     workers=1))
    assert e.value.field == "storage.remotes" and "nope" in e.value.message

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


@pytest.mark.parametrize("provider", ["dask-gateway", "huaweicloud"])
def test_providers_that_cannot_deliver_secrets_are_refused(client, settings, s3_server,
                                                           provider):
    from jupyter_cloudtik.storage.cluster import node_runtime

    client.add("shared2", "s3", s3_server.storage_options())
    manager = ClusterManager(settings=settings)
    cfg = {"cluster_name": "x", "provider": {"type": provider},
           "storage": {"remotes": ["shared2"]}}
    with pytest.raises(ConfigError) as e:
        node_runtime(manager, cfg, "head")
    assert e.value.field == "storage.remotes" and provider in e.value.message
    assert node_runtime(manager, {**cfg, "storage": {}}, "head") == {}
