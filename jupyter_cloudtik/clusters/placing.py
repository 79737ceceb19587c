"""Placement for the cluster manager: reserve a cluster's nodes, create them where placed,
fail over when the cloud refuses.

``ClusterManager`` calls three things and nothing else:

* ``reserve(prov, cfg, missing, user)`` before the cluster is recorded: every missing node
  of every type is placed at once (head and workers, one reservation), or the ``up`` is
  refused with the engine's explanation and nothing is started;
* ``create_nodes(...)`` instead of ``prov.create_node``: nodes are created per chosen offer
  (the offer's ``node_config`` -- flavor, availability zone -- is merged in), claims are
  bound to the node ids, and an offer that refuses (``NodeLaunchError``: capacity, quota)
  is recorded as failed while its nodes are placed again elsewhere;
* ``node_placement`` / ``summary`` for the views: each node's provider, zone, flavor and
  price, the reservation id, and the cluster's cost per hour.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from ..core.errors import CapacityError, ConfigError, NodeLaunchError
from ..core.store import Store
from ..offers import WISH_FILTERS, OfferQuery, Request
from ..placement.engine import PlacementError
from ..placement.jsonfilter import compile_query
from ..placement.reservations import Reservation, Reservations
from ..placement.settings import Placement
from ..providers.base import NodeProvider

Progress = Callable[[str], None]
OPTION_KEYS = ("filters", "query", "weighers", "strategy", "prefer_spot", "max_price",
               "availability_zones", "capabilities")


class ClusterPlacement:
    def __init__(self, store: Store, settings) -> None:
        self.settings = Placement(parent=settings)
        self.reservations = Reservations(store, self.settings)

    # requests ----------------------------------------------------------------------------
    def request_for(self, cfg: dict[str, Any], node_type: str, count: int, user: str,
                    exclude: list[str] | None = None) -> Request:
        t = cfg["available_node_types"][node_type]
        own = {**(cfg.get("placement") or {}), **(t.get("placement") or {})}
        defaults = _provider_options(cfg, t)
        options = {**defaults, **own}
        if isinstance(own.get("filters"), list):
            # the provider's own wishes (the node type's flavor, say) keep their filter
            # when the config lists filters; the config's wishes must list theirs
            options["filters"] = [*own["filters"], *(
                WISH_FILTERS[k] for k in defaults if k in WISH_FILTERS and k not in own
                and WISH_FILTERS[k] not in own["filters"])]
        res = {k: v for k, v in (t.get("resources") or {}).items()
               if k in ("CPU", "memory", "disk", "GPU")}
        try:
            req = Request(count=count, resources=res, node_type=node_type, user=user,
                          cluster=cfg["cluster_name"], exclude=list(exclude or []),
                          **{k: copy.deepcopy(options[k]) for k in OPTION_KEYS
                             if k in options})
            if req.query not in (None, "", []):
                compile_query(req.query)  # a bad query is a config error, before anything
            return req
        except ConfigError as e:
            raise ConfigError(f"placement.{e.message}", field=f"placement.{e.field}") from None

    def _query(self, cfg: dict[str, Any], user: str) -> OfferQuery:
        return OfferQuery(cluster=cfg["cluster_name"], user=user, node_types={
            n: dict(t.get("resources") or {}) for n, t in cfg["available_node_types"].items()})

    # reserving ----------------------------------------------------------------------------
    def reserve(self, prov: NodeProvider, cfg: dict[str, Any], missing: dict[str, int],
                user: str) -> Reservation | None:
        """All missing nodes of the cluster, placed at once, or a ``CapacityError``."""
        wanted = [(t, n) for t, n in missing.items() if n > 0]
        if not wanted:
            return None
        requests = [self.request_for(cfg, t, n, user) for t, n in wanted]
        snapshot = time.time()
        offer_set = prov.offers(self._query(cfg, user))
        try:
            return self.reservations.reserve(
                offer_set.offers, requests, offer_set.pools, cluster=cfg["cluster_name"],
                user=user, snapshot_at=snapshot)
        except PlacementError as e:
            raise CapacityError(
                f"not enough capacity for cluster '{cfg['cluster_name']}': "
                f"{e.message.removesuffix(' Nothing was reserved.')} Ask for fewer workers "
                "or smaller resources; nothing was started.", field="workers") from None

    def finish(self, rid: str | None) -> None:
        if rid:
            self.reservations.finish(rid, "not needed by the operation")

    # creating ---------------------------------------------------------------------------
    def create_nodes(self, prov: NodeProvider, cfg: dict[str, Any], rid: str | None,
                     node_type: str, node_config: dict[str, Any], tags: dict[str, str],
                     count: int, user: str,
                     progress: Progress | None = None) -> tuple[list[str], str]:
        """Create ``count`` nodes of ``node_type`` on their claims; returns (node ids,
        reservation id).  Claims missing (repairs, failover) are placed on the spot."""
        progress = progress or (lambda _m: None)
        name = cfg["cluster_name"]
        created: list[str] = []
        failed: list[str] = []
        errors: list[str] = []
        while len(created) < count:
            need = count - len(created)
            claims = self.reservations.unbound(rid, node_type)[:need] if rid else []
            if len(claims) < need:
                req = self.request_for(cfg, node_type, need - len(claims), user, failed)
                snapshot = time.time()
                offer_set = prov.offers(self._query(cfg, user))
                try:
                    res = self.reservations.reserve(
                        offer_set.offers, [req], offer_set.pools, cluster=name, user=user,
                        snapshot_at=snapshot, reservation_id=rid)
                except PlacementError as e:
                    why = f"; refused before: {'; '.join(errors)}" if errors else ""
                    raise NodeLaunchError(
                        f"no capacity left for {req.describe()} of cluster '{name}': "
                        f"{e.explanation.text() if e.explanation else e.message}{why}"
                    ) from None
                rid = res.id
                claims = self.reservations.unbound(rid, node_type)[:need]
            groups: dict[str, list[dict[str, Any]]] = {}
            for c in claims:
                groups.setdefault(c["offer"], []).append(c)
            for offer_key, group in groups.items():
                merged = _merge(node_config, group[0]["node_config"])
                try:
                    made = list(prov.create_node(merged, tags, len(group)))
                except NodeLaunchError as e:
                    self.reservations.fail(rid, [c["index"] for c in group], e.code,
                                           e.message)
                    failed.append(offer_key)
                    errors.append(f"{offer_key}: {e.message}")
                    if len(failed) > self.settings.max_failover:
                        raise NodeLaunchError(
                            f"{len(failed)} offers refused nodes of type '{node_type}': "
                            + "; ".join(errors), code=e.code) from None
                    progress(f"{offer_key} refused {len(group)} node(s) ({e.message}); "
                             "placing them elsewhere")
                    continue
                pairs = list(zip([c["index"] for c in group], made, strict=False))
                self.reservations.bind(rid, pairs)
                if len(made) < len(group):  # a partial create: the rest is placed again
                    self.reservations.fail(rid, [c["index"] for c in group[len(made):]],
                                           None, "the provider created fewer nodes")
                created.extend(made)
        return created, rid  # type: ignore[return-value]

    # views ------------------------------------------------------------------------------
    def node_placement(self, cluster: str, node_id: str) -> dict[str, Any] | None:
        return self.reservations.node_placement(cluster, node_id)

    def summary(self, cluster: str) -> dict[str, Any] | None:
        return self.reservations.cluster_summary(cluster)

    def release_nodes(self, cluster: str, node_ids: list[str] | None = None) -> None:
        self.reservations.release_nodes(cluster, node_ids)

    def archive_cluster(self, cluster: str, archived: str, keep: str | None = None) -> None:
        """File the cluster's past reservations and claims under ``archived`` (its name
        passed to another owner, whose cluster summary must not show them); ``keep`` is
        the new owner's reservation, already made."""
        with self.reservations.store.transaction() as conn:
            conn.execute("UPDATE placement_reservations SET cluster = ? WHERE cluster = ?"
                         " AND id IS NOT ?", (archived, cluster, keep))
            conn.execute("UPDATE placement_claims SET cluster = ? WHERE cluster = ?"
                         " AND reservation_id IS NOT ?", (archived, cluster, keep))


def _provider_options(cfg: dict[str, Any], node_type: dict[str, Any]) -> dict[str, Any]:
    """The provider's default placement options for a node type (its flavor, ...)."""
    # deferred: start-up (core.config ~24 ms, loads yaml, importlib.metadata)
    from ..core.config import provider_class

    provider = cfg.get("provider") or {}
    if not provider.get("type"):
        return {}
    try:
        cls = provider_class(provider["type"])
    except ConfigError:
        return {}
    return dict(cls.placement_options(provider, node_type) or {})


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (overlay or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
