"""What the region offers: flavors x availability zones, with resources, prices and quota.

``offers(clients, prices)`` is the one function placement needs from this provider: every
(flavor, zone) pair the cloud sells right now, with vCPUs, memory, an hourly price from a
configurable price table, and how many more such servers the account's quota allows.
Flavor names also tell their size (``s6.xlarge.2``: 4 vCPUs, 2 GiB per vCPU), which
``flavor_resources`` uses when no API is at hand (config checks before anything runs).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .clients import Clients

# Illustrative on-demand prices (USD per hour) of common flavors; override with the
# provider's ``prices`` option for your region and contract.
DEFAULT_PRICES = {
    "s6.small.1": 0.012, "s6.medium.2": 0.024, "s6.large.2": 0.048, "s6.xlarge.2": 0.096,
    "s6.2xlarge.2": 0.192, "c7.large.2": 0.066, "c7.xlarge.2": 0.132, "c7.2xlarge.4": 0.352,
    "m7.xlarge.8": 0.268,
}
SPOT_DISCOUNT = 0.3  # spot servers cost about this fraction of on-demand ones

_SIZE = re.compile(r"^[a-z0-9]+\.(small|medium|large|xlarge|(\d+)xlarge)\.(\d+)$")


def flavor_resources(flavor: str) -> dict[str, int] | None:
    """{"CPU", "memory"} from a flavor name such as ``s6.large.2``; None if not parseable."""
    m = _SIZE.match(flavor)
    if not m:
        return None
    size, mult, ratio = m.group(1), m.group(2), int(m.group(3))
    vcpus = {"small": 1, "medium": 1, "large": 2, "xlarge": 4}.get(size) or 4 * int(mult)
    return {"CPU": vcpus, "memory": vcpus * ratio * 2**30}


@dataclass
class Offer:
    flavor: str
    zone: str
    vcpus: int
    memory: int          # bytes
    price_per_hour: float | None
    spot: bool
    available: bool      # sold in this zone now
    quota_nodes: int     # how many more such servers the quota allows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def zone_status(spec: str | None) -> dict[str, str]:
    """'cn-north-4a(normal),cn-north-4b(sellout)' -> {zone: status}."""
    out = {}
    for part in (spec or "").split(","):
        m = re.match(r"^\s*([^()]+)\((\w+)\)\s*$", part)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def list_flavors(clients: Clients, zone: str | None = None) -> list[Any]:
    from huaweicloudsdkecs.v2 import ListFlavorsRequest

    return clients.call("ecs", "list_flavors",
                        ListFlavorsRequest(availability_zone=zone)).flavors or []


def list_zones(clients: Clients) -> list[str]:
    from huaweicloudsdkecs.v2 import ListServerAzInfoRequest

    got = clients.call("ecs", "list_server_az_info",
                       ListServerAzInfoRequest()).availability_zones or []
    return [z.availability_zone_id for z in got]


def quota_left(clients: Clients) -> dict[str, int]:
    from huaweicloudsdkecs.v2 import ShowServerLimitsRequest

    a = clients.call("ecs", "show_server_limits", ShowServerLimitsRequest()).absolute
    return {"instances": max(a.max_total_instances - a.total_instances_used, 0),
            "cores": max(a.max_total_cores - a.total_cores_used, 0),
            "ram_mib": max(a.max_total_ram_size - a.total_ram_used, 0)}


def offers(clients: Clients, prices: dict[str, float] | None = None,
           spot: bool = False) -> list[Offer]:
    """Every flavor x zone the region sells, cheapest first."""
    table = {**DEFAULT_PRICES, **(prices or {})}
    left = quota_left(clients)
    zones = list_zones(clients)
    out = []
    for f in list_flavors(clients):
        vcpus, ram_mib = int(f.vcpus), int(f.ram)
        specs = f.os_extra_specs
        key = "condspotoperationaz" if spot else "condoperationaz"
        status = zone_status(getattr(specs, key, None) if specs else None)
        fits = min(left["instances"], left["cores"] // max(vcpus, 1),
                   left["ram_mib"] // max(ram_mib, 1))
        price = table.get(f.id)
        if price is not None and spot:
            price = round(price * SPOT_DISCOUNT, 6)
        for z in zones:
            out.append(Offer(flavor=f.id, zone=z, vcpus=vcpus, memory=ram_mib * 2**20,
                             price_per_hour=price, spot=spot,
                             available=status.get(z, "normal") == "normal", quota_nodes=fits))
    out.sort(key=lambda o: (o.price_per_hour is None, o.price_per_hour or 0, o.flavor, o.zone))
    return out
