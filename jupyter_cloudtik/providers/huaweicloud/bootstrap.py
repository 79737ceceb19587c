"""``bootstrap_config``: fill every node type's ``node_config`` from the workspace.

The steps of the specification (a-h):

a. the IAM agency of the workspace for head and workers (instance identity, no keys);
b. a key pair: the user's ``key_name``, else the workspace's, created through KPS on first
   use; its private key goes to the secret store only (never logged, never recorded);
c. the workspace's managed OBS bucket into the cluster's ``storage`` section;
d. the VPC and the subnet (head: public, workers: private);
e. the workspace's security group;
f. the newest public Ubuntu (else Debian) image from IMS whose Python is the client's,
   unless the node type names one (then checked: its Python must be the client's);
h. spot servers when the provider prefers them, unless a node type says otherwise;
and flavor resources (vCPUs, memory) from ``list_flavors``, checked against the zone.
"""

from __future__ import annotations

import copy
import re
import sys
from typing import TYPE_CHECKING, Any

from ...core.errors import ConfigError
from .account import names
from .credentials import SECRET_SCOPE
from .offers import (
    eip_type,
    flavor_hardware,
    list_zones,
    sale_status,
    sold,
    sold_pay_per_use,
)

if TYPE_CHECKING:
    from .nodes import HuaweiCloudNodeProvider

PRIVATE_KEY_SECRET = "ssh_private_key"


#: what ``python3`` is on a stock image of each release: the release's own python3
#: package (packages.ubuntu.com/<codename>/python3: bionic 3.6.7, focal 3.8.2, jammy
#: 3.10.6, noble 3.12.3; packages.debian.org/<codename>/python3: buster 3.7.3, bullseye
#: 3.9.2, bookworm 3.11.2, trixie 3.13.5).  IMS says an image's OS (``__os_version``),
#: never its Python; a node refuses any major.minor other than the client's (userdata.py),
#: so the image is checked against this table before any server is made.
RELEASE_PYTHON = {
    "Ubuntu 18.04": "3.6", "Ubuntu 20.04": "3.8", "Ubuntu 22.04": "3.10",
    "Ubuntu 24.04": "3.12",
    "Debian 10": "3.7", "Debian 11": "3.9", "Debian 12": "3.11", "Debian 13": "3.13",
}
RELEASE = re.compile(r"^(?:(Ubuntu) (\d+\.\d+)|(Debian)(?: GNU/Linux)? (\d+))\b")
#: the platforms the default image is chosen from (IMS ``__platform``), in this order
DEFAULT_PLATFORMS = ("Ubuntu", "Debian")


def client_python() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def image_release(img: Any) -> str | None:
    """``Ubuntu 22.04`` / ``Debian 12`` of an IMS image (its ``__os_version``, else its
    name), or None for another OS."""
    m = RELEASE.match(getattr(img, "os_version", None) or getattr(img, "name", None) or "")
    if not m:
        return None
    return f"{m.group(1)} {m.group(2)}" if m.group(1) else f"{m.group(3)} {m.group(4)}"


def image_python(img: Any) -> str | None:
    """The Python major.minor of an image's ``python3`` (``RELEASE_PYTHON``), if known."""
    return RELEASE_PYTHON.get(image_release(img) or "")


def _release_key(img: Any) -> tuple[int, ...]:
    rel = image_release(img) or ""
    return tuple(int(x) for x in re.findall(r"\d+", rel))


def public_images(clients, platform: str, arch: str) -> list[Any]:
    """The region's public ECS images of ``platform`` for ``arch`` (IMS ``architecture``:
    x86 | arm), newest release first.

    Asked with IMS's own filters (ListImagesRequest ``architecture``, ``virtual_env_type``
    FusionCompute = ECS, not Ironic bare metal), and checked again on each answer
    (``__support_arm``, ``virtual_env_type``): a Kunpeng or bare-metal build is often the
    newest "Ubuntu" of a region, and an x86 ECS server cannot boot it (Ecs.0007)."""
    from huaweicloudsdkims.v2 import ListImagesRequest

    images = clients.call("ims", "list_images", ListImagesRequest(
        platform=platform, imagetype="gold", status="active", limit=100, architecture=arch,
        virtual_env_type="FusionCompute")).images or []
    # (newest first is IMS's default order; its sort_key takes name, container_format,
    # disk_format, status, id or size, not created_at: ListImagesRequest docstring)
    out = []
    for img in images:
        is_arm = str(getattr(img, "support_arm", "") or "").lower() == "true"
        env = getattr(img, "virtual_env_type", None) or "FusionCompute"
        if is_arm != (arch == "arm") or env != "FusionCompute" or not image_release(img):
            continue
        out.append(img)
    return sorted(out, key=_release_key, reverse=True)  # stable: IMS's order within one


def latest_ubuntu(clients, arch: str = "x86") -> Any:
    """The newest public Ubuntu ECS image for ``arch`` (whatever its Python)."""
    found = public_images(clients, "Ubuntu", arch)
    if not found:
        raise ConfigError(f"node_config.image_id: the region offers no public Ubuntu ECS "
                          f"image for {arch}; name an image with image_id",
                          field="node_config.image_id")
    return found[0]


def default_image(clients, arch: str, python: str, field: str = "node_config.image_id"
                  ) -> Any:
    """The newest public Ubuntu (else Debian) ECS image for ``arch`` whose ``python3`` is
    ``python`` (the client's major.minor): the newest Ubuntu alone would be refused by
    every node of a client on another Python (Ubuntu 24.04 has 3.12, 22.04 3.10).  A
    ConfigError naming ``field`` when the region has none, with what it has."""
    seen: dict[str, str] = {}
    for platform in DEFAULT_PLATFORMS:
        for img in public_images(clients, platform, arch):
            py = image_python(img)
            if py == python:
                return img
            seen.setdefault(image_release(img) or img.name, py or "?")
    have = ", ".join(f"{rel} has {py}" for rel, py in seen.items()) or "none"
    raise ConfigError(
        f"{field}: no public Ubuntu or Debian ECS image for {arch} has Python {python} (the "
        f"client's, which the nodes must match; {have}); run the client on one of those "
        f"Pythons, or name an image with Python {python} in image_id (with image_python if "
        "its OS is not Ubuntu or Debian)", field=field, value=python)


def check_image_python(clients, img: Any, image_id: str, declared: str | None,
                       python: str, field: str) -> None:
    """Refuse an image whose ``python3`` is not the client's major.minor (the nodes would
    refuse to start after the servers are made and billed), or whose Python is unknown
    (an OS outside ``RELEASE_PYTHON`` without ``image_python``)."""
    py = declared or (image_python(img) if img is not None else None)
    what = f"image {img.name!r}" if img is not None else f"image {image_id!r}"
    if py is None:
        os_ = (getattr(img, "os_version", None) or "an OS") if img is not None else \
            "an image IMS does not list"
        raise ConfigError(
            f"{field}: the Python of {what} ({os_}) is not known; set image_python: "
            f"'{python}' beside image_id if its python3 is {python} (the client's), or "
            f"choose an Ubuntu or Debian image with Python {python}", field=field,
            value=image_id)
    if py != python:
        raise ConfigError(
            f"{field}: {what} has Python {py} and the client has Python {python}; nodes "
            f"must have the client's major.minor: choose an image with Python {python} "
            f"(or leave image_id out for one), or run the client on Python {py}",
            field=field, value=image_id)


def find_image(clients, image_id: str) -> Any:
    """The IMS record of ``image_id`` (public, private or shared), or None."""
    from huaweicloudsdkims.v2 import ListImagesRequest

    got = clients.call("ims", "list_images", ListImagesRequest(id=image_id, limit=1),
                       what="read the image of node_config.image_id").images or []
    return got[0] if got else None


def ensure_keypair(provider: HuaweiCloudNodeProvider, workspace: str) -> str:
    """The workspace key pair's name; made through KPS (private key kept secret) if missing."""
    from huaweicloudsdkkps.v3 import (
        CreateKeypairAction,
        CreateKeypairRequest,
        CreateKeypairRequestBody,
        ListKeypairDetailRequest,
    )

    # deferred: start-up (core.secrets ~9 ms, loads cryptography, sqlite3)
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
        # domain scope: every IAM user of the account sees it, as the workspace is shared
        # (a user-scope key pair is its creator's only: another user of the workspace
        # found none, and making it again was refused, its name being taken)
        keypair=CreateKeypairAction(name=name, type="ssh", scope="domain"))),
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
    images: dict[str, Any] = {}  # architecture -> its default image
    python = client_python()
    machines: set[str] = set()  # every node's (the staged wheels must fit them all)
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
        machines.add("aarch64" if arch == "arm" else "x86_64")
        field = f"available_node_types.{tname}.node_config.image_id"
        if not nc.get("image_id") and arch not in images:
            # the flavor's architecture's image, with the client's Python
            images[arch] = default_image(c, arch, python, field)
        elif nc.get("image_id"):
            check_image_python(c, find_image(c, nc["image_id"]), nc["image_id"],
                               nc.get("image_python"), python, field)
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
            # the region's EIP type (offers.eip_type), asked only when a node has an EIP
            **({"eip_type": eip_type(c)} if public else {}),
            "bandwidth": int(p.get("bandwidth", 10)),
            "root_volume": nc.get("root_volume") or {"volumetype": "SSD", "size": 40},
        })
    for t in cfg["available_node_types"].values():
        t["node_config"]["machines"] = sorted(machines)
    return cfg
