"""The Slurm partition a cluster runs in, as Slurm has it: ``sinfo`` (its name, state,
time limit, idle cores) and ``scontrol show node`` (its nodes' CPUs and memory), asked
again after ``FACTS_SECONDS``.  From them: a job's memory when none is given, whether
every node is ``localhost`` (so addresses and TLS stay on loopback), and the idle
cores as the provider's capacity and placement offer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, ProviderError
from ..core.units import parse_bytes
from .base import Capacity
from .slurm_parse import free_memory, memory_per_core, parse_sinfo, sinfo_cpus

if TYPE_CHECKING:
    from ..offers import OfferSet


FACTS_SECONDS = 1.0  # sinfo / scontrol show node answers reused within one operation step


class SlurmPartition:
    """What the partition is and has (a part of ``SlurmNodeProvider``)."""

    def _partitions(self) -> list[dict[str, str]]:
        if self._sinfo is None:
            r = self._run(["sinfo", "-h", "-o", "%P|%a|%l|%D|%C|%N|%m"], "sinfo")
            if r.rc != 0:
                raise ConfigError(f"{self._host_field()}: sinfo on {self.where} failed: "
                                  f"{r.message}", field=self._host_field())
            rows = parse_sinfo(r.stdout)
            self._sinfo, self._sinfo_at = rows, time.monotonic()
        return self._sinfo

    def nodes(self) -> list[dict[str, str]]:
        """The partition's nodes as ``scontrol show node`` has them (CPUs, memory, in use)."""
        name = self.partition()["name"]
        return [n for n in self._all_nodes() if name in n.get("Partitions", "").split(",")]

    def _all_nodes(self) -> list[dict[str, str]]:
        # deferred: start-up (transport.slurm ~22 ms, loads asyncio)
        from ..transport.slurm import parse_kv

        if self._nodes and time.monotonic() - self._nodes[0] < FACTS_SECONDS:
            return self._nodes[1]
        r = self._run(["scontrol", "show", "node", "-o"], "scontrol")
        if r.rc != 0:
            raise ProviderError(f"scontrol show node on {self.where} failed: {r.message}")
        rows = [parse_kv(line) for line in r.stdout.splitlines() if line.strip()]
        self._nodes = (time.monotonic(), rows)
        return rows

    def job_memory(self, resources: dict[str, Any]) -> int:
        """Memory of one job: the node type's, or its cores' share of the smallest node."""
        mem = int(resources.get("memory") or 0)
        if mem:
            return mem
        per_core = memory_per_core(self.nodes())
        if per_core is None:
            per_core = parse_bytes("1GiB")
        return per_core * max(int(resources.get("CPU") or 1), 1)

    def partition(self) -> dict[str, str]:
        parts = self._partitions()
        want = self.provider_config.get("partition")
        names = ", ".join(p["name"] + ("*" if p["default"] else "") for p in parts)
        for p in parts:
            if (want and p["name"] == want) or (not want and p["default"]):
                return p
        if want:
            raise ConfigError(f"provider.partition: '{want}' is not a partition Slurm on "
                              f"{self.where} knows (sinfo: {names or 'no partitions'})",
                              field="provider.partition", value=want)
        raise ConfigError(f"provider.partition: Slurm on {self.where} has no default "
                          f"partition; name one (sinfo: {names})", field="provider.partition")

    def _all_localhost(self) -> bool:
        try:
            return self.partition()["nodelist"] in ("localhost", "localhost[]")
        except ConfigError:
            return False

    def _scheduler_host(self) -> str:
        host = self.provider_config.get("scheduler_host")
        if host:
            return host
        return "127.0.0.1" if self._all_localhost() else "0.0.0.0"

    def _interface(self) -> str | None:
        iface = self.provider_config.get("interface")
        if iface:
            return iface
        return "lo" if self._all_localhost() else None

    def capacity(self) -> Capacity:
        """The partition's idle cores (sinfo); the up-front check refuses more."""
        self.check()
        if time.monotonic() - self._sinfo_at > FACTS_SECONDS:
            self._sinfo = None  # idle cores change: ask again
        part = self.partition()
        counts = sinfo_cpus(part["cpus"])
        if counts is None:
            raise ProviderError(f"sinfo on {self.where} answered {part['cpus']!r} for the CPUs "
                                f"of partition '{part['name']}', not allocated/idle/other/"
                                "total")
        _alloc, idle, _other, total = counts
        return Capacity(cpus=idle, max_nodes=None, description=(
            f"partition '{part['name']}' on {self.where} has {idle} idle of {total} CPU "
            f"cores on {part['nodes']} node(s) ({part['nodelist']}; sinfo)"))

    def offers(self, query=None) -> OfferSet:
        # deferred: start-up (offers ~7 ms; transport.slurm ~23 ms, loads asyncio)
        from ..offers import Offer, OfferSet
        from ..transport.slurm import slurm_int

        cap = self.capacity()
        part = self.partition()
        total = (sinfo_cpus(part["cpus"]) or (0, 0, 0, 0))[3]
        mem = slurm_int(part["memory"].rstrip("+"))
        per_node = mem * 2**20 if mem is not None else None
        free_mem = free_memory(self.nodes())
        return OfferSet([Offer(
            key=f"slurm/{part['name']}", provider="slurm", region=self.where,
            availability_zone=part["name"], price_per_hour=0.0,
            total={"CPU": float(total)}, free={"CPU": cap.cpus, "memory": float(free_mem)},
            capabilities={"memory_per_node": per_node, "nodes": part["nodes"]},
            instances=[{"cluster": self.cluster_name}] if self._jobs() else [],
            description=cap.description)])
