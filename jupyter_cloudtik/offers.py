"""What placement works on: offers (where nodes can go) and requests (what is wanted).

An **offer** is one place a provider can put nodes: this machine, a flavor in an
availability zone of a cloud, a Dask Gateway's limits.  It says what it still has free,
what one node placed on it consumes, what it costs per hour, and which instances are
already there.  Offers of one provider that share a quota (a cloud project's cores across
its availability zones) name the same **pool**, so taking from one offer also takes from
the others.

A **request** is N identical instances of one node type, placed as one group.  Everything
the engine needs to know about the user's wishes (filters, a JSON query, weigher
multipliers, spread or pack, spot, a price cap) travels in it, so the same request can be
placed here or sent to a child zone over HTTP as JSON.

Dimensions are ``CPU``, ``memory`` (bytes), ``disk`` (bytes), ``GPU`` and ``instances``
(node count).  A free amount of ``None`` (or a missing key) means "no limit known".
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .core.errors import ConfigError
from .core.units import format_bytes

DIMS = ("CPU", "memory", "disk", "GPU", "instances")
REQUEST_DIMS = ("CPU", "memory", "disk", "GPU")
EPSILON = 1e-9
STRATEGIES = ("spread", "pack")
MAX_COUNT = 10_000  # instances in one request (a cluster's max_workers is 10,000 too)
MAX_AMOUNT = 1e15  # any one resource of a node
MAX_MULTIPLIER = 1e6


@dataclass(slots=True)
class Pool:
    """A quota shared by several offers (e.g. a cloud project's cores and instances)."""

    name: str
    free: dict[str, float | None] = field(default_factory=dict)
    total: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "free": dict(self.free), "total": dict(self.total)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pool:
        return cls(name=str(d["name"]), free=dict(d.get("free") or {}),
                   total=dict(d.get("total") or {}))


@dataclass(slots=True)
class Offer:
    """One place nodes can go, as the provider sees it right now.

    ``size`` is what one node consumes when the offer has a fixed node size (a cloud
    flavor); without it a node consumes what the request asks for (a share of a machine).
    ``node_max`` is the most one node may ask for on an offer without a fixed size (the
    machine's memory and GPUs): a bigger node cannot run there at all, however free the
    offer is.
    ``key`` is unique within a zone and stable over time: claims, recorded failures and
    sealed hints refer to offers by it.
    """

    key: str
    provider: str
    region: str = ""
    availability_zone: str = ""
    flavor: str = ""
    arch: str = "x86_64"
    spot: bool = False
    price_per_hour: float = 0.0
    currency: str = ""
    size: dict[str, float] | None = None
    total: dict[str, float | None] = field(default_factory=dict)
    free: dict[str, float | None] = field(default_factory=dict)
    pool: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    instances: list[dict[str, Any]] = field(default_factory=list)  # {"owner", "cluster"}
    recent_failures: int = 0
    node_config: dict[str, Any] = field(default_factory=dict)  # overlay for create_node
    description: str = ""
    node_max: dict[str, float] | None = None

    # what one node of a request takes ---------------------------------------------------
    def consumption(self, request: Request) -> dict[str, float]:
        base = self.size if self.size is not None else request.resources
        out = {d: float(base.get(d) or 0) for d in REQUEST_DIMS}
        out["instances"] = 1.0
        return out

    def fits_size(self, request: Request) -> bool:
        """A fixed-size offer must be at least as big as the request in every dimension;
        one without a fixed size must not have a ``node_max`` below it."""
        if self.size is None:
            return self.node_max is None or all(
                float(self.node_max[d]) + EPSILON >= float(request.resources.get(d) or 0)
                for d in REQUEST_DIMS if self.node_max.get(d) is not None)
        return all(
            float(self.size.get(d) or 0) + EPSILON >= float(request.resources.get(d) or 0)
            for d in REQUEST_DIMS
        )

    def room(self, request: Request, cons: dict[str, float] | None = None) -> float:
        """How many nodes of ``request`` still fit on the offer itself (pools aside)."""
        cons = cons or self.consumption(request)
        return room_for(self.free, cons)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Offer:
        if not isinstance(d, dict) or not d.get("key") or not d.get("provider"):
            raise ConfigError("offer: needs at least 'key' and 'provider'", field="offer")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**copy.deepcopy(known))

    def public(self) -> dict[str, Any]:
        """What may leave the zone: no key, no host names, no node config."""
        return {"provider": self.provider, "price_per_hour": self.price_per_hour,
                "currency": self.currency, "spot": self.spot}


def room_for(free: dict[str, float | None], cons: dict[str, float]) -> float:
    """Whole nodes consuming ``cons`` that fit in ``free`` (``math.inf`` without limits)."""
    room = math.inf
    for d, need in cons.items():
        if need <= 0:
            continue
        have = free.get(d)
        if have is None:
            continue
        room = min(room, _whole_fits(have, need))
    return max(room, 0)


def _whole_fits(have: float, need: float) -> float:
    """floor(have / need), infinite when the quotient is beyond counting."""
    q = (have + EPSILON) / need
    return math.inf if q > 1e15 else math.floor(q)


# a request's option -> the filter that acts on it
WISH_FILTERS = {"availability_zones": "availability_zone", "capabilities": "capabilities",
                "max_price": "max_price", "query": "json"}


@dataclass
class Request:
    """N identical instances of one node type, with the user's placement wishes."""

    count: int
    resources: dict[str, float] = field(default_factory=dict)
    node_type: str = ""
    user: str = ""
    cluster: str = ""
    filters: list[str] | None = None  # None: the configured default set
    query: Any = None  # JSON filter query (list or JSON text)
    weighers: dict[str, float] | None = None  # multiplier overrides; 0 switches one off
    strategy: str = "spread"
    prefer_spot: bool = False
    max_price: float | None = None
    availability_zones: list[str] | None = None
    capabilities: dict[str, Any] | None = None
    exclude: list[str] = field(default_factory=list)  # offer keys not to use (failover)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not (
                1 <= self.count <= MAX_COUNT):
            raise ConfigError(f"count: {self.count!r} is not a whole number of instances "
                              f"from 1 to {MAX_COUNT}", field="count", value=self.count)
        if not isinstance(self.resources, dict):
            raise ConfigError("resources: must be a mapping of CPU, memory, disk, GPU",
                              field="resources")
        for k, v in self.resources.items():
            if k not in REQUEST_DIMS:
                raise ConfigError(f"resources.{k}: unknown resource (allowed: "
                                  f"{', '.join(REQUEST_DIMS)})", field=f"resources.{k}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    0 <= v <= MAX_AMOUNT):
                raise ConfigError(f"resources.{k}: {v!r} is not a number from 0 to "
                                  f"{MAX_AMOUNT:g}", field=f"resources.{k}", value=v)
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy: {self.strategy!r} is not one of "
                              f"{', '.join(STRATEGIES)}", field="strategy",
                              value=self.strategy)
        if self.max_price is not None and (
            isinstance(self.max_price, bool) or not isinstance(self.max_price, int | float)
            or self.max_price < 0
        ):
            raise ConfigError(f"max_price: {self.max_price!r} is not a price >= 0",
                              field="max_price", value=self.max_price)
        if self.filters is not None and (
            not isinstance(self.filters, list)
            or not all(isinstance(f, str) for f in self.filters)
        ):
            raise ConfigError("filters: must be a list of filter names", field="filters")
        if self.weighers is not None:
            if not isinstance(self.weighers, dict):
                raise ConfigError("weighers: must map weigher names to multipliers",
                                  field="weighers")
            for k, v in self.weighers.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not (
                        -MAX_MULTIPLIER <= v <= MAX_MULTIPLIER):
                    raise ConfigError(f"weighers.{k}: {v!r} is not a multiplier from "
                                      f"{-MAX_MULTIPLIER:g} to {MAX_MULTIPLIER:g}",
                                      field=f"weighers.{k}", value=v)
        if self.availability_zones is not None and (
            not isinstance(self.availability_zones, list)
            or not all(isinstance(z, str) for z in self.availability_zones)
        ):
            raise ConfigError("availability_zones: must be a list of zone names",
                              field="availability_zones")
        if self.capabilities is not None and not isinstance(self.capabilities, dict):
            raise ConfigError("capabilities: must be a mapping of capability -> value",
                              field="capabilities")
        if self.filters is not None:
            # a wish whose filter the list leaves out would be ignored without a word
            for option, name in WISH_FILTERS.items():
                value = getattr(self, option)
                if value not in (None, [], {}) and name not in self.filters:
                    raise ConfigError(
                        f"filters: {self.filters!r} leaves out '{name}', so {option} "
                        f"({value!r}) would be ignored; add '{name}' to filters or leave "
                        "filters out (the default set has every filter)",
                        field="filters", value=self.filters)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Request:
        """A request from JSON (REST, zones); every problem names its field."""
        if not isinstance(d, dict):
            raise ConfigError("request: must be a JSON object", field="request")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"request: unknown field(s) {', '.join(map(repr, unknown))} (allowed: "
                f"{', '.join(cls.__dataclass_fields__)})", field=unknown[0] or "request")
        if "count" not in d:
            raise ConfigError("count: missing (how many instances to place)", field="count")
        d = {k: copy.deepcopy(v) for k, v in d.items()}
        if isinstance(d["count"], float) and d["count"].is_integer():
            d["count"] = int(d["count"])  # JSON has one number type
        if d.get("exclude") is None:
            d.pop("exclude", None)
        return cls(**d)

    def with_count(self, count: int, exclude: list[str] | None = None) -> Request:
        d = self.to_dict()
        d["count"] = count
        if exclude is not None:
            d["exclude"] = sorted(set(self.exclude) | set(exclude))
        return Request(**d)

    def digest(self) -> str:
        """Identity of the instance shape and wishes (not the count): binds sealed hints."""
        d = self.to_dict()
        d.pop("count", None)
        d.pop("exclude", None)
        text = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        parts = [f"{self.resources.get('CPU', 0):g} CPU"]
        if self.resources.get("memory"):
            parts.append(format_bytes(self.resources["memory"]))
        if self.resources.get("GPU"):
            parts.append(f"{self.resources['GPU']:g} GPU")
        if self.resources.get("disk"):
            parts.append(f"{format_bytes(self.resources['disk'])} disk")
        what = self.node_type or "instance"
        return f"{self.count} x {what} ({', '.join(parts)})"


@dataclass
class Choice:
    """Where one instance of a request goes, and where it could go instead."""

    index: int
    offer: str
    cost: float
    alternates: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Elimination:
    """What one filter removed from the candidates, with a few examples and reasons."""

    filter: str
    eliminated: int
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Explanation:
    """Why a request was placed where it was, or why it could not be placed."""

    offers: int = 0
    eliminations: list[Elimination] = field(default_factory=list)
    candidates: int = 0
    room: float = 0  # instances the candidates could hold before placing
    placed: int = 0
    wanted: int = 0
    exhausted: list[str] = field(default_factory=list)  # offers that ran out while placing
    weighers: dict[str, float] = field(default_factory=dict)  # active multipliers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["room"] = None if math.isinf(self.room) else self.room
        return d

    def text(self) -> str:
        parts = [f"{self.offers} offer(s) considered"]
        for e in self.eliminations:
            if e.eliminated:
                ex = f" (e.g. {'; '.join(e.examples)})" if e.examples else ""
                parts.append(f"filter '{e.filter}' eliminated {e.eliminated}{ex}")
        room = "no limit" if math.isinf(self.room) else f"{self.room:g}"
        parts.append(f"{self.candidates} candidate(s) left with room for {room} instance(s)")
        if self.placed < self.wanted:
            parts.append(f"only {self.placed} of {self.wanted} could be placed")
        if self.exhausted:
            parts.append("ran out while placing: " + ", ".join(self.exhausted[:5]))
        return "; ".join(parts)


@dataclass
class Plan:
    """The outcome of placing one request: a choice per instance, nothing claimed yet."""

    request: Request
    choices: list[Choice]
    explanation: Explanation
    offers: dict[str, Offer]  # the chosen offers (and alternates), by key

    @property
    def total_cost(self) -> float:
        return sum(c.cost for c in self.choices)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.choices:
            out[c.offer] = out.get(c.offer, 0) + 1
        return out

    @property
    def price_per_hour(self) -> float:
        return sum(self.offers[c.offer].price_per_hour for c in self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.to_dict(),
            "choices": [c.to_dict() for c in self.choices],
            "counts": self.counts(),
            "price_per_hour": self.price_per_hour,
            "explanation": self.explanation.to_dict(),
        }


class VirtualState:
    """Capacity as it will be once the instances placed so far exist (virtual depletion).

    The engine places instance after instance of one request; filters that depend on
    capacity (``dynamic`` filters) and weighers that depend on how full an offer is read
    it from here, so the tenth instance sees what the first nine took.
    """

    __slots__ = ("_cons", "_req_cons", "placed", "pool_used", "pools", "request")

    def __init__(self, request: Request, pools: dict[str, Pool] | None = None) -> None:
        self.request = request
        self.pools = pools or {}
        self.placed: dict[str, int] = {}
        self.pool_used: dict[str, dict[str, float]] = {}
        self._cons: dict[str, dict[str, float]] = {}
        cons = {d: float(request.resources.get(d) or 0) for d in REQUEST_DIMS}
        cons["instances"] = 1.0
        self._req_cons = cons

    def consumption(self, offer: Offer) -> dict[str, float]:
        """What one instance of the request takes from ``offer`` (do not modify)."""
        if offer.size is None:
            return self._req_cons
        cons = self._cons.get(offer.key)
        if cons is None:
            cons = self._cons[offer.key] = offer.consumption(self.request)
        return cons

    def placed_on(self, offer: Offer) -> int:
        return self.placed.get(offer.key, 0)

    def free(self, offer: Offer, dim: str) -> float | None:
        have = offer.free.get(dim)
        if have is None:
            return None
        n = self.placed.get(offer.key)
        if not n:
            return have
        return have - n * self.consumption(offer).get(dim, 0.0)

    def room(self, offer: Offer) -> float:
        """Instances of the request that still fit on the offer itself."""
        n = self.placed.get(offer.key, 0)
        free = offer.free
        room = math.inf
        for d, need in self.consumption(offer).items():
            if need <= 0:
                continue
            have = free.get(d)
            if have is None:
                continue
            r = _whole_fits(have - n * need, need)
            if r < room:
                room = r
        return room if room > 0 else 0

    def pool_free(self, name: str, dim: str) -> float | None:
        pool = self.pools.get(name)
        if pool is None:
            return None
        have = pool.free.get(dim)
        if have is None:
            return None
        return have - self.pool_used.get(name, {}).get(dim, 0.0)

    def pool_room(self, offer: Offer) -> float:
        """Instances of the request that still fit in the offer's shared pool."""
        name = offer.pool
        if name is None:
            return math.inf
        pool = self.pools.get(name)
        if pool is None:
            return math.inf
        used = self.pool_used.get(name)
        free = pool.free
        room = math.inf
        for d, need in self.consumption(offer).items():
            if need <= 0:
                continue
            have = free.get(d)
            if have is None:
                continue
            if used:
                have -= used.get(d, 0.0)
            r = _whole_fits(have, need)
            if r < room:
                room = r
        return room if room > 0 else 0

    def place(self, offer: Offer) -> None:
        self.placed[offer.key] = self.placed.get(offer.key, 0) + 1
        if offer.pool is not None and offer.pool in self.pools:
            used = self.pool_used.setdefault(offer.pool, {})
            for d, v in self.consumption(offer).items():
                used[d] = used.get(d, 0.0) + v


@dataclass
class OfferQuery:
    """What a provider is asked for offers about (it may use it to narrow its answer)."""

    cluster: str = ""
    user: str = ""
    node_types: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> resources


@dataclass
class OfferSet:
    """A provider's answer: its offers and the pools (quotas) they share."""

    offers: list[Offer] = field(default_factory=list)
    pools: dict[str, Pool] = field(default_factory=dict)

    def extend(self, other: OfferSet) -> None:
        self.offers.extend(other.offers)
        self.pools.update(other.pools)

    def to_dict(self) -> dict[str, Any]:
        return {"offers": [o.to_dict() for o in self.offers],
                "pools": [p.to_dict() for p in self.pools.values()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OfferSet:
        if not isinstance(d, dict):
            raise ConfigError("offers: must be an object with 'offers' and 'pools'",
                              field="offers")
        offers = [Offer.from_dict(o) for o in d.get("offers") or []]
        pools = {p["name"]: Pool.from_dict(p) for p in d.get("pools") or []}
        keys = [o.key for o in offers]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ConfigError(f"offers: keys must be unique; repeated: {', '.join(dup)}",
                              field="offers")
        return cls(offers, pools)
