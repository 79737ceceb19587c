"""The shapes every face shows: clusters and their nodes.

These dataclasses are also the JSON bodies of the REST API (``to_dict``/``from_dict``), so
a kernel talking to a server gets exactly what an in-process call returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

CLUSTER_STATES = ("starting", "running", "degraded", "scaling", "stopping", "stopped", "failed")


@dataclass
class NodeInfo:
    node_id: str
    node_type: str
    kind: str  # head | worker
    status: str  # starting | running | broken | terminated
    internal_ip: str | None = None
    external_ip: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # shallow on purpose (nested values are already JSON data): asdict's deep copies
        # were most of the cost of the REST cluster list
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeInfo:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class ClusterInfo:
    name: str
    provider: str
    state: str
    reason: str | None
    config: dict[str, Any]
    target_workers: dict[str, int]
    scheduler_address: str | None
    dashboard_link: str | None
    connect_info: dict[str, Any] | None
    nodes: list[NodeInfo]
    created_at: float
    updated_at: float
    last_operation: dict[str, Any] | None = None
    #: reservation_id, reservation_state, cost_per_hour, currency (placement)
    placement: dict[str, Any] | None = None
    #: who started it (the hub user through a sidekick, else the account running the core)
    owner: str | None = None
    #: the Spark UI (master, its workers' and applications' UIs) of a cluster running Spark:
    #: ``{base_url}cloudtik/spark/NAME/`` under a server, else the master UI's own address
    spark_ui_link: str | None = None

    # derived figures -----------------------------------------------------------------
    @property
    def workers(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.kind == "worker"]

    @property
    def running_workers(self) -> int:
        return sum(1 for n in self.workers if n.status == "running")

    @property
    def wanted_workers(self) -> int:
        return sum(self.target_workers.values())

    def _sum(self, key: str) -> float:
        return sum(
            (n.resources.get(key) or 0) for n in self.workers if n.status != "terminated"
        )

    @property
    def cores(self) -> int:
        return int(self._sum("CPU"))

    @property
    def memory(self) -> int:
        return int(self._sum("memory"))

    @property
    def gpus(self) -> int:
        return int(self._sum("GPU"))

    @property
    def cost_per_hour(self) -> float | None:
        """Estimated cost of the nodes that exist, from the prices of their offers."""
        return None if not self.placement else self.placement.get("cost_per_hour")

    @property
    def age_seconds(self) -> float:
        return max(time.time() - self.created_at, 0.0)

    @property
    def idle_timeout_minutes(self) -> float:
        return float(self.config.get("idle_timeout_minutes") or 0)

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["nodes"] = [n.to_dict() for n in self.nodes]
        d["summary"] = {
            "workers": self.running_workers,
            "wanted_workers": self.wanted_workers,
            "cores": self.cores,
            "memory": self.memory,
            "gpus": self.gpus,
            "age_seconds": round(self.age_seconds, 1),
            "cost_per_hour": self.cost_per_hour,
            "currency": (self.placement or {}).get("currency") or "",
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterInfo:
        data = {k: d.get(k) for k in cls.__dataclass_fields__}
        data["nodes"] = [NodeInfo.from_dict(n) for n in d.get("nodes") or []]
        data["target_workers"] = d.get("target_workers") or {}
        data["config"] = d.get("config") or {}
        return cls(**data)


@dataclass
class ConnectInfo:
    """How to reach a cluster's runtime; JSON-serialisable so it can cross REST."""

    scheduler_address: str
    dashboard_link: str | None = None
    http_address: str | None = None  # scheduler's HTTP server (health, check_idle, identity)
    extra: dict[str, Any] = field(default_factory=dict)  # extra["tls"]: mutual TLS only
    #: the client's TLS certificate, key and the cluster CA (PEM texts), in memory only:
    #: never part of ``to_dict`` (what is stored and shown); see ``runtime.tls``
    credentials: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheduler_address": self.scheduler_address,
            "dashboard_link": self.dashboard_link,
            "http_address": self.http_address,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConnectInfo:
        return cls(
            scheduler_address=d["scheduler_address"],
            dashboard_link=d.get("dashboard_link"),
            http_address=d.get("http_address"),
            extra=d.get("extra") or {},
            credentials=d.get("tls_credentials") or None,
        )
