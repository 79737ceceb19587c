"""Where a zone's offers come from: its providers, plus an optional catalog file.

A catalog is JSON ``{"offers": [...], "pools": [...]}`` in the shape of ``Offer`` /
``Pool``.  Sites whose capacity is known but not reported by an API (a rack of machines,
a fixed allocation) describe it there; tests and dry runs use it to stand up zones with
known capacity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..offers import OfferQuery, OfferSet
from ..providers.base import ProviderContext

if TYPE_CHECKING:
    from ..core.settings import CloudTik
    from ..core.store import Store
    from .settings import Placement


def load_catalog(path: str | Path) -> OfferSet:
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"offer_catalog: {p} does not exist", field="offer_catalog") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"offer_catalog: {p} is not valid JSON ({e.msg}, line {e.lineno})",
                          field="offer_catalog") from None
    return OfferSet.from_dict(data)


def zone_offers(store: Store, settings: CloudTik, placement: Placement,
                query: OfferQuery) -> OfferSet:
    """Every offer this zone can place on right now (providers first, then the catalog)."""
    # deferred: start-up (core.config ~24 ms, loads yaml, importlib.metadata)
    from ..core.config import provider_class

    out = OfferSet()
    ctx = ProviderContext(state_dir=store.state_dir, store=store, settings=settings)
    for ptype in placement.zone_providers:
        cls = provider_class(ptype, settings)
        prov = cls({"type": ptype}, query.cluster or "", ctx)
        out.extend(prov.offers(query))
    if placement.offer_catalog:
        out.extend(load_catalog(placement.offer_catalog))
    return out
