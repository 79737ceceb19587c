"""Weighers: how *well* an offer suits an instance.  Relative, and lower cost wins.

A weigher is one small class::

    class PreferEurope(Weigher):
        name = "prefer_europe"

        def weigh(self, offer, placed, state):
            return 0.0 if offer.region.startswith("eu-") else 1.0

registered under the entry point group ``jupyter_cloudtik.placement_weighers``.  Raw
weights have any scale; the engine normalises each weigher over the request's candidate
set to [0, 1] (all equal -> 0: a weigher that cannot tell candidates apart does not
count) and the cost of putting an instance on an offer is Σ multiplier x normalised
weight.  Multipliers come from ``c.Placement.weighers`` and the request; 0 switches a
weigher off and a negative one turns a preference around.

Weighers whose answer depends on how many instances of this request an offer already
took (free space, the user's instances there) set ``dynamic = True``; they must be
monotone in ``placed``.  The candidate set they are normalised over is every slot the
request could use: (offer, first instance) to (offer, last instance that fits), so the
scale is fixed for the whole request and costs of different offers stay comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..core.errors import ConfigError
from ..offers import Offer, Request, VirtualState

GROUP = "jupyter_cloudtik.placement_weighers"


class Weigher:
    """Base class of placement weighers."""

    name: ClassVar[str] = ""
    dynamic: ClassVar[bool] = False
    #: fixed bounds of the raw weight; None: the candidate set's min / max
    minval: ClassVar[float | None] = None
    maxval: ClassVar[float | None] = None

    def multiplier(self, request: Request, configured: float) -> float:
        """The multiplier for this request (built-ins use it to follow the strategy)."""
        return configured

    def prepare(self, request: Request) -> None:
        """Get ready for one request (precompute what does not depend on the offer)."""

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        """Raw weight of putting instance number ``placed`` (0-based) of the request on
        ``offer``; lower is better."""
        raise NotImplementedError

    def weigh_all(self, offers: Sequence[Offer], state: VirtualState) -> list[float]:
        weigh = self.weigh
        return [weigh(o, 0, state) for o in offers]


def free_fraction(offer: Offer, placed: int, state: VirtualState) -> float:
    """Share of the tightest limited resource still free once ``placed`` instances of the
    request sit on the offer; for an offer without known totals, 1 / (1 + placed)."""
    cons = state.consumption(offer)
    best = None
    for d, need in cons.items():
        if need <= 0:
            continue
        total = offer.total.get(d)
        free = offer.free.get(d)
        if not total or free is None:
            continue
        frac = (free - placed * need) / total
        if best is None or frac < best:
            best = frac
    return 1.0 / (1 + placed) if best is None else best


class CostWeigher(Weigher):
    """Cheaper per hour is better."""

    name = "cost"

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        return offer.price_per_hour

    def weigh_all(self, offers: Sequence[Offer], state: VirtualState) -> list[float]:
        return [o.price_per_hour for o in offers]


class SpreadWeigher(Weigher):
    """More free room is better: instances spread over offers (strategy 'spread')."""

    name = "spread"
    dynamic = True

    def multiplier(self, request: Request, configured: float) -> float:
        return configured if request.strategy == "spread" else 0.0

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        return -free_fraction(offer, placed, state)


class PackWeigher(Weigher):
    """Less free room is better: fill one offer before the next (strategy 'pack')."""

    name = "pack"
    dynamic = True

    def multiplier(self, request: Request, configured: float) -> float:
        return configured if request.strategy == "pack" else 0.0

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        return free_fraction(offer, placed, state)


class SpotWeigher(Weigher):
    """Spot (preemptible, cheaper) capacity is better, when the request prefers it."""

    name = "spot"

    def multiplier(self, request: Request, configured: float) -> float:
        return configured if request.prefer_spot else 0.0

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        return 0.0 if offer.spot else 1.0


class AntiAffinityWeigher(Weigher):
    """Offers without this user's instances are better (the seed's rule: a machine
    failure should not take all of a user's work)."""

    name = "anti_affinity"
    dynamic = True

    def prepare(self, request: Request) -> None:
        self.user = request.user
        self.cluster = request.cluster

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        mine = sum(1 for i in offer.instances
                   if (self.user and i.get("owner") == self.user)
                   or (self.cluster and i.get("cluster") == self.cluster))
        return float(mine + placed)


class RecentFailuresWeigher(Weigher):
    """Offers that just refused a node (capacity, quota) rank lower for a while."""

    name = "recent_failures"

    def weigh(self, offer: Offer, placed: int, state: VirtualState) -> float:
        return float(offer.recent_failures)

    def weigh_all(self, offers: Sequence[Offer], state: VirtualState) -> list[float]:
        return [float(o.recent_failures) for o in offers]


BUILTIN: dict[str, type[Weigher]] = {
    cls.name: cls
    for cls in (CostWeigher, SpreadWeigher, PackWeigher, SpotWeigher, AntiAffinityWeigher,
                RecentFailuresWeigher)
}


def weigher_class(name: str) -> type[Weigher]:
    if name in BUILTIN:
        return BUILTIN[name]
    # deferred: start-up (core.plugins ~16 ms, loads importlib.metadata, importlib.resources)
    from ..core import plugins

    cls = plugins.load(GROUP, name, field="weighers", what="placement weigher")
    if not (isinstance(cls, type) and issubclass(cls, Weigher)):
        raise ConfigError(f"weighers: plugin '{name}' is not a placement Weigher class",
                          field="weighers", value=name)
    return cls


def available() -> list[str]:
    # deferred: start-up (core.plugins ~16 ms, loads importlib.metadata, importlib.resources)
    from ..core import plugins

    return sorted(set(BUILTIN) | set(plugins.installed(GROUP)))


def normalize(values: Sequence[float], lo: float | None = None,
              hi: float | None = None) -> list[float]:
    """Scale to [0, 1] over the set (or fixed bounds); all equal -> all 0."""
    if not values:
        return []
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    if span <= 0:
        return [0.0] * len(values)
    return [(v - lo) / span for v in values]
