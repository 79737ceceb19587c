"""The work of ``down``: every node found by its tags stopped (workers first, so they
leave their scheduler at once), what no record knows swept, the placement released and
the cluster recorded as stopped."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..core.errors import CloudTikError, ProviderError
from ..core.operations import OperationContext
from ..providers.base import NODE_KIND_HEAD, TAG_CLUSTER_NAME, TAG_NODE_KIND, NodeProvider


class ClusterTeardown:
    """Stopping a cluster (a part of ``ClusterManager``)."""

    async def _down(self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
                    reason: str | None) -> Any:
        name = cfg["cluster_name"]
        if reason:
            ctx.progress("terminate", reason, 0.05)
        heads = set(await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD}))
        try:
            nodes = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        except ProviderError as e:
            # a head that cannot say which workers it has is still stopped; whatever is
            # left afterwards is listed again below and reported if it stays
            ctx.progress("terminate", f"the workers could not be listed ({e.message}); "
                         "stopping the head", 0.1)
            nodes = sorted(heads)
        ctx.progress("terminate", f"stopping {len(nodes)} node(s)", 0.1, nodes=len(nodes))
        # workers first: with their scheduler still up they unregister and exit at once
        workers = [n for n in nodes if n not in heads]
        if workers:
            await asyncio.to_thread(prov.terminate_nodes, workers)
            ctx.progress("terminate", f"stopped {len(workers)} worker(s)", 0.5)
        if heads:
            await asyncio.to_thread(prov.terminate_nodes, sorted(heads))
        left = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        if left:
            await asyncio.to_thread(prov.terminate_nodes, left)
            left = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
            if left:
                raise CloudTikError(f"{len(left)} node(s) could not be stopped: "
                                    f"{', '.join(left)}; run `down` again")
        orphans = await asyncio.to_thread(prov.sweep_orphans)
        if orphans:
            ctx.progress("terminate", f"stopped {orphans} unrecorded process group(s)", 0.9)
        await asyncio.to_thread(prov.cleanup)
        await asyncio.to_thread(self.placement.release_nodes, name)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            conn.execute(
                "UPDATE clusters SET state = 'stopped', reason = ?, head_address = NULL,"
                " dashboard_link = NULL, updated_at = ? WHERE name = ?",
                (reason, time.time(), name),
            )
        ctx.progress("terminate", f"cluster '{name}' is stopped", 1.0)
        return {"cluster": name, "stopped_nodes": len(nodes)}
