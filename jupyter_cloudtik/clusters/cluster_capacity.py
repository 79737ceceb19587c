"""Before anything starts: does the provider have room for the missing nodes (refused
in one line naming what is short), and is the start worth a warning (oversubscription,
said once per cluster)."""

from __future__ import annotations

from typing import Any

from ..core.errors import CapacityError
from ..core.units import format_bytes
from ..providers.base import TAG_CLUSTER_NAME, TAG_NODE_TYPE, Capacity, NodeProvider
from .cluster_records import _target


class ClusterCapacity:
    """Capacity checks (a part of ``ClusterManager``)."""

    # capacity -------------------------------------------------------------------------------
    def _check_capacity(self, prov: NodeProvider, cfg: dict[str, Any],
                        target: dict[str, int]) -> list[str]:
        """Refuse before starting anything when the provider cannot hold the new nodes;
        the warnings to carry when it can, oversubscribed (``prov.oversubscription``)."""
        cap: Capacity = prov.capacity()
        if cap.cpus is None and cap.memory is None and cap.gpus is None and (
                cap.max_nodes is None and cap.node_memory is None):
            return []
        name = cfg["cluster_name"]
        types = cfg["available_node_types"]
        need = {"CPU": 0.0, "memory": 0, "GPU": 0}
        parts = []
        missing_by_type = self._missing(prov, cfg, target)
        for t, missing in missing_by_type.items():
            res = types[t]["resources"]
            for k in need:
                need[k] += missing * (res.get(k) or 0)
            if missing:
                parts.append(
                    f"{missing} x {t} ({res.get('CPU', 0)} CPU, {format_bytes(res.get('memory'))})"
                )
        others = ", ".join(
            f"{c}: {u['CPU']:g} CPU" for c, u in sorted(cap.in_use.items()) if c != name
        )
        in_use = f"; in use by other clusters: {others}" if others else ""
        problems = []
        too_big = [t for t, missing in missing_by_type.items()
                   if missing and cap.node_memory is not None
                   and (types[t]["resources"].get("memory") or 0) > cap.node_memory]
        problems += [f"a {t} node asks {format_bytes(types[t]['resources'].get('memory'))} of "
                     f"memory, more than one node can have ({format_bytes(cap.node_memory)})"
                     for t in too_big]
        if cap.cpus is not None and need["CPU"] > cap.cpus + 1e-9:
            problems.append(f"{need['CPU']:g} CPU cores needed, {cap.cpus:g} free")
        if cap.memory is not None and need["memory"] > cap.memory:
            problems.append(
                f"{format_bytes(need['memory'])} of memory needed, "
                f"{format_bytes(cap.memory)} free")
        if cap.gpus is not None and need["GPU"] > cap.gpus:
            problems.append(f"{need['GPU']:g} GPUs needed, {cap.gpus} available")
        new_nodes = sum(missing_by_type.values())
        if cap.max_nodes is not None and new_nodes > cap.max_nodes:
            problems.append(f"{new_nodes} more node(s) needed, {cap.max_nodes} allowed")
        if problems:
            raise CapacityError(
                f"not enough capacity for cluster '{name}' ({', '.join(parts)}): "
                f"{'; '.join(problems)} — {cap.description}{in_use}. Ask for fewer workers "
                f"or smaller resources; nothing was started.",
                # a node too big for the machine is its memory's fault, not the count's
                field=(f"available_node_types.{too_big[0]}.resources.memory"
                       if too_big and len(problems) == len(too_big) else "workers"),
            )
        warning = prov.oversubscription(need["CPU"], int(need["memory"]))
        if not warning or self._warned_of_oversubscription(name):
            return []
        adds = [p for p in parts if "(0 CPU, 0 B)" not in p]
        return [f"oversubscribed: with {', '.join(adds)} more, {warning}"]

    def _warned_of_oversubscription(self, name: str) -> bool:
        """Once per cluster: an up or scale of it since it last went down already said so
        (every later up of other clusters and scale would repeat it; the store remembers
        across kernels and the server)."""
        target = _target(name)
        row = self.store.query_one(
            "SELECT 1 FROM operations WHERE target = ? AND kind IN ('cluster.up', "
            "'cluster.scale') AND params LIKE '%\"oversubscribed: %' AND created_at > "
            "COALESCE((SELECT MAX(created_at) FROM operations WHERE target = ? AND "
            "kind = 'cluster.down'), 0) LIMIT 1", (target, target))
        return row is not None

    def _missing(self, prov: NodeProvider, cfg: dict[str, Any],
                 target: dict[str, int]) -> dict[str, int]:
        """Nodes of each type that ``target`` (plus the head) needs beyond what exists."""
        name = cfg["cluster_name"]
        wanted = {cfg["head_node_type"]: 1, **target}
        return {
            t: max(count - len(prov.non_terminated_nodes(
                {TAG_CLUSTER_NAME: name, TAG_NODE_TYPE: t})), 0)
            for t, count in wanted.items()
        }

    def _warning_events(self, op_id: str, warnings: list[str]) -> None:
        """Allowed but worth saying loudly (oversubscription): an event each; the texts are
        also the operation's ``warnings`` (its params), which every face shows."""
        for text in warnings:
            self.ops.emit(op_id, "warning", text, 0.01, level="warning")
