"""Filters: which offers *can* take an instance.  Absolute, never a matter of degree.

A filter is one small class::

    class ArmOnly(Filter):
        name = "arm_only"

        def passes(self, offer, state):
            return offer.arch == "aarch64"

registered under the entry point group ``jupyter_cloudtik.placement_filters``.  The engine
runs each active filter once over all offers (``filter_all``; override it for a faster
bulk version), in order, and records how many offers each one eliminated, so a refusal
can say which filter removed what.

Filters whose answer depends on what has been placed so far (capacity) set
``dynamic = True``: the engine checks them again, against the virtually depleted
capacity, before it puts another instance on an offer.  A dynamic filter must be
monotone: once an offer fails it, placing more instances elsewhere cannot make it pass.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.errors import ConfigError
from ..core.units import format_bytes
from ..offers import EPSILON, REQUEST_DIMS, Offer, Request, VirtualState
from .jsonfilter import compile_query, depends_on_depletion

GROUP = "jupyter_cloudtik.placement_filters"
#: applied to every request, whatever it names: capacity is not optional
REQUIRED = ("excluded", "resources", "quota")


class Filter:
    """Base class of placement filters."""

    #: short name (the entry point name)
    name: ClassVar[str] = ""
    #: re-checked against virtual depletion before each placement on an offer
    dynamic: ClassVar[bool] = False

    def prepare(self, request: Request) -> bool:
        """Get ready for one request; return False when the filter has nothing to do."""
        return True

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        raise NotImplementedError

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        """The offers that pass (host tuples, not weights)."""
        passes = self.passes
        return [o for o in offers if passes(o, state)]

    def reason(self, offer: Offer, state: VirtualState) -> str:
        """Why ``offer`` fails, for the explanation of a refusal."""
        return offer.key


class AllHostsFilter(Filter):
    """Every offer passes (Nova's default)."""

    name = "all_hosts"

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return True

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        return list(offers)


def _fmt(dim: str, v: float | None) -> str:
    if v is None:
        return "unlimited"
    if dim in ("memory", "disk"):
        return format_bytes(v)
    return f"{v:g}"


class ResourcesFilter(Filter):
    """The offer has room for one more instance: CPU, memory, disk, GPU, node count.

    For a fixed-size offer (a flavor) the flavor must also be at least as big as the
    request.  Seen from the seed, this is the InstanceTypeFilter.
    """

    name = "resources"
    dynamic = True

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return offer.fits_size(state.request) and state.room(offer) >= 1

    def reason(self, offer: Offer, state: VirtualState) -> str:
        req = state.request
        if not offer.fits_size(req) and offer.size is None:
            big = [d for d in REQUEST_DIMS if (offer.node_max or {}).get(d) is not None
                   and float(offer.node_max[d]) + EPSILON < float(req.resources.get(d) or 0)]
            return (f"{offer.key}: one node cannot have more than the machine ("
                    + ", ".join(f"{d} {_fmt(d, req.resources.get(d))} asked, "
                                f"{_fmt(d, offer.node_max[d])} there" for d in big) + ")")
        if not offer.fits_size(req):
            small = [d for d in REQUEST_DIMS
                     if float((offer.size or {}).get(d) or 0) + EPSILON
                     < float(req.resources.get(d) or 0)]
            return (f"{offer.key}: flavor {offer.flavor or '?'} is too small ("
                    + ", ".join(f"{d} {_fmt(d, (offer.size or {}).get(d, 0))} < "
                                f"{_fmt(d, req.resources.get(d))}" for d in small) + ")")
        cons = state.consumption(offer)
        short = []
        for d, need in cons.items():
            free = state.free(offer, d)
            if need > 0 and free is not None and free + EPSILON < need:
                short.append(f"{d} {_fmt(d, max(free, 0))} free, {_fmt(d, need)} needed")
        return f"{offer.key}: " + ("; ".join(short) or "full")


class QuotaFilter(Filter):
    """The shared pool (quota) the offer draws from has room for one more instance."""

    name = "quota"
    dynamic = True

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return offer.pool is None or state.pool_room(offer) >= 1

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        if not state.pools:
            return list(offers)
        return super().filter_all(offers, state)

    def reason(self, offer: Offer, state: VirtualState) -> str:
        cons = state.consumption(offer)
        short = [f"{d} {_fmt(d, max(state.pool_free(offer.pool, d) or 0, 0))} left"
                 for d, need in cons.items()
                 if need > 0 and (f := state.pool_free(offer.pool or "", d)) is not None
                 and f + EPSILON < need]
        return f"{offer.key}: quota '{offer.pool}' exhausted ({'; '.join(short)})"


class ExcludedFilter(Filter):
    """Offers the request excludes (they just refused this node: failover)."""

    name = "excluded"

    def prepare(self, request: Request) -> bool:
        self.keys = set(request.exclude)
        return bool(self.keys)

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return offer.key not in self.keys

    def reason(self, offer: Offer, state: VirtualState) -> str:
        return f"{offer.key}: refused this node a moment ago"


class AvailabilityZoneFilter(Filter):
    """Only offers in the availability zones the request names."""

    name = "availability_zone"

    def prepare(self, request: Request) -> bool:
        self.zones = set(request.availability_zones or ())
        return bool(self.zones)

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return offer.availability_zone in self.zones

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        zones = self.zones
        return [o for o in offers if o.availability_zone in zones]

    def reason(self, offer: Offer, state: VirtualState) -> str:
        zones = sorted(self.zones)
        wanted = ", ".join(zones) if len(zones) <= 3 else f"the {len(zones)} zones asked for"
        return f"{offer.key}: zone {offer.availability_zone or '-'} not in {wanted}"


class MaxPriceFilter(Filter):
    """Only offers whose price per hour (per instance) is at most the request's cap."""

    name = "max_price"

    def prepare(self, request: Request) -> bool:
        self.cap = request.max_price
        return self.cap is not None

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return offer.price_per_hour <= self.cap + EPSILON

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        cap = self.cap + EPSILON
        return [o for o in offers if o.price_per_hour <= cap]

    def reason(self, offer: Offer, state: VirtualState) -> str:
        return f"{offer.key}: {offer.price_per_hour:g}/h > {self.cap:g}/h"


ATTRIBUTES = ("provider", "region", "availability_zone", "flavor", "arch", "spot")


def _capability_value(offer: Offer, name: str) -> Any:
    if name in offer.capabilities:
        return offer.capabilities[name]
    if name in ATTRIBUTES:
        return getattr(offer, name)
    return None


class CapabilitiesFilter(Filter):
    """Offers whose capabilities (or attributes such as arch, spot) match the request's.

    ``{"arch": "aarch64", "gpu_model": ["A100", "H100"]}``: a list means "one of".
    """

    name = "capabilities"

    def prepare(self, request: Request) -> bool:
        self.wanted = dict(request.capabilities or {})
        return bool(self.wanted)

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        for k, want in self.wanted.items():
            have = _capability_value(offer, k)
            if isinstance(want, list):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True

    def reason(self, offer: Offer, state: VirtualState) -> str:
        bad = [f"{k}={_capability_value(offer, k)!r} (wanted {v!r})"
               for k, v in self.wanted.items() if not self._one(offer, k, v)]
        return f"{offer.key}: " + ", ".join(bad)

    @staticmethod
    def _one(offer: Offer, k: str, want: Any) -> bool:
        have = _capability_value(offer, k)
        return have in want if isinstance(want, list) else have == want


class JsonFilter(Filter):
    """Offers for which the request's JSON query is true (see ``jsonfilter``)."""

    name = "json"

    def prepare(self, request: Request) -> bool:
        if request.query in (None, "", []):
            return False
        self.fn = compile_query(request.query, field="query")
        # a query on free amounts changes as instances are placed: check it every time
        self.dynamic = depends_on_depletion(request.query)
        return True

    def passes(self, offer: Offer, state: VirtualState) -> bool:
        return self.fn(offer, state)

    def filter_all(self, offers: list[Offer], state: VirtualState) -> list[Offer]:
        fn = self.fn
        return [o for o in offers if fn(o, state)]

    def reason(self, offer: Offer, state: VirtualState) -> str:
        return f"{offer.key}: query is false"


BUILTIN: dict[str, type[Filter]] = {
    cls.name: cls
    for cls in (AllHostsFilter, ResourcesFilter, QuotaFilter, ExcludedFilter,
                AvailabilityZoneFilter, MaxPriceFilter, CapabilitiesFilter, JsonFilter)
}


def filter_class(name: str) -> type[Filter]:
    """The class of filter ``name``: built in, or from an installed plugin."""
    if name in BUILTIN:
        return BUILTIN[name]
    # deferred: start-up (core.plugins ~16 ms, loads importlib.metadata, importlib.resources)
    from ..core import plugins

    cls = plugins.load(GROUP, name, field="filters", what="placement filter")
    if not (isinstance(cls, type) and issubclass(cls, Filter)):
        raise ConfigError(f"filters: plugin '{name}' is not a placement Filter class",
                          field="filters", value=name)
    return cls


def available() -> list[str]:
    # deferred: start-up (core.plugins ~16 ms, loads importlib.metadata, importlib.resources)
    from ..core import plugins

    return sorted(set(BUILTIN) | set(plugins.installed(GROUP)))
