"""What the region offers: flavors x availability zones, with resources, prices and quota.

``offer_set(clients, prices)`` is what placement asks this provider for: every (flavor,
zone) pair the cloud sells right now, with vCPUs, memory, an hourly price from a
configurable price table, all drawing on the project's ECS quota (one pool).
Flavor names also tell their size (``s6.xlarge.2``: 4 vCPUs, 2 GiB per vCPU), which
``flavor_resources`` uses when no API is at hand (config checks before anything runs).
"""

from __future__ import annotations

import re
from typing import Any

from ...core.errors import ConfigError
from ...offers import Offer, OfferSet, Pool
from .clients import Clients

# Illustrative on-demand prices (USD per hour) of common flavors; override with the
# provider's ``prices`` option for your region and contract.
DEFAULT_PRICES = {
    "s6.small.1": 0.012, "s6.medium.2": 0.024, "s6.large.2": 0.048, "s6.xlarge.2": 0.096,
    "s6.2xlarge.2": 0.192, "c7.large.2": 0.066, "c7.xlarge.2": 0.132, "c7.2xlarge.4": 0.352,
    "m7.xlarge.8": 0.268, "p2s.2xlarge.8": 2.4, "pi2.2xlarge.4": 0.95, "kc1.xlarge.4": 0.11,
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


_VENDOR_WORDS = {"nvidia", "tesla", "huawei", "amd"}


def gpu_model(name: str) -> str:
    """'nvidia-a100' / 'NVIDIA Tesla V100-PCIE-32GB' / 'm60_1q' -> 'A100' / 'V100' / 'M60':
    the model word a ``capabilities: {gpu_model: [...]}`` request names."""
    words = [w for w in re.split(r"[\s_\-]+", name.strip()) if w]
    words = [w for w in words if w.lower() not in _VENDOR_WORDS] or words
    return words[0].upper() if words else ""


def flavor_hardware(specs: Any) -> tuple[str, int, str | None]:
    """(arch, GPU count, GPU model) of a flavor, from its ``os_extra_specs``.

    The ECS API reference (Data Structure for Querying Details About Specifications) and
    huaweicloudsdkecs' ``FlavorExtraSpec``: ``ecs:instance_architecture`` is returned only
    for Kunpeng flavors, as ``arm64``; GPUs are in ``info:gpus`` (JSON: name, memory_mb,
    count), on older flavors in ``pci_passthrough:alias`` ("nvidia-p100:1",
    "PCI device name:quantity", comma separated) or ``pci_passthrough:gpu_specs``
    ("m60:direct_graphics:1")."""
    import json

    if specs is None:
        return "x86_64", 0, None
    arch_word = (getattr(specs, "ecsinstance_architecture", None) or "").lower()
    performance = (getattr(specs, "ecsperformancetype", None) or "").lower()
    arch = "aarch64" if arch_word in ("arm64", "aarch64") or \
        performance.startswith("kunpeng") else "x86_64"
    devices: list[tuple[str, int]] = []
    listed: Any = getattr(specs, "infogpus", None) or []
    if isinstance(listed, str):
        try:
            listed = json.loads(listed)
        except ValueError:
            listed = []
    for g in listed if isinstance(listed, list) else []:
        if isinstance(g, dict) and isinstance(g.get("name"), str):
            count = g.get("count", 1)
            devices.append((g["name"], count if isinstance(count, int) and count > 0 else 1))
    if not devices:
        for part in (getattr(specs, "pci_passthroughalias", None) or "").split(","):
            name, _, count = part.strip().partition(":")
            if name:
                devices.append((name, int(count) if count.isdigit() and int(count) else 1))
    if not devices:
        spec = getattr(specs, "pci_passthroughgpu_specs", None) or ""
        fields = spec.split(":")
        if fields[0]:
            last = fields[-1] if len(fields) > 1 else "1"
            devices.append((fields[0], int(last) if last.isdigit() and int(last) else 1))
    count = sum(c for _, c in devices)
    return arch, count, gpu_model(devices[0][0]) if devices else None


def zone_status(spec: str | None) -> dict[str, str]:
    """'cn-north-4a(normal),cn-north-4b(sellout)' -> {zone: status}."""
    out = {}
    for part in (spec or "").split(","):
        m = re.match(r"^\s*([^()]+)\((\w+)\)\s*$", part)
        if m:
            out[m.group(1)] = m.group(2)
    return out


#: the sale statuses that mean "sold": ``promotion`` is "recommended, equal to normal"
#: (huaweicloudsdkecs FlavorExtraSpec.cond_operation_status); ``obt`` (open beta) needs an
#: application first, ``sellout`` and ``abandon`` are not sold
SOLD_STATUSES = ("normal", "promotion")


def sale_status(specs: Any, zone: str, spot: bool = False) -> str:
    """A flavor's sale status in ``zone`` as ECS defines it (FlavorExtraSpec docstrings):
    the zone's entry of ``cond:operation:az`` (``cond:spot:operation:az`` for spot), and
    for a zone that list does not name, the region-level ``cond:operation:status`` (absent:
    ``normal``) — for spot ``cond:spot:operation:status``, whose absence means ``abandon``."""
    if specs is None:
        return "abandon" if spot else "normal"
    per_zone = zone_status(getattr(specs, "condspotoperationaz" if spot
                                   else "condoperationaz", None))
    if zone in per_zone:
        return per_zone[zone]
    region = getattr(specs, "condspotoperationstatus" if spot else "condoperationstatus",
                     None)
    return (region or "").strip() or ("abandon" if spot else "normal")


def sold_pay_per_use(specs: Any) -> bool:
    """``cond:operation:charge`` lists the billing modes a flavor is sold in (``period``:
    monthly/yearly, ``demand``: pay per use); absent, both.  Clusters are pay-per-use."""
    charge = getattr(specs, "condoperationcharge", None) if specs is not None else None
    return not charge or "demand" in [c.strip() for c in str(charge).split(",")]


def sold(specs: Any, zone: str, spot: bool = False) -> bool:
    """Whether a pay-per-use (or spot) server of this flavor can be bought in ``zone``."""
    return sale_status(specs, zone, spot) in SOLD_STATUSES and sold_pay_per_use(specs)


def list_flavors(clients: Clients, zone: str | None = None) -> list[Any]:
    from huaweicloudsdkecs.v2 import ListFlavorsRequest

    return clients.call("ecs", "list_flavors",
                        ListFlavorsRequest(availability_zone=zone)).flavors or []


def list_zones(clients: Clients) -> list[str]:
    """The region's central, shared zones: where a server of the workspace's subnets can
    be made.  ListServerAzInfo also lists edge zones (``type`` Edge: IES, Homezone) and
    dedicated ones (``mode`` dedicated), whose servers need the edge site's own subnets
    and EIP pool (``public_border_group``) or a dedicated contract; flavors name them in
    ``cond:operation:az`` like any zone, so offering them made placement try a zone whose
    creates fail (ECS API reference, "Listing AZs", ecs_02_1501)."""
    from huaweicloudsdkecs.v2 import ListServerAzInfoRequest

    got = clients.call("ecs", "list_server_az_info",
                       ListServerAzInfoRequest()).availability_zones or []
    return [z.availability_zone_id for z in got
            if (z.type or "Center") == "Center" and (z.mode or "shared") == "shared"
            and (z.public_border_group or "center") == "center"]


#: the EIP types asked for, best first: dynamic BGP, then static BGP
PREFERRED_EIP_TYPES = ("5_bgp", "5_sbgp")


def eip_type(clients: Clients) -> str:
    """The EIP type (``publicip.type`` / ``iptype``) to ask for in this region: its first
    of ``PREFERRED_EIP_TYPES``, else the first IPv4 pool it has (EIP v3
    ListCommonPools, the central ``public_border_group``).  Why: the types differ by
    region, and a type the region has not is refused ("must be a type the system
    supports"; cn-northeast-1 has only 5_telcom and 5_union: CreatePublicipOption
    docstring); ``5_bgp`` was hard-coded.  A region whose EIP service has no v3 pools
    API (404) keeps ``5_bgp``, the documented default."""
    from huaweicloudsdkeip.v3 import ListCommonPoolsRequest

    cached = getattr(clients, "_eip_type", None)
    if cached:
        return cached
    got = clients.call("eip3", "list_common_pools", ListCommonPoolsRequest(
        public_border_group="center"), missing_ok=True, what="list the region's EIP types")
    names = [p.name for p in ((got.common_pools if got is not None else None) or [])
             if p.name and (p.public_border_group or "center") == "center"
             and "ipv6" not in p.name]
    if got is None:
        chosen = PREFERRED_EIP_TYPES[0]
    else:
        chosen = next((t for t in PREFERRED_EIP_TYPES if t in names), None) or (
            names[0] if names else None)
    if chosen is None:
        raise ConfigError(f"provider.region: {clients.region} offers no IPv4 EIP pool; "
                          "choose another region", field="provider.region",
                          value=clients.region)
    clients._eip_type = chosen
    return chosen


def quota_limits(clients: Clients) -> dict[str, int]:
    """The project's ECS quota: totals and what is left (instances, cores, RAM in MiB)."""
    from huaweicloudsdkecs.v2 import ShowServerLimitsRequest

    a = clients.call("ecs", "show_server_limits", ShowServerLimitsRequest()).absolute
    return {"instances": a.max_total_instances, "cores": a.max_total_cores,
            "ram_mib": a.max_total_ram_size,
            "instances_left": max(a.max_total_instances - a.total_instances_used, 0),
            "cores_left": max(a.max_total_cores - a.total_cores_used, 0),
            "ram_mib_left": max(a.max_total_ram_size - a.total_ram_used, 0)}


def estimated_price(vcpus: int, ram_mib: int) -> float:
    """A rough on-demand price for flavors missing from the table (per vCPU and GiB)."""
    return round(0.02 * vcpus + 0.005 * ram_mib / 1024, 4)


def offer_set(clients: Clients, prices: dict[str, float] | None = None,
              spot: bool = False, currency: str = "USD") -> OfferSet:
    """Every flavor x zone the region sells now, sharing the project's ECS quota (a pool).

    Each offer's ``node_config`` (flavor, zone, spot) is merged into the node config of
    the nodes placed on it.  With ``spot`` every offer also has a spot twin."""
    table = {**DEFAULT_PRICES, **(prices or {})}
    limits = quota_limits(clients)
    pool_name = f"huaweicloud/{clients.region}/ecs-quota"
    pool = Pool(pool_name, free={"CPU": limits["cores_left"],
                                 "memory": limits["ram_mib_left"] * 2**20,
                                 "instances": limits["instances_left"]},
                total={"CPU": limits["cores"], "memory": limits["ram_mib"] * 2**20,
                       "instances": limits["instances"]})
    zones = list_zones(clients)
    out = OfferSet(pools={pool_name: pool})
    for f in list_flavors(clients):
        vcpus, ram_mib = int(f.vcpus), int(f.ram)
        specs = f.os_extra_specs
        known = f.id in table
        arch, gpus, model = flavor_hardware(specs)
        capabilities = {"performance": getattr(specs, "ecsperformancetype", None) or "normal"}
        if model:
            capabilities["gpu_model"] = model
        base_price = table[f.id] if known else estimated_price(vcpus, ram_mib)
        for market in ((False, True) if spot else (False,)):
            for z in zones:
                if not sold(specs, z, market):
                    continue  # sold out, withdrawn, beta or monthly-only in this zone
                price = round(base_price * SPOT_DISCOUNT, 6) if market else base_price
                out.offers.append(Offer(
                    key=f"huaweicloud/{clients.region}/{z}/{f.id}" + ("/spot" if market
                                                                       else ""),
                    provider="huaweicloud", region=clients.region, availability_zone=z,
                    flavor=f.id, spot=market, price_per_hour=price, currency=currency,
                    size={"CPU": vcpus, "memory": ram_mib * 2**20, "GPU": gpus},
                    arch=arch, pool=pool_name, capabilities=dict(capabilities),
                    node_config={"flavor": f.id, "availability_zone": z,
                                 "market_type": "spot" if market else None},
                    description=f"{f.id} ({vcpus} vCPU, {ram_mib // 1024} GiB"
                                + (f", {gpus} x {model}" if model else "")
                                + (", aarch64" if arch == "aarch64" else "") + f") in {z}"
                                + ("" if known else "; price estimated")))
    return out
