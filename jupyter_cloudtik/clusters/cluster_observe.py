"""``status``: ask the provider and the scheduler what is really there, record it (the
nodes replaced in one transaction) and set the cluster's state from it."""

from __future__ import annotations

import asyncio
from typing import Any

from ..core.models import ClusterInfo
from ..core.store import loads
from ..providers.base import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    TAG_CLUSTER_NAME,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    ConnectInfo,
    NodeProvider,
)
from ..runtime import base as runtimes
from .cluster_records import _UPSERT_NODE, _target


class ClusterObserver:
    """Observing clusters (a part of ``ClusterManager``)."""

    # observing --------------------------------------------------------------------------------
    async def status(self, name: str) -> ClusterInfo:
        """Ask the provider and the scheduler what is really there, record it, return it."""
        row = self._row(name)
        if row["state"] == "stopped":
            return self._info(row)
        cfg = loads(row["config"], {})
        prov = self.provider_for(cfg)
        heads = await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD})
        info = None
        for h in heads:
            if await asyncio.to_thread(prov.is_running, h):
                info = await asyncio.to_thread(prov.connect_info, h)
                if info:
                    break
        observed = await self._observe(prov, cfg, info)
        busy = self.ops.active_for(_target(name))
        if not busy:
            wanted = sum(loads(row["target_workers"], {}).values())
            if info is None:
                self._set_state(name, "failed",
                                "the head node is gone; run `up` to restart it or `down` to "
                                "clean up")
            elif observed["workers"] < wanted:
                self._set_state(name, "degraded",
                                f"{observed['workers']} of {wanted} workers are running; run "
                                "`up` to replace the missing ones")
            else:
                self._set_state(name, "running")
        return self.get(name)

    async def _observe(self, prov: NodeProvider, cfg: dict[str, Any],
                       info: ConnectInfo | None) -> dict[str, int]:
        """Refresh the nodes table from the provider and the scheduler."""
        name = cfg["cluster_name"]
        node_ids = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        connected: dict[str, str] = {}
        view: dict[str, Any] = {}
        if info is not None:
            try:
                connected = await runtimes.connected_workers(cfg, info, prov, node_ids)
            except (runtimes.RuntimeUnreachable, LookupError):
                connected = {}
            view = await runtimes.observe(cfg, info)
        workers = 0
        # every provider call first, then the nodes replaced in one transaction: a reader
        # (the dashboard route, another process's list) never sees the cluster without
        # its head between the delete and the inserts
        rows = []
        for n in node_ids:
            tags = await asyncio.to_thread(prov.node_tags, n)
            kind = tags.get(TAG_NODE_KIND, NODE_KIND_WORKER)
            ntype = tags.get(TAG_NODE_TYPE, "")
            running = await asyncio.to_thread(prov.is_running, n)
            if kind == NODE_KIND_HEAD:
                status = "running" if running and info else ("starting" if running else "broken")
                extra = {"connect_info": info.to_dict()} if info else {}
                if view:
                    extra["runtime"] = view  # the runtime's own view (Spark's master)
            else:
                status = ("running" if n in connected else "starting") if running else "broken"
                workers += status == "running"
                extra = {"address": connected.get(n)} if n in connected else {}
            res = (cfg["available_node_types"].get(ntype) or {}).get("resources", {})
            rows.append(await asyncio.to_thread(self._node_row, name, n, ntype, kind,
                                                status, res, prov, extra))
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            conn.executemany(_UPSERT_NODE, rows)
        return {"workers": workers, "nodes": len(node_ids)}
