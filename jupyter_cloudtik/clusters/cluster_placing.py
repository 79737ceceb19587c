"""The hand-off to placement (``jupyter_cloudtik.placement``): every missing node placed
at once and held as claims under a reservation, and the events that say where the
nodes went and what they cost (or that a choice failed over to the next)."""

from __future__ import annotations

from typing import Any

from ..core.operations import OperationContext
from ..providers.base import NodeProvider


class ClusterPlacing:
    """Placing a cluster's nodes (a part of ``ClusterManager``)."""

    def _reserve(self, prov: NodeProvider, cfg: dict[str, Any], target: dict[str, int]):
        """Place every missing node at once and hold the choice as claims (placement/)."""
        return self.placement.reserve(prov, cfg, self._missing(prov, cfg, target), self.user)

    def _placement_event(self, op_id: str, reservation) -> None:
        if reservation is None:
            return
        where: dict[str, int] = {}
        for c in reservation.claims:
            spot = "/".join(x for x in (c.provider, c.availability_zone, c.flavor) if x)
            key = f"{c.node_type} on {spot}"
            where[key] = where.get(key, 0) + 1
        unit = f" {reservation.currency}" if reservation.currency else ""
        cost = f"{reservation.price_per_hour:.3f}{unit}"
        self.ops.emit(
            op_id, "placement",
            f"placed {reservation.instances} node(s) at once ("
            + ", ".join(f"{n} x {k}" for k, n in where.items())
            + f"); reservation {reservation.id}; estimated cost {cost} per hour",
            0.01, data={"reservation": reservation.id,
                        "price_per_hour": reservation.price_per_hour,
                        "currency": reservation.currency})

    def _failover_note(self, ctx: OperationContext, fraction: float):
        return lambda message: ctx.progress("placement", message, fraction, level="warning")
