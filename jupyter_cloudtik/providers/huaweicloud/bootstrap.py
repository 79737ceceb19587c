"""``bootstrap_config``: fill every node type's ``node_config`` from the workspace.

The steps of the specification (a-h):

a. the IAM agency of the workspace for head and workers (instance identity, no keys);
b. a key pair: the user's ``key_name``, else the workspace's, created through KPS on first
   use; its private key goes to the secret store only (never logged, never recorded);
c. the workspace's managed OBS bucket into the cluster's ``storage`` section;
d. the VPC and the subnet (head: public, workers: private);
e. the workspace's security group;
f. the latest Ubuntu image from IMS, unless the node type names one;
h. spot servers when the provider prefers them, unless a node type says otherwise;
and flavor resources (vCPUs, memory) from ``list_flavors``, checked against the zone.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from ...core.errors import ConfigError
from .account import names
from .credentials import SECRET_SCOPE
from .offers import flavor_hardware, list_zones, sale_status, sold, sold_pay_per_use

if TYPE_CHECKING:
    from .nodes import HuaweiCloudNodeProvider

UBUNTU = re.compile(r"^Ubuntu (\d+)\.(\d+)")
PRIVATE_KEY_SECRET = "ssh_private_key"


def latest_ubuntu(clients, arch: str = "x86") -> Any:
    """The newest public Ubuntu ECS image for ``arch`` (IMS ``architecture``: x86 | arm).

    Asked with IMS's own filters (ListImagesRequest ``architecture``, ``virtual_env_type``
    FusionCompute = ECS, not Ironic bare metal), and checked again on each answer
    (``__support_arm``, ``virtual_env_type``): a Kunpeng or bare-metal build is often the
    newest "Ubuntu" of a region, and an x86 ECS server cannot boot it (Ecs.0007)."""
    from huaweicloudsdkims.v2 import ListImagesRequest

    images = clients.call("ims", "list_images", ListImagesRequest(
        platform="Ubuntu", imagetype="gold", status="active", limit=100, architecture=arch,
        virtual_env_type="FusionCompute")).images or []
    # (newest first is IMS's default order; its sort_key takes name, container_format,
    # disk_format, status, id or size, not created_at: ListImagesRequest docstring)
    best = None
    for img in images:
        is_arm = str(getattr(img, "support_arm", "") or "").lower() == "true"
        env = getattr(img, "virtual_env_type", None) or "FusionCompute"
        if is_arm != (arch == "arm") or env != "FusionCompute":
            continue
        m = UBUNTU.match(img.os_version or img.name or "")
        if m and (best is None or tuple(map(int, m.groups())) > best[0]):
            best = (tuple(map(int, m.groups())), img)
    if best is None:
        raise ConfigError(f"node_config.image_id: the region offers no public Ubuntu ECS "
                          f"image for {arch}; name an image with image_id",
                          field="node_config.image_id")
    return best[1]


def ensure_keypair(provider: HuaweiCloudNodeProvider, workspace: str) -> str:
    """The workspace key pair's name; made through KPS (private key kept secret) if missing."""
    from huaweicloudsdkkps.v3 import (
        CreateKeypairAction,
        CreateKeypairRequest,
        CreateKeypairRequestBody,
        ListKeypairDetailRequest,
    )

    from ...core.secrets import SecretStore

    c = provider.clients
    name = names(workspace)["keypair"]
    got = c.call("kps", "list_keypair_detail", ListKeypairDetailRequest(keypair_name=name),
                 missing_ok=True)
    if got is not None:
        return name

    def recover():
        found = c.call("kps", "list_keypair_detail", ListKeypairDetailRequest(
            keypair_name=name), missing_ok=True)
        return found

    made = c.call("kps", "create_keypair", CreateKeypairRequest(CreateKeypairRequestBody(
        keypair=CreateKeypairAction(name=name, type="ssh", scope="user"))),
        recover=recover, what="create the cluster key pair")
    key = getattr(getattr(made, "keypair", None), "private_key", None)
    if key:
        SecretStore(provider.context.store).put(SECRET_SCOPE.format(workspace=workspace),
                                                PRIVATE_KEY_SECRET, key)
    return name


def check_flavor(tname: str, f: Any, where: list[str]) -> None:
    """Refuse node type ``tname``'s flavor ``f`` when a pay-per-use server of it cannot be
    bought in any zone of ``where`` (offers.py ``sold``), naming the field."""
    field = f"available_node_types.{tname}.node_config.flavor"
    specs = f.os_extra_specs
    if not sold_pay_per_use(specs):
        raise ConfigError(
            f"{field}: '{f.id}' is sold only monthly/yearly ({specs.condoperationcharge}), "
            "not pay-per-use; choose another flavor", field=field, value=f.id)
    if not any(sold(specs, z) for z in where):
        said = ", ".join(f"{sale_status(specs, z)} in {z}" for z in where)
        raise ConfigError(f"{field}: '{f.id}' is not sold now ({said}); choose another "
                          "flavor or zone", field=field, value=f.id)


def check_node_types(provider: HuaweiCloudNodeProvider, cfg: dict[str, Any]) -> None:
    """Each node type's configured flavor exists and is sold pay-per-use in the
    configured zone (or some zone of the region): before placement, which would only
    find no matching offer, and before any server is created."""
    configured = {t: (nc.get("flavor")) for t, spec in cfg["available_node_types"].items()
                  if (nc := spec.get("node_config") or {}).get("flavor")}
    if not configured:
        return
    p = provider.provider_config
    ws = provider.workspace()
    zone = p.get("availability_zone") or ws["config"]["provider"].get("availability_zone")
    flavors = {f.id: f for f in provider.flavors(zone)}
    where = [zone] if zone else list_zones(provider.clients)
    for tname, flavor in configured.items():
        f = flavors.get(flavor)
        if f is None:
            raise ConfigError(
                f"available_node_types.{tname}.node_config.flavor: '{flavor}' is not sold in "
                f"{zone or provider.clients.region}; flavors: "
                f"{', '.join(sorted(flavors)[:12])}",
                field=f"available_node_types.{tname}.node_config.flavor", value=flavor)
        check_flavor(tname, f, where)


def bootstrap(provider: HuaweiCloudNodeProvider, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    p = provider.provider_config
    ws = provider.workspace()
    res = ws["resources"]
    wcfg = ws["config"]["provider"]
    c = provider.clients
    zone = p.get("availability_zone") or wcfg.get("availability_zone")

    # c. storage
    if res.get("bucket"):
        storage = cfg.setdefault("storage", {})
        storage["huaweicloud_obs"] = {"bucket": res["bucket"],
                                      "endpoint": f"https://obs.{c.region}.myhuaweicloud.com"}

    # b. key pair
    key_name = p.get("key_name") or ensure_keypair(provider, ws["name"])

    # f. image, flavors
    images: dict[str, Any] = {}  # architecture -> its newest Ubuntu ECS image
    flavors = {f.id: f for f in provider.flavors(zone)}
    zones: list[str] = []  # the region's, asked once when no zone is set
    for tname, t in cfg["available_node_types"].items():
        nc = t.setdefault("node_config", {})
        head = tname == cfg["head_node_type"]
        flavor = nc.get("flavor") or ("s6.large.2")
        f = flavors.get(flavor)
        if f is None:
            raise ConfigError(
                f"available_node_types.{tname}.node_config.flavor: '{flavor}' is not sold in "
                f"{zone or c.region}; flavors: {', '.join(sorted(flavors)[:12])}",
                field=f"available_node_types.{tname}.node_config.flavor", value=flavor)
        check_flavor(tname, f, [zone] if zone else zones or (zones := list_zones(c)))
        t["resources"] = {**t.get("resources", {}), "CPU": int(f.vcpus),
                          "memory": int(int(f.ram) * 2**20 * 0.9), "GPU": 0}
        arch = "arm" if flavor_hardware(f.os_extra_specs)[0] == "aarch64" else "x86"
        if not nc.get("image_id") and arch not in images:
            images[arch] = latest_ubuntu(c, arch)  # the flavor's architecture's image
        spot = nc.get("use_spot", p.get("use_spot", False)) and not head
        public = nc.get("public_ip", head and not p.get("use_internal_ips", False))
        nc.update({
            "flavor": flavor,
            "image_id": nc.get("image_id") or images[arch].id,
            "availability_zone": zone,
            # d, e: network
            "vpc_id": res["vpc_id"],
            "subnet_id": res["public_subnet_id" if head else "private_subnet_id"],
            "security_group_ids": [res["security_group_id"]],
            # a: identity
            "agency_name": res["head_agency" if head else "worker_agency"],
            "key_name": key_name,
            # h: spot
            "market_type": "spot" if spot else None,
            "public_ip": bool(public),
            "bandwidth": int(p.get("bandwidth", 10)),
            "root_volume": nc.get("root_volume") or {"volumetype": "SSD", "size": 40},
        })
    return cfg
