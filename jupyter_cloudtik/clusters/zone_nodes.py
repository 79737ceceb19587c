"""The nodes a zone creates for a parent zone's ``boot``, under its reservation id.

Placement (``placement/zones.py``) opens the sealed hints and claims the capacity; it does
not create anything.  This module is the zone's own core doing that: for each claim it
asks the claim's provider (found by entry point, with this zone's store and settings) to
``create_node`` with the claim's node config merged over the parent's, binds the claim to
the node, and tags the node with the reservation id.  Afterwards it reports the nodes and
their states (``servers``) and ends them (``terminate``), as Nova's ``GET
/servers?reservation_id=`` and ``DELETE`` do in the seed.

Claims on offers that no installed provider creates (a static ``offer_catalog`` rack whose
machines the site brings up itself) stay claimed and are reported as such, with no node.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from ..core.config import provider_class
from ..core.errors import ConfigError, NodeLaunchError
from ..providers.base import (
    NODE_KIND_WORKER,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    NodeProvider,
    ProviderContext,
)
from .placing import _merge  # node configs merge as a cluster's do

if TYPE_CHECKING:
    from ..core.settings import CloudTik
    from ..core.store import Store

TAG_RESERVATION = "cloudtik-reservation"


def node_cluster_name(rid: str) -> str:
    """The provider-side cluster name of a booted reservation: unique per reservation, so
    the nodes of two parents' boots are never mixed."""
    return f"zone-{rid}"


class ZoneNodes:
    """Creates, lists and ends the nodes of reservations booted in this zone."""

    def __init__(self, store: Store, settings: CloudTik) -> None:
        self.store = store
        self.settings = settings
        self.ctx = ProviderContext(state_dir=store.state_dir, store=store, settings=settings)

    def _provider(self, ptype: str, rid: str) -> NodeProvider | None:
        try:
            cls = provider_class(ptype, self.settings)
        except ConfigError:
            return None  # not a provider here (a static catalog offer): nothing to create
        return cls({"type": ptype}, node_cluster_name(rid), self.ctx)

    def create(self, reservations, rid: str, request,
               node_config: dict[str, Any]) -> list[str]:
        """Create a node for every unbound claim of ``rid`` (all or none: a refusal ends
        the nodes made so far and raises ``NodeLaunchError``).  Returns the node ids."""
        node_type = request.node_type
        node_config = copy.deepcopy(node_config)
        # the provider counts a node's declared resources against its capacity
        runtime = node_config.setdefault("runtime", {})
        if isinstance(runtime, dict):
            runtime.setdefault("resources", dict(request.resources))
        made: list[tuple[NodeProvider, str]] = []
        groups: dict[str, list[dict[str, Any]]] = {}
        claims = {c.index: c for c in reservations.get(rid).claims}
        for c in reservations.unbound(rid, node_type):
            groups.setdefault(claims[c["index"]].provider, []).append(c)
        kind = ((node_config.get("runtime") or {}).get("role")
                or node_config.get("kind") or NODE_KIND_WORKER)
        tags = {TAG_NODE_KIND: str(kind), TAG_NODE_TYPE: node_type or str(kind),
                TAG_RESERVATION: rid}
        try:
            for ptype, group in groups.items():
                prov = self._provider(ptype, rid)
                if prov is None:
                    continue
                for c in group:
                    merged = _merge(node_config, c["node_config"])
                    try:
                        ids = list(prov.create_node(merged, tags, 1))
                    except NodeLaunchError as e:
                        reservations.fail(rid, [c["index"]], e.code, e.message)
                        raise
                    except (KeyError, TypeError, ValueError) as e:
                        # a node_config this provider cannot use: the parent's input
                        reservations.fail(rid, [c["index"]], "bad_node_config", str(e))
                        raise NodeLaunchError(
                            f"node_config: the '{ptype}' provider cannot create a node "
                            f"from it ({type(e).__name__}: {e})") from None
                    made.extend((prov, n) for n in ids)
                    reservations.bind(rid, list(zip([c["index"]], ids, strict=False)))
        except BaseException:
            for prov, node_id in made:
                prov.terminate_node(node_id)
            raise
        return [n for _p, n in made]

    def servers(self, reservations, rid: str) -> list[dict[str, Any]]:
        """Each claim of ``rid`` with its node and the provider's view of its state."""
        out = []
        providers: dict[str, NodeProvider | None] = {}
        for c in reservations.get(rid).claims:
            state = c.state
            if c.node_id:
                if c.provider not in providers:
                    providers[c.provider] = self._provider(c.provider, rid)
                prov = providers[c.provider]
                if prov is not None:
                    state = ("running" if prov.is_running(c.node_id)
                             else "terminated" if prov.is_terminated(c.node_id)
                             else "pending")
            out.append({"index": c.index, "node_type": c.node_type, "node_id": c.node_id,
                        "state": state})
        return out

    def terminate(self, reservations, rid: str) -> int:
        """End every node of ``rid`` (idempotent); returns how many were asked to end."""
        by_provider: dict[str, list[str]] = {}
        for c in reservations.get(rid).claims:
            if c.node_id:
                by_provider.setdefault(c.provider, []).append(c.node_id)
        n = 0
        for ptype, ids in by_provider.items():
            prov = self._provider(ptype, rid)
            if prov is not None:
                prov.terminate_nodes(ids)
                n += len(ids)
        return n

