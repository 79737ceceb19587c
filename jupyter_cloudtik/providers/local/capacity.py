"""This machine as the local provider's capacity: the shares of its cores and memory a
node gets by default, what cannot run at all (refused), what oversubscribes it (a
warning), and the one offer placement chooses from."""

from __future__ import annotations

import os
from typing import Any

import psutil

from ...core.store import loads
from ...core.units import format_bytes
from ..base import Capacity
from .processes import is_alive

#: what a node's processes take whatever it declares (a Dask worker alone is ~100 MiB
#: resident): this machine's memory over it is how many local nodes can run at all
NODE_MEMORY_FLOOR = 128 * 2**20


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_memory() -> int:
    return psutil.virtual_memory().total


class LocalCapacity:
    """This machine's room for nodes (a part of ``LocalNodeProvider``)."""

    # defaults -------------------------------------------------------------------------
    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        return {
            "head": {"node_config": {}, "resources": {"CPU": 0}},
            "worker": {
                "node_config": {},
                # threads and memory: shares of this machine (fill_resources)
                "resources": {},
                "min_workers": 1,
                # a policy cap only: the capacity check refuses what the machine cannot hold
                "max_workers": max(machine_cpus(), 8),
            },
        }

    @classmethod
    def fill_resources(
        cls, provider_config: dict[str, Any], node_type: dict[str, Any]
    ) -> dict[str, Any]:
        """Shares of this machine, as ``distributed.LocalCluster`` gives its workers: with
        ``n`` workers of the type (``min_workers``, at least 1) on ``cores`` cores, a worker
        without a declared ``CPU`` gets ``ceil(cores / n)`` threads, and without a declared
        ``memory`` ``machine memory x CPU / max(cores, n x CPU)``: its share of the cores,
        never more than 1/n of the memory, so the cluster's workers never declare more
        memory than the machine has.  Declared values are kept exactly."""
        res = dict(node_type.get("resources") or {})
        cores = max(machine_cpus(), 1)
        n = max(int(node_type.get("min_workers") or 0), 1)
        if "CPU" not in res:
            res["CPU"] = max(1, -(-cores // n))
        if "memory" not in res:
            cpu = float(res["CPU"] or 0)
            res["memory"] = int(machine_memory() * cpu / max(cores, n * cpu)) if cpu else 0
        res.setdefault("GPU", 0)
        return res

    def _live_use(self) -> tuple[dict[str, dict[str, float]], int]:
        """What the live local nodes of every cluster declare (cluster -> totals), and how
        many nodes they are."""
        in_use: dict[str, dict[str, float]] = {}
        nodes = 0
        for row in self._rows(states=("pending", "running")):
            if row["state"] == "running" and not is_alive(row["pid"], row["pid_started"]):
                continue
            nodes += 1
            res = loads(row["resources"], {})
            use = in_use.setdefault(row["cluster"], {"CPU": 0, "memory": 0, "GPU": 0})
            for k in use:
                use[k] += res.get(k, 0) or 0
        return in_use, nodes

    def capacity(self) -> Capacity:
        s = self.settings
        cores, memory = machine_cpus(), machine_memory()
        in_use, nodes = self._live_use()
        used_cpu = sum(u["CPU"] for u in in_use.values())
        used_mem = int(sum(u["memory"] for u in in_use.values()))
        most_nodes = memory // NODE_MEMORY_FLOOR
        limits = []
        if s.cpu_overcommit is not None:
            limits.append(f"c.LocalProvider.cpu_overcommit = {s.cpu_overcommit:g}")
        if s.memory_overcommit is not None:
            limits.append(f"c.LocalProvider.memory_overcommit = {s.memory_overcommit:g}")
        return Capacity(
            cpus=(None if s.cpu_overcommit is None
                  else max(cores * s.cpu_overcommit - used_cpu, 0)),
            memory=(None if s.memory_overcommit is None
                    else max(int(memory * s.memory_overcommit) - used_mem, 0)),
            gpus=0,
            max_nodes=max(most_nodes - nodes, 0),
            node_memory=memory,
            description=(
                f"this machine has {cores} CPU cores and {memory / 2**30:.1f} GiB of memory"
                f", room for at most {most_nodes} local nodes ("
                f"{format_bytes(NODE_MEMORY_FLOOR)} each at least)"
                + (f"; hard limits set: {', '.join(limits)}" if limits else "")
            ),
            in_use=in_use,
        )

    def oversubscription(self, cpus: float, memory: int) -> str | None:
        """The warning when the live local nodes of every cluster plus new ones declaring
        ``cpus`` cores and ``memory`` would declare more than ``oversubscription_warning``
        times this machine's cores or memory."""
        factor = self.settings.oversubscription_warning
        if factor <= 0 or (cpus <= 0 and memory <= 0):
            return None
        cores, mem = machine_cpus(), machine_memory()
        in_use, _nodes = self._live_use()
        total_cpu = cpus + sum(u["CPU"] for u in in_use.values())
        total_mem = memory + sum(u["memory"] for u in in_use.values())
        if total_cpu <= cores * factor + 1e-9 and total_mem <= mem * factor:
            return None
        return (
            f"the local nodes would declare {total_cpu:g} cores and {format_bytes(total_mem)}"
            f" on this machine's {cores} cores and {format_bytes(mem)} "
            f"({total_cpu / cores:.1f}x, {total_mem / mem:.1f}x): they share it and run "
            "slower; fewer or smaller workers avoid it "
            f"(c.LocalProvider.oversubscription_warning = {factor:g})"
        )

    def offers(self, query=None):
        """This machine as one offer: its cores and memory, free without limit unless an
        overcommit factor is set (then minus what live local nodes of every cluster
        declare), room for as many nodes as its memory holds processes for, no node
        bigger than its memory (``node_max``), and who owns the live nodes."""
        import platform
        import socket

        from ...offers import Offer, OfferSet  # deferred: start-up (offers ~7 ms)

        cap = self.capacity()
        s = self.settings
        # deferred: start-up (core.features ~14 ms, loads importlib.metadata)
        from ...core.features import feature_service

        owners = feature_service("cluster_owners")(self.store)
        instances = []
        for row in self._rows(states=("pending", "running")):
            if row["state"] == "running" and not is_alive(row["pid"], row["pid_started"]):
                continue
            instances.append({"cluster": row["cluster"], "owner": owners.get(row["cluster"])})
        host = socket.gethostname()
        return OfferSet([Offer(
            key=f"local/{host}", provider="local", region="local", availability_zone=host,
            arch=platform.machine(), price_per_hour=0.0,
            total={"CPU": machine_cpus() * (s.cpu_overcommit or 1),
                   "memory": float(int(machine_memory() * (s.memory_overcommit or 1))),
                   "GPU": 0.0, "instances": float(machine_memory() // NODE_MEMORY_FLOOR)},
            # None: no limit on the total (oversubscription is allowed, with a warning)
            free={"CPU": cap.cpus, "memory": cap.memory, "GPU": cap.gpus,
                  "instances": cap.max_nodes},
            node_max={"memory": float(machine_memory())},
            instances=instances, description=cap.description)])
