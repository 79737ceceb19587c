"""Offer builders shared by the placement tests."""

from __future__ import annotations

from jupyter_cloudtik.placement import Offer, Pool

GIB = 2**30


def host(key: str, cpus: float = 8, memory_gib: float = 32, *, free_cpus: float | None = None,
         free_gib: float | None = None, **kw) -> Offer:
    """A machine-like offer: nodes take what the request asks for."""
    free_cpus = cpus if free_cpus is None else free_cpus
    free_gib = memory_gib if free_gib is None else free_gib
    kw.setdefault("provider", "test")
    return Offer(key=key, total={"CPU": cpus, "memory": memory_gib * GIB},
                 free={"CPU": free_cpus, "memory": free_gib * GIB}, **kw)


def flavor(key: str, cpus: float, memory_gib: float, *, count: int | None = None,
           **kw) -> Offer:
    """A cloud-flavor offer: each node is a whole VM of this size."""
    kw.setdefault("provider", "cloud")
    return Offer(key=key, flavor=kw.pop("flavor", key), size={"CPU": cpus,
                 "memory": memory_gib * GIB}, free={"instances": count},
                 total={"instances": count}, **kw)


__all__ = ["GIB", "Pool", "flavor", "host"]
