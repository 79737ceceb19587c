"""The emulated cloud: resources, quotas, asynchronous jobs, and the rules a real one checks.

This module knows nothing about HTTP.  Each public ``Cloud`` method implements one API
action (named like the SDK method, e.g. ``create_post_paid_servers``), takes a ``Call`` and
returns ``(status, body)`` or raises ``ApiError``.  Time-driven changes (a server built,
a NAT gateway ready, a job finished) happen in ``advance()``, which the server calls on
every request and on a short timer; what became due there (servers to boot or to stop) is
handed back for the machine layer to carry out.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import html
import ipaddress
import itertools
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request, conflict, not_found, quota_exceeded

log = logging.getLogger("cloudtik_emulators.huaweicloud")

DEFAULT_QUOTAS = {
    "instances": 200, "cores": 800, "ram": 3_276_800,  # ram in MiB, as ECS counts it
    "vpc": 5, "subnet": 100, "security_group": 100, "security_group_rule": 500,
    "publicip": 20, "nat": 5, "agency": 50, "bucket": 100, "keypair": 100,
}
MAX_TAGS = 10
MAX_USER_DATA = 32 * 1024
PAGE_DEFAULT = 25
MAX_CREATE_COUNT = 100     # PostPaidServer.count: "at most 100" (SDK docstring)
MAX_DELETE = 1000          # "A maximum of 1,000 ECSs can be deleted at a time" (ecs_02_0103)
MAX_METADATA = 10          # PostPaidServer.metadata: at most 10 pairs
MAX_LIST_LIMIT = 1000      # ListServersDetailsRequest.limit: at most 1000
# Capacity refusals: "Ecs.0319" (the selected flavor's capacity is insufficient, as the
# MGC error-code page quotes ECS: https://support.huaweicloud.com/mgc_faq/mgc_04_6131.html)
CAPACITY_CODE = "Ecs.0319"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# PostPaidServer.name: Chinese characters, letters, digits, '_', '-', '.'; 1-64 characters,
# 1-59 when count > 1 (the cloud appends "-0001"...)
SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fa5]+$")
# PostPaidServerTag (server_tags at create): key 1-36 characters, value 0-43, neither
# containing control characters or = * < > \ , | (and no / in keys)
CREATE_TAG_KEY_BAD = re.compile(r"[\x00-\x1f=*<>\\,|/]")
CREATE_TAG_VALUE_BAD = re.compile(r"[\x00-\x1f=*<>\\,|]")
METADATA_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.]{1,255}$")
VOLUME_TYPES = {"SATA", "SAS", "SSD", "GPSSD", "co-p1", "uh-l1", "ESSD", "GPSSD2", "ESSD2"}

FLAVORS = [
    # id, vcpus, ram MiB, family note
    ("s6.small.1", 1, 1024), ("s6.medium.2", 1, 2048), ("s6.large.2", 2, 4096),
    ("s6.xlarge.2", 4, 8192), ("s6.2xlarge.2", 8, 16384), ("c7.large.2", 2, 4096),
    ("c7.xlarge.2", 4, 8192), ("c7.2xlarge.4", 8, 32768), ("m7.xlarge.8", 4, 32768),
    # GPU-accelerated (ecs:performancetype gpu): P2s with one NVIDIA V100, Pi2 with one T4
    ("p2s.2xlarge.8", 8, 65536), ("pi2.2xlarge.4", 8, 32768),
]
# The GPU flavors' own os_extra_specs, as ListFlavors shows them (ECS API reference, "Data
# Structure for Querying Details About Specifications"; huaweicloudsdkecs FlavorExtraSpec):
# newer flavors list GPUs in info:gpus (JSON: name, memory_mb, count), older ones only in
# pci_passthrough:alias ("PCI device name:quantity").  No Kunpeng (arm64) flavor: the
# emulated servers boot this machine's x86 image.
FLAVOR_SPECS = {
    "p2s.2xlarge.8": {"ecs:performancetype": "gpu", "pci_passthrough:enable_gpu": "true",
                      "pci_passthrough:alias": "nvidia-v100-pcie-32gb:1",
                      "info:gpus": '[{"name": "nvidia-v100-pcie-32gb", "memory_mb": 32768, '
                                   '"count": 1, "alias_prefix": "nvidia-v100"}]'},
    "pi2.2xlarge.4": {"ecs:performancetype": "gpu", "pci_passthrough:enable_gpu": "true",
                      "pci_passthrough:alias": "nvidia-t4:1"},
}

# name, platform, os_version, created, architecture (ListImagesRequest.architecture: x86 |
# arm), virtual_env_type (FusionCompute: ECS, Ironic: bare metal, DataImage), and the
# Python major.minor of the image's python3 (its release's python3 package:
# packages.ubuntu.com/<codename>/python3, packages.debian.org/<codename>/python3).  IMS
# answers the OS (``__os_version``), never the Python: the last column is what the image
# carries, for tests of a client whose Python no image has.  A region lists Kunpeng (arm)
# and bare-metal Ubuntu builds beside the x86 ECS ones, often newer: a lookup by platform
# and version alone picks one an x86 ECS server cannot boot.
IMAGES = [
    ("Ubuntu 18.04 server 64bit", "Ubuntu", "Ubuntu 18.04 server 64bit", "2021-03-01T00:00:00Z",
     "x86", "FusionCompute", "3.6"),
    ("Ubuntu 20.04 server 64bit", "Ubuntu", "Ubuntu 20.04 server 64bit", "2023-06-01T00:00:00Z",
     "x86", "FusionCompute", "3.8"),
    ("Ubuntu 22.04 server 64bit", "Ubuntu", "Ubuntu 22.04 server 64bit", "2024-09-01T00:00:00Z",
     "x86", "FusionCompute", "3.10"),
    ("Ubuntu 24.04 server 64bit for Kunpeng", "Ubuntu", "Ubuntu 24.04 server 64bit",
     "2025-05-01T00:00:00Z", "arm", "FusionCompute", "3.12"),
    ("Ubuntu 24.04 server 64bit for BMS", "Ubuntu", "Ubuntu 24.04 server 64bit",
     "2025-06-01T00:00:00Z", "x86", "Ironic", "3.12"),
    ("Debian 11.1.0 64bit", "Debian", "Debian GNU/Linux 11.1.0 64bit", "2022-03-01T00:00:00Z",
     "x86", "FusionCompute", "3.9"),
    ("Debian 12.0.0 64bit", "Debian", "Debian GNU/Linux 12.0.0 64bit", "2023-10-01T00:00:00Z",
     "x86", "FusionCompute", "3.11"),
    ("CentOS 7.9 64bit", "CentOS", "CentOS 7.9 64bit", "2022-01-01T00:00:00Z", "x86",
     "FusionCompute", "3.6"),
]

ROLES = [
    ("ECS FullAccess", "system_ecs_full", "ecs"),
    ("OBS OperateAccess", "system_obs_operate", "obs"),
    ("OBS ReadOnlyAccess", "system_obs_read", "obs"),
    ("VPC ReadOnlyAccess", "system_vpc_read", "vpc"),
]

# BatchAddServerTag (tags/action): key 1-36 of A-Z a-z 0-9 - _ and \u4e00-\u9fff; value
# 0-43 of the same and '.' (SDK docstring of huaweicloudsdkecs.v2.BatchAddServerTag)
TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_\-\u4e00-\u9fff]{1,36}$")
TAG_VALUE_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fff]{0,43}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
NAME_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fa5]{1,64}$")


# ServiceStatement.Action: "service:resource-type:operation", the service lower case, * in
# the others (huaweicloudsdkiam/v3/model/service_statement.py)
POLICY_ACTION_RE = re.compile(r"^[a-z0-9]+:[A-Za-z0-9*]+:[A-Za-z0-9*]+$")
# the emulated OBS operations and their IAM actions (OBS "Permissions and Supported Actions")
OBS_ACTIONS = {
    "get_object": "obs:object:GetObject", "put_object": "obs:object:PutObject",
    "delete_object": "obs:object:DeleteObject", "list_objects": "obs:bucket:ListBucket",
    "get_bucket_metadata": "obs:bucket:HeadBucket", "create_bucket": "obs:bucket:CreateBucket",
    "delete_bucket": "obs:bucket:DeleteBucket", "list_buckets": "obs:bucket:ListAllMyBuckets",
}


def _matches_action(pattern: str, action: str) -> bool:
    p, a = pattern.split(":"), action.split(":")
    return len(p) == len(a) == 3 and p[0] == a[0] and all(
        fnmatch.fnmatchcase(x.lower(), y.lower()) for y, x in zip(p[1:], a[1:], strict=True))


def _matches_resource(pattern: str, resource: str) -> bool:
    p, r = pattern.split(":", 4), resource.split(":", 4)
    return len(p) == len(r) == 5 and p[0].lower() == r[0] and p[3].lower() == r[3] and all(
        fnmatch.fnmatchcase(x, y) for y, x in ((p[1], r[1]), (p[2], r[2]), (p[4], r[4])))


def now_iso(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t or time.time()))


def new_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Call:
    """One API call as the cloud sees it."""

    action: str
    service: str
    project_id: str
    params: dict[str, str] = field(default_factory=dict)        # path parameters
    query: dict[str, str] = field(default_factory=dict)         # last value per name
    body: Any = None                                            # parsed JSON, or raw bytes
    headers: dict[str, str] = field(default_factory=dict)       # lower-case names
    host: str = ""
    user: str = "emulated-user"                                 # the IAM user who signed


#: the IAM users of the emulated account (server.py: the colleague's access key)
DEFAULT_USER = "emulated-user"
COLLEAGUE_USER = "colleague-user"


@dataclass
class Effects:
    """What ``advance`` made due: the machine layer boots and stops these."""

    boot: list[dict[str, Any]] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)


class Cloud:
    """The state of one emulated Huawei Cloud account (one domain, one project)."""

    def __init__(self, *, region: str, project_id: str, domain_id: str,
                 private_net: ipaddress.IPv4Network, public_net: ipaddress.IPv4Network,
                 boot_seconds: float = 0.3, settle_seconds: float = 0.1) -> None:
        self.region = region
        self.project_id = project_id
        self.domain_id = domain_id
        self.zones = [f"{region}a", f"{region}b", f"{region}c"]
        #: edge zones (IES, Homezone): listed by ListServerAzInfo as type Edge, mode
        #: dedicated, their own public_border_group (ECS API reference, "Listing AZs",
        #: https://support.huaweicloud.com/intl/en-us/api-ecs/ecs_02_1501.html), and in
        #: flavors' cond:operation:az like any zone; a create there is refused here (the
        #: servers of an edge site need its own subnets and EIP pool: our reading)
        self.edge_zones: list[str] = []
        #: the region's EIP pools (types): they differ by region (CreatePublicipOption
        #: docstring: cn-northeast-1 5_telcom/5_union only, ap-southeast-1 5_bgp only,
        #: cn-north-4 5_bgp/5_sbgp); EIP v3 ListCommonPools lists them, a create of
        #: another type is refused
        self.eip_pools: list[str] = ["5_bgp", "5_sbgp"]
        self.sold_out: set[tuple[str, str]] = set()  # (flavor, zone) without capacity
        #: flavor -> {"status": region-level status, "az": {zone: status} (zones it does
        #: not name take the status), "charge": "period" | "demand" | "period,demand"}:
        #: its sale as ListFlavors shows it (cond:operation:*; FlavorExtraSpec docstrings)
        self.flavor_sale: dict[str, dict[str, Any]] = {}
        #: a deleted bucket's name is held this long before anyone may create it again
        #: (OBS FAQ: "about 30 minutes"); name -> when it was deleted
        self.bucket_release_seconds = 1800.0
        self.deleted_buckets: dict[str, float] = {}
        #: bucket names another account owns (names are global across accounts)
        self.foreign_buckets: set[str] = set()
        # (flavor, zone) that the flavor listing still shows as "normal" but whose hosts are
        # full: the cloud's view lags, and only the create call finds out (as it happens)
        self.full_hosts: set[tuple[str, str]] = set()
        self.credential_seconds = 3600.0  # agency credentials from the metadata service
        # (image name, flavor family) pairs the flavor cannot boot (e.g. a Xen-only image
        # on a KVM flavor): refused at create with Ecs.0007 ("image attributes invalid:
        # adjust the flavor or image type", ECS Error Codes)
        self.image_flavor_refusals: set[tuple[str, str]] = set()
        self.boot_seconds = boot_seconds
        self.settle_seconds = settle_seconds
        # deletes take time: a server keeps its port (and so its subnet, security group and
        # EIP stay in use) until its delete job ends; a SNAT rule and a NAT gateway stay
        # PENDING_DELETE (and block what they use) for as long
        self.delete_seconds = max(settle_seconds, 0.3)
        self.server_delete_seconds: float | None = None  # None: delete_seconds
        # a new server shows in listings only after this (ECS is eventually consistent:
        # the create answer and show_server know it at once, list_servers_details later)
        self.list_lag = settle_seconds
        self.quotas = dict(DEFAULT_QUOTAS)
        self.lock = threading.RLock()
        self.r: dict[str, dict[str, dict[str, Any]]] = {
            k: {} for k in ("vpc", "subnet", "security_group", "security_group_rule",
                            "peering", "routetable", "publicip", "nat", "snat", "agency",
                            "keypair", "server", "job", "bucket", "policy")
        }
        self.role_grants: list[tuple[str, str]] = []  # (agency id, role id)
        # token -> (body digest, first answer, when): ECS idempotency (create_post_paid_servers)
        self.client_tokens: dict[str, tuple[str, dict[str, Any], float]] = {}
        self.token_ttl = 8 * 3600.0
        self.pending_faults: dict[str, list[str]] = {}  # action -> fault kinds for the cloud
        self._private = iter(list(private_net.hosts())[1:])
        self._public = iter(list(public_net.hosts())[1:])
        self._free_private: list[str] = []
        #: realistic mode (network.py): servers get addresses of their subnet's CIDR
        self.subnet_ips = False
        #: server id -> its console text (the emulator reads its machines' console.log)
        self.console_reader: Any = None
        self._free_public: list[str] = []
        self._seq = itertools.count(1)
        self.images = [
            {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "name": name, "platform": plat,
             "os_version": ver, "created_at": created, "arch": arch, "env": env,
             "python": python}
            for name, plat, ver, created, arch, env, python in IMAGES
        ]
        self.roles = [
            {"id": hashlib.md5(n.encode()).hexdigest(), "display_name": d, "name": n,
             "catalog": c}
            for d, n, c in ROLES
        ]

    # helpers ----------------------------------------------------------------------------
    def _check_quota(self, service: str, kind: str, asked: int = 1, used: int | None = None):
        limit = self.quotas.get(kind)
        if limit is None:
            return
        if used is None:
            used = len(self.r.get(kind, {}))
        if used + asked > limit:
            raise quota_exceeded(service, kind, limit, used, asked)

    def _alloc_private(self, subnet: dict[str, Any] | None = None) -> str:
        if self.subnet_ips and subnet is not None:
            return self._alloc_in_subnet(subnet)
        if self._free_private:
            return self._free_private.pop(0)
        try:
            return str(next(self._private))
        except StopIteration:
            raise ApiError(400, "Ecs.0012", "The subnet does not contain enough IP "
                           "addresses (the emulator's address range is used up).",
                           "ecs") from None

    def _subnet_room(self, sub: dict[str, Any]) -> int:
        """Addresses left in a subnet: its size less 5 the cloud keeps (network, gateway,
        DHCP/DNS, broadcast: the stricter reading of "available_ip_address_count")."""
        size = ipaddress.ip_network(sub["cidr"]).num_addresses - 5
        used = sum(1 for s in self.r["server"].values()
                   if s["subnet_id"] == sub["id"] and s["status"] != "DELETED")
        used += sum(1 for n in self.r["nat"].values() if n["internal_network_id"] == sub["id"])
        return size - used

    def _alloc_in_subnet(self, subnet: dict[str, Any]) -> str:
        """Realistic mode: the next free address of the subnet (after the gateway, and
        skipping the first ten, which DHCP and DNS of a real subnet keep)."""
        used = {s["private_ip"] for s in self.r["server"].values()
                if s["status"] != "DELETED" and s.get("subnet_id") == subnet["id"]}
        used.add(subnet["gateway_ip"])
        for n, host in enumerate(ipaddress.ip_network(subnet["cidr"]).hosts()):
            if n >= 10 and str(host) not in used:
                return str(host)
        raise ApiError(409, "Ecs.0620", f"No free private IP addresses left in subnet "
                       f"{subnet['cidr']}.", "ecs")

    def _alloc_public(self) -> str:
        if self._free_public:
            return self._free_public.pop(0)
        try:
            return str(next(self._public))
        except StopIteration:
            raise ApiError(409, "VPC.0518", "No free public IP addresses.", "eip") from None

    def _get(self, kind: str, ident: str, service: str, what: str) -> dict[str, Any]:
        item = self.r[kind].get(ident)
        if item is None:
            raise not_found(service, what, ident)
        return item

    @staticmethod
    def _page_marker(items: list[dict[str, Any]], query: dict[str, str],
                     default: int = 2000) -> list[dict[str, Any]]:
        """Marker pagination (VPC, NAT, EIP, KPS, IMS): items after the marker id."""
        try:
            limit = int(query.get("limit", default))
        except ValueError:
            raise bad_request("vpc", f"limit {query.get('limit')!r} is not a number") from None
        if limit < 0:
            raise bad_request("vpc", "limit must be >= 0")
        marker = query.get("marker")
        if marker:
            ids = [i.get("id") or i.get("name") for i in items]
            if marker not in ids:
                raise bad_request("vpc", f"marker {marker} is not valid")
            items = items[ids.index(marker) + 1:]
        return items[:limit] if limit else items

    def _body(self, call: Call, key: str | None = None) -> dict[str, Any]:
        body = call.body
        if not isinstance(body, dict):
            raise bad_request(call.service, "the request body is not a JSON object")
        if key is None:
            return body
        inner = body.get(key)
        if not isinstance(inner, dict):
            raise bad_request(call.service, f"the request body has no '{key}' object")
        return inner

    # time ---------------------------------------------------------------------------------
    def advance(self) -> Effects:
        """Apply every change that is due by now."""
        eff = Effects()
        t = time.time()
        with self.lock:
            for srv in self.r["server"].values():
                if srv.get("deleting_until") and t >= srv["deleting_until"] and \
                        srv["status"] != "DELETED":
                    self._finish_delete(srv)
            for rid in [k for k, r in self.r["snat"].items()
                        if r["status"] == "PENDING_DELETE" and t >= r["delete_at"]]:
                self._drop_snat(rid)
            for nid in [k for k, n in self.r["nat"].items()
                        if n["status"] == "PENDING_DELETE" and t >= n["delete_at"]]:
                del self.r["nat"][nid]
            for sub in self.r["subnet"].values():
                if sub["status"] == "UNKNOWN" and t >= sub["ready_at"]:
                    sub["status"] = "ACTIVE"
            for vpc in self.r["vpc"].values():
                if vpc["status"] == "CREATING" and t >= vpc["ready_at"]:
                    vpc["status"] = "OK"
            for nat in self.r["nat"].values():
                if nat["status"] == "PENDING_CREATE" and t >= nat["ready_at"]:
                    nat["status"] = "ACTIVE"
            for srv in self.r["server"].values():
                if srv["status"] == "BUILD" and t >= srv["ready_at"]:
                    if srv.get("fail_as"):
                        srv["status"] = "ERROR"
                        srv["fault"] = {"code": 500, "message": srv["fail_as"],
                                        "created": now_iso()}
                    else:
                        srv["status"] = "ACTIVE"
                        srv["launched_at"] = now_iso()
                        eff.boot.append(dict(srv))
            for job in self.r["job"].values():
                if job["status"] in ("SUCCESS", "FAIL"):
                    continue
                self._update_job(job)
        return eff

    def _update_job(self, job: dict[str, Any]) -> None:
        if job["type"] == "deleteServers":
            if time.time() >= job["ready_at"]:
                job["status"] = "SUCCESS"
                job["end_time"] = now_iso()
            return
        states = []
        for sub in job["sub_jobs"]:
            srv = self.r["server"].get(sub["server_id"])
            if sub.get("failed"):
                states.append("FAIL")
            elif srv is None:
                states.append("FAIL")
                sub.setdefault("fail_reason", "the server was deleted while it was built")
            elif srv["status"] == "ACTIVE":
                states.append("SUCCESS")
            elif srv["status"] == "ERROR":
                sub["fail_reason"] = (srv.get("fault") or {}).get("message", "error")
                sub["error_code"] = "Ecs.0000"
                states.append("FAIL")
            else:
                states.append("RUNNING")
        for sub, st in zip(job["sub_jobs"], states, strict=True):
            sub["status"] = st
        if "RUNNING" not in states:
            job["status"] = "FAIL" if "FAIL" in states else "SUCCESS"
            job["end_time"] = now_iso()
            if job["status"] == "FAIL":
                failed = [s for s in job["sub_jobs"] if s["status"] == "FAIL"]
                job["fail_reason"] = failed[0].get("fail_reason") or "creation failed"
                job["error_code"] = failed[0].get("error_code") or "Ecs.0000"

    # ============================================================== IAM ==================
    def keystone_list_auth_domains(self, call: Call):
        return 200, {"domains": [{"id": self.domain_id, "name": "emulated-account",
                                  "enabled": True, "description": "",
                                  "links": {"self": "/v3/auth/domains"}}],
                     "links": {"self": "/v3/auth/domains"}}

    def keystone_list_projects(self, call: Call):
        projects = [{"id": self.project_id, "name": self.region, "domain_id": self.domain_id,
                     "parent_id": self.domain_id, "enabled": True, "is_domain": False,
                     "description": ""}]
        name = call.query.get("name")
        if name:
            projects = [p for p in projects if p["name"] == name]
        return 200, {"projects": projects, "links": {"self": "/v3/projects"}}

    def keystone_list_permissions(self, call: Call):
        roles = self.roles
        if call.query.get("display_name"):
            roles = [r for r in roles if r["display_name"] == call.query["display_name"]]
        out = [{"id": r["id"], "name": r["name"], "display_name": r["display_name"],
                "catalog": r["catalog"], "type": "AX", "domain_id": None,
                "description": r["display_name"], "flag": "fine_grained"} for r in roles]
        return 200, {"roles": out, "total_number": len(out), "links": {"self": "/v3/roles"}}

    def _agency_view(self, a: dict[str, Any]) -> dict[str, Any]:
        return {k: a[k] for k in ("id", "name", "domain_id", "trust_domain_id",
                                  "trust_domain_name", "description", "duration",
                                  "create_time", "expire_time")}

    def create_agency(self, call: Call):
        opt = self._body(call, "agency")
        name = opt.get("name") or ""
        if not NAME_RE.match(name):
            raise bad_request("iam", f"agency name {name!r} is invalid")
        if opt.get("domain_id") != self.domain_id:
            raise ApiError(403, "1103", "The domain_id does not match the caller's account.",
                           "iam")
        if any(a["name"] == name for a in self.r["agency"].values()):
            raise conflict("iam", f"An agency named {name} already exists.", "1109")
        self._check_quota("iam", "agency")
        a = {"id": uuid.uuid4().hex, "name": name, "domain_id": self.domain_id,
             "trust_domain_id": opt.get("trust_domain_id") or "op_svc_ecs_id",
             "trust_domain_name": opt.get("trust_domain_name") or "op_svc_ecs",
             "description": opt.get("description") or "",
             "duration": str(opt.get("duration") or "FOREVER"), "create_time": now_iso(),
             "expire_time": None}
        self.r["agency"][a["id"]] = a
        return 201, {"agency": self._agency_view(a)}

    def list_agencies(self, call: Call):
        if call.query.get("domain_id") != self.domain_id:
            raise bad_request("iam", "domain_id is required and must be the caller's")
        items = list(self.r["agency"].values())
        if call.query.get("name"):
            items = [a for a in items if a["name"] == call.query["name"]]
        page = int(call.query.get("page", 1) or 1)
        per_page = int(call.query.get("per_page", 100) or 100)
        if not 1 <= per_page <= 500:
            raise bad_request("iam", "per_page must be 1..500")
        items = items[(page - 1) * per_page: page * per_page]
        return 200, {"agencies": [self._agency_view(a) for a in items]}

    def delete_agency(self, call: Call):
        aid = call.params["agency_id"]
        self._get("agency", aid, "iam", "agency")
        del self.r["agency"][aid]
        self.role_grants = [g for g in self.role_grants if g[0] != aid]
        return 204, None

    def associate_agency_with_all_projects_permission(self, call: Call):
        aid, rid = call.params["agency_id"], call.params["role_id"]
        self._get("agency", aid, "iam", "agency")
        if call.params["domain_id"] != self.domain_id:
            raise ApiError(403, "1103", "The domain_id does not match the caller's.", "iam")
        if not any(r["id"] == rid for r in self.roles) and rid not in self.r["policy"]:
            raise not_found("iam", "role", rid)
        if (aid, rid) not in self.role_grants:
            self.role_grants.append((aid, rid))
        return 204, None

    # custom policies ("Creating a Custom Policy for Cloud Services", IAM API iam_02_0013:
    # https://support.huaweicloud.com/en-us/api-iam/iam_02_0013.html; SDK
    # huaweicloudsdkiam/v3/model/service_statement.py for the Action and Resource forms)
    def _check_policy(self, role: dict[str, Any]) -> None:
        def bad(msg: str) -> ApiError:
            return bad_request("iam", f"role.{msg}")

        name = role.get("display_name")
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise bad(f"display_name {name!r} is required (1-128 characters)")
        if role.get("type") not in ("AX", "XA"):
            raise bad(f"type {role.get('type')!r} must be AX (account level) or XA "
                      "(project level)")
        if not isinstance(role.get("description"), str):
            raise bad("description is required")
        policy = role.get("policy")
        if not isinstance(policy, dict) or policy.get("Version") != "1.1":
            raise bad("policy.Version must be \"1.1\" for a custom policy")
        statements = policy.get("Statement")
        if not isinstance(statements, list) or not 1 <= len(statements) <= 8:
            raise bad("policy.Statement must hold 1 to 8 statements")
        for i, st in enumerate(statements):
            where = f"policy.Statement[{i}]"
            if not isinstance(st, dict) or st.get("Effect") not in ("Allow", "Deny"):
                raise bad(f"{where}.Effect must be Allow or Deny")
            actions = st.get("Action")
            if not isinstance(actions, list) or not 1 <= len(actions) <= 100:
                raise bad(f"{where}.Action must hold 1 to 100 actions")
            services = set()
            for a in actions:
                if not isinstance(a, str) or not POLICY_ACTION_RE.match(a):
                    raise bad(f"{where}.Action {a!r} is not service:resource-type:operation "
                              "(a lower-case service name; * allowed in the others)")
                services.add(a.split(":")[0])
            resources = st.get("Resource")
            if resources is None:
                continue
            if not isinstance(resources, list) or not 1 <= len(resources) <= 10:
                raise bad(f"{where}.Resource must hold 1 to 10 resources")
            for r in resources:
                parts = r.split(":", 4) if isinstance(r, str) else []
                if len(parts) != 5 or not all(parts) or parts[0].lower() not in services:
                    raise bad(f"{where}.Resource {r!r} is not service:region:account-id:"
                              "resource-type:resource-path of a service its actions name")
            if len(st.get("Condition") or {}) > 10:
                raise bad(f"{where}.Condition may hold at most 10 conditions")

    def _policy_view(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"id": p["id"], "name": p["name"], "display_name": p["display_name"],
                "type": p["type"], "description": p["description"], "catalog": "CUSTOMED",
                "domain_id": self.domain_id, "policy": p["policy"],
                "created_time": p["created_time"], "updated_time": p["created_time"],
                "links": {"self": f"/v3/roles/{p['id']}"}}

    def create_cloud_service_custom_policy(self, call: Call):
        role = self._body(call, "role")
        self._check_policy(role)
        if any(p["display_name"] == role["display_name"] for p in self.r["policy"].values()):
            raise conflict("iam", f"A custom policy named {role['display_name']} already "
                           "exists.", "1109")
        pid = uuid.uuid4().hex
        p = {"id": pid, "name": "custom_" + pid[:8], "display_name": role["display_name"],
             "type": role["type"], "description": role["description"],
             "policy": role["policy"], "created_time": now_iso()}
        self.r["policy"][pid] = p
        return 201, {"role": self._policy_view(p)}

    def list_custom_policies(self, call: Call):
        items = list(self.r["policy"].values())
        page = int(call.query.get("page", 1) or 1)
        per_page = int(call.query.get("per_page", 300) or 300)
        if not 1 <= per_page <= 300 or page < 1:
            raise bad_request("iam", "page must be ≥ 1 and per_page 1..300")
        out = [self._policy_view(p) for p in items[(page - 1) * per_page: page * per_page]]
        return 200, {"roles": out, "total_number": len(items), "links": {"self": ""}}

    def delete_custom_policy(self, call: Call):
        pid = call.params["role_id"]
        self._get("policy", pid, "iam", "custom policy")
        del self.r["policy"][pid]
        self.role_grants = [g for g in self.role_grants if g[1] != pid]
        return 200, {}

    def obs_allows(self, agency_name: str, action: str, bucket: str | None,
                   key: str | None) -> bool:
        """Whether an agency's grants allow an OBS operation: OBS OperateAccess everything
        but creating and deleting buckets; a custom policy what its Allow statements name
        (actions and resources, with *), unless a Deny statement names it."""
        agency = next((a for a in self.r["agency"].values() if a["name"] == agency_name),
                      None)
        if agency is None:
            return False
        wanted = OBS_ACTIONS.get(action, "")
        resource = (f"obs:{self.region}:{self.domain_id}:object:{bucket}/{key}" if key else
                    f"obs:{self.region}:{self.domain_id}:bucket:{bucket or ''}")
        allowed = False
        for aid, rid in self.role_grants:
            if aid != agency["id"]:
                continue
            system = next((r for r in self.roles if r["id"] == rid), None)
            if system is not None:
                if system["name"] == "system_obs_operate" and action not in (
                        "create_bucket", "delete_bucket"):
                    allowed = True
                continue
            policy = self.r["policy"].get(rid)
            for st in (policy or {}).get("policy", {}).get("Statement", []):
                if not any(_matches_action(a, wanted) for a in st["Action"]):
                    continue
                if st.get("Resource") is not None and not any(
                        _matches_resource(r, resource) for r in st["Resource"]):
                    continue
                if st["Effect"] == "Deny":
                    return False
                allowed = True
        return allowed

    # ============================================================== VPC ==================
    def _vpc_view(self, v):
        return {"id": v["id"], "name": v["name"], "cidr": v["cidr"],
                "description": v["description"], "status": v["status"], "routes": [],
                "enterprise_project_id": "0", "tenant_id": self.project_id,
                "created_at": v["created_at"], "updated_at": v["created_at"]}

    def create_vpc(self, call: Call):
        opt = self._body(call, "vpc")
        name = opt.get("name") or ""
        cidr = opt.get("cidr") or "192.168.0.0/16"
        try:
            net = ipaddress.ip_network(cidr)
        except ValueError:
            raise bad_request("vpc", f"cidr {cidr!r} is not a valid CIDR block") from None
        if not net.is_private or net.prefixlen > 28:
            raise bad_request("vpc", f"cidr {cidr} must be a private block of /28 or larger")
        if name and not NAME_RE.match(name):
            raise bad_request("vpc", f"name {name!r} is invalid")
        self._check_quota("vpc", "vpc")
        v = {"id": new_id(), "name": name, "cidr": str(net),
             "description": opt.get("description") or "", "status": "CREATING",
             "created_at": now_iso(), "ready_at": time.time() + self.settle_seconds}
        self.r["vpc"][v["id"]] = v
        rt = {"id": new_id(), "name": "rtb-" + name, "vpc_id": v["id"], "default": True,
              "routes": [], "created_at": now_iso()}
        self.r["routetable"][rt["id"]] = rt
        return 200, {"vpc": self._vpc_view(v)}

    def list_vpcs(self, call: Call):
        items = list(self.r["vpc"].values())
        if call.query.get("id"):
            items = [v for v in items if v["id"] == call.query["id"]]
        return 200, {"vpcs": [self._vpc_view(v) for v in self._page_marker(items, call.query)]}

    def show_vpc(self, call: Call):
        return 200, {"vpc": self._vpc_view(self._get("vpc", call.params["vpc_id"], "vpc",
                                                     "vpc"))}

    def delete_vpc(self, call: Call):
        vid = call.params["vpc_id"]
        self._get("vpc", vid, "vpc", "vpc")
        if any(s["vpc_id"] == vid for s in self.r["subnet"].values()):
            raise conflict("vpc", f"VPC {vid} still has subnets; delete them first.",
                           "VPC.0103")
        if any(n["router_id"] == vid for n in self.r["nat"].values()):
            raise conflict("vpc", f"VPC {vid} is used by a NAT gateway.", "VPC.0103")
        if any(vid in (p["request_vpc_info"]["vpc_id"], p["accept_vpc_info"]["vpc_id"])
               for p in self.r["peering"].values()):
            raise conflict("vpc", f"VPC {vid} has VPC peering connections.", "VPC.0103")
        del self.r["vpc"][vid]
        for rid in [k for k, rt in self.r["routetable"].items() if rt["vpc_id"] == vid]:
            del self.r["routetable"][rid]
        return 204, None

    def _subnet_view(self, s):
        return {"id": s["id"], "name": s["name"], "cidr": s["cidr"],
                "gateway_ip": s["gateway_ip"], "vpc_id": s["vpc_id"], "status": s["status"],
                "dhcp_enable": True, "primary_dns": s["primary_dns"],
                "secondary_dns": s["secondary_dns"], "dnsList": list(s["dns_list"]),
                "availability_zone": s["availability_zone"],
                "neutron_network_id": s["id"], "neutron_subnet_id": s["neutron_subnet_id"],
                "description": "", "ipv6_enable": False, "tenant_id": self.project_id,
                "created_at": s["created_at"], "updated_at": s["created_at"],
                "available_ip_address_count": 250, "scope": "center"}

    def create_subnet(self, call: Call):
        opt = self._body(call, "subnet")
        vpc = self._get("vpc", opt.get("vpc_id") or "-", "vpc", "vpc")
        try:
            net = ipaddress.ip_network(opt.get("cidr") or "")
            gw = ipaddress.ip_address(opt.get("gateway_ip") or "")
        except ValueError:
            raise bad_request("vpc", "cidr and gateway_ip must be valid") from None
        if not net.subnet_of(ipaddress.ip_network(vpc["cidr"])):
            raise bad_request("vpc", f"subnet cidr {net} is not inside the VPC's {vpc['cidr']}",
                              "VPC.0204")
        if gw not in net:
            raise bad_request("vpc", f"gateway_ip {gw} is not inside {net}")
        for s in self.r["subnet"].values():
            if s["vpc_id"] == vpc["id"] and ipaddress.ip_network(s["cidr"]).overlaps(net):
                raise conflict("vpc", f"subnet cidr {net} overlaps subnet {s['name']}",
                               "VPC.0205")
        name = opt.get("name") or ""
        if not NAME_RE.match(name):
            raise bad_request("vpc", f"subnet name {name!r} is invalid (1-64 characters: "
                              "letters, digits, '_', '-', '.')")
        # CreateSubnetOption: primary_dns/secondary_dns/dnsList are empty unless given, and
        # then the subnet "cannot use the cloud's private DNS" (SDK docstring): recorded,
        # and a server in this subnet gets no name servers (metadata network_data.json)
        dns = self._subnet_dns(opt)
        self._check_quota("vpc", "subnet")
        s = {"id": new_id(), "name": name, "cidr": str(net),
             "primary_dns": opt.get("primary_dns"), "secondary_dns": opt.get("secondary_dns"),
             "dns_list": dns,
             "gateway_ip": str(gw), "vpc_id": vpc["id"], "status": "UNKNOWN",
             "availability_zone": opt.get("availability_zone") or "",
             "neutron_subnet_id": new_id(), "created_at": now_iso(),
             "ready_at": time.time() + self.settle_seconds}
        self.r["subnet"][s["id"]] = s
        return 200, {"subnet": self._subnet_view(s)}

    def _subnet_dns(self, opt: dict[str, Any]) -> list[str]:
        """The name servers a create/update subnet body gives: IPv4 addresses only, and
        ``dnsList`` a superset of primary and secondary (CreateSubnetOption and
        UpdateSubnetOption docstrings; vpc_subnet01_0004)."""
        dns: list[str] = []
        for ip in [opt.get("primary_dns"), opt.get("secondary_dns"),
                   *(opt.get("dnsList") or [])]:
            if ip is None:
                continue
            try:
                if ipaddress.ip_address(ip).version != 4:
                    raise ValueError
            except ValueError:
                raise bad_request("vpc", f"DNS server {ip!r} is not an IPv4 address") \
                    from None
            if ip not in dns:
                dns.append(ip)
        if opt.get("dnsList") and not {opt.get("primary_dns"), opt.get("secondary_dns")} \
                - {None} <= set(opt["dnsList"]):
            raise bad_request("vpc", "dnsList must contain primary_dns and secondary_dns")
        return dns

    def update_subnet(self, call: Call):
        # "Updating Subnet Information" (vpc_subnet01_0004): PUT under the subnet's VPC;
        # ``name`` is mandatory (1-64 of letters, digits, _ - .); the DNS fields as at
        # create. Servers made afterwards get the new name servers (DHCP).
        sid = call.params["subnet_id"]
        s = self._get("subnet", sid, "vpc", "subnet")
        if s["vpc_id"] != call.params["vpc_id"]:
            raise not_found("vpc", "subnet", sid)
        opt = self._body(call, "subnet")
        name = opt.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise bad_request("vpc", f"subnet.name {name!r} is required (1-64 characters: "
                              "letters, digits, '_', '-', '.')")
        dns = self._subnet_dns(opt)
        s["name"] = name
        if dns:
            s.update(primary_dns=opt.get("primary_dns") or dns[0],
                     secondary_dns=opt.get("secondary_dns") or (
                         dns[1] if len(dns) > 1 else None), dns_list=dns)
        return 200, {"subnet": {"id": s["id"], "status": s["status"]}}

    def list_subnets(self, call: Call):
        items = list(self.r["subnet"].values())
        if call.query.get("vpc_id"):
            items = [s for s in items if s["vpc_id"] == call.query["vpc_id"]]
        return 200, {"subnets": [self._subnet_view(s)
                                 for s in self._page_marker(items, call.query)]}

    def show_subnet(self, call: Call):
        s = self._get("subnet", call.params["subnet_id"], "vpc", "subnet")
        return 200, {"subnet": self._subnet_view(s)}

    def delete_subnet(self, call: Call):
        sid = call.params["subnet_id"]
        s = self._get("subnet", sid, "vpc", "subnet")
        if s["vpc_id"] != call.params["vpc_id"]:
            raise not_found("vpc", "subnet", sid)
        if any(srv["subnet_id"] == sid for srv in self.r["server"].values()
               if srv["status"] != "DELETED"):
            raise conflict("vpc", f"subnet {sid} is used by servers.", "VPC.0210")
        if any(n["internal_network_id"] == sid for n in self.r["nat"].values()):
            raise conflict("vpc", f"subnet {sid} is used by a NAT gateway.", "VPC.0210")
        if any(r["network_id"] == sid for r in self.r["snat"].values()):
            raise conflict("vpc", f"subnet {sid} has SNAT rules.", "VPC.0210")
        del self.r["subnet"][sid]
        return 204, None

    def _rule_view(self, r):
        return {k: r.get(k) for k in (
            "id", "description", "security_group_id", "direction", "ethertype", "protocol",
            "port_range_min", "port_range_max", "remote_ip_prefix", "remote_group_id")} | {
            "tenant_id": self.project_id, "remote_address_group_id": None}

    def _sg_view(self, g):
        rules = [self._rule_view(r) for r in self.r["security_group_rule"].values()
                 if r["security_group_id"] == g["id"]]
        return {"id": g["id"], "name": g["name"], "description": g["description"],
                "vpc_id": g.get("vpc_id"), "enterprise_project_id": "0",
                "security_group_rules": rules}

    def create_security_group(self, call: Call):
        opt = self._body(call, "security_group")
        name = opt.get("name") or ""
        if not NAME_RE.match(name):
            raise bad_request("vpc", f"security group name {name!r} is invalid")
        self._check_quota("vpc", "security_group")
        g = {"id": new_id(), "name": name, "description": opt.get("description") or "",
             "vpc_id": opt.get("vpc_id"), "created_at": now_iso()}
        self.r["security_group"][g["id"]] = g
        for eth in ("IPv4", "IPv6"):  # default egress, as the cloud adds
            rid = new_id()
            self.r["security_group_rule"][rid] = {
                "id": rid, "security_group_id": g["id"], "direction": "egress",
                "ethertype": eth, "protocol": None, "port_range_min": None,
                "port_range_max": None, "remote_ip_prefix": None, "remote_group_id": None,
                "description": ""}
        return 200, {"security_group": self._sg_view(g)}

    def list_security_groups(self, call: Call):
        items = list(self.r["security_group"].values())
        if call.query.get("vpc_id"):
            items = [g for g in items if g.get("vpc_id") == call.query["vpc_id"]]
        return 200, {"security_groups": [self._sg_view(g)
                                         for g in self._page_marker(items, call.query)]}

    def delete_security_group(self, call: Call):
        gid = call.params["security_group_id"]
        self._get("security_group", gid, "vpc", "security group")
        if any(gid in srv["security_groups"] for srv in self.r["server"].values()
               if srv["status"] != "DELETED"):
            raise conflict("vpc", f"security group {gid} is used by servers.", "VPC.0602")
        if any(r.get("remote_group_id") == gid and r["security_group_id"] != gid
               for r in self.r["security_group_rule"].values()):
            raise conflict("vpc", f"security group {gid} is referenced by rules.", "VPC.0602")
        del self.r["security_group"][gid]
        for rid in [k for k, r in self.r["security_group_rule"].items()
                    if r["security_group_id"] == gid]:
            del self.r["security_group_rule"][rid]
        return 204, None

    def create_security_group_rule(self, call: Call):
        opt = self._body(call, "security_group_rule")
        gid = opt.get("security_group_id") or "-"
        self._get("security_group", gid, "vpc", "security group")
        if opt.get("direction") not in ("ingress", "egress"):
            raise bad_request("vpc", "direction must be ingress or egress")
        proto = opt.get("protocol")
        if proto not in (None, "tcp", "udp", "icmp"):
            raise bad_request("vpc", f"protocol {proto!r} is not supported")
        lo, hi = opt.get("port_range_min"), opt.get("port_range_max")
        if (lo is None) != (hi is None) or (lo is not None and not 1 <= lo <= hi <= 65535):
            raise bad_request("vpc", f"port range {lo}-{hi} is invalid")
        prefix = opt.get("remote_ip_prefix")
        if prefix is not None:
            try:
                prefix = str(ipaddress.ip_network(prefix, strict=False))
            except ValueError:
                raise bad_request("vpc", f"remote_ip_prefix {prefix!r} is invalid") from None
        if prefix and opt.get("remote_group_id"):
            raise bad_request("vpc", "remote_ip_prefix and remote_group_id are exclusive")
        if opt.get("remote_group_id"):
            self._get("security_group", opt["remote_group_id"], "vpc", "security group")
        rule = {"id": new_id(), "security_group_id": gid, "direction": opt["direction"],
                "ethertype": opt.get("ethertype") or "IPv4", "protocol": proto,
                "port_range_min": lo, "port_range_max": hi, "remote_ip_prefix": prefix,
                "remote_group_id": opt.get("remote_group_id"),
                "description": opt.get("description") or ""}
        key = ("security_group_id", "direction", "ethertype", "protocol", "port_range_min",
               "port_range_max", "remote_ip_prefix", "remote_group_id")
        for r in self.r["security_group_rule"].values():
            if all(r.get(k) == rule.get(k) for k in key):
                raise conflict("vpc", "Security group rule already exists.", "VPC.0604")
        self._check_quota("vpc", "security_group_rule")
        self.r["security_group_rule"][rule["id"]] = rule
        return 200, {"security_group_rule": self._rule_view(rule)}

    def list_security_group_rules(self, call: Call):
        items = list(self.r["security_group_rule"].values())
        if call.query.get("security_group_id"):
            items = [r for r in items
                     if r["security_group_id"] == call.query["security_group_id"]]
        return 200, {"security_group_rules": [self._rule_view(r)
                                              for r in self._page_marker(items, call.query)]}

    def delete_security_group_rule(self, call: Call):
        rid = call.params["security_group_rule_id"]
        self._get("security_group_rule", rid, "vpc", "security group rule")
        del self.r["security_group_rule"][rid]
        return 204, None

    def _peering_view(self, p):
        return {k: p[k] for k in ("id", "name", "status", "request_vpc_info",
                                  "accept_vpc_info", "created_at", "description")} | {
            "updated_at": p["created_at"]}

    def create_vpc_peering(self, call: Call):
        opt = self._body(call, "peering")
        req, acc = opt.get("request_vpc_info") or {}, opt.get("accept_vpc_info") or {}
        a = self._get("vpc", req.get("vpc_id") or "-", "vpc", "vpc")
        b = self._get("vpc", acc.get("vpc_id") or "-", "vpc", "vpc")
        if a["id"] == b["id"]:
            raise bad_request("vpc", "a VPC cannot peer with itself")
        # Overlapping CIDRs: the real service creates the peering (ACTIVE) and it does not
        # route (VPC peering docs: routes to an overlapping destination cannot take
        # effect); the emulator does the same and marks it, so a test can see the real
        # failure (update_route_table refuses such a route; the state lists it)
        overlapping = ipaddress.ip_network(a["cidr"]).overlaps(ipaddress.ip_network(b["cidr"]))
        p = {"id": new_id(), "name": opt.get("name") or "", "status": "ACTIVE",
             "routes": not overlapping,
             "request_vpc_info": {"vpc_id": a["id"], "tenant_id": self.project_id},
             "accept_vpc_info": {"vpc_id": b["id"], "tenant_id": self.project_id},
             "created_at": now_iso(), "description": opt.get("description") or ""}
        self.r["peering"][p["id"]] = p
        return 201, {"peering": self._peering_view(p)}

    def list_vpc_peerings(self, call: Call):
        items = list(self.r["peering"].values())
        if call.query.get("name"):
            items = [p for p in items if p["name"] == call.query["name"]]
        if call.query.get("vpc_id"):
            v = call.query["vpc_id"]
            items = [p for p in items
                     if v in (p["request_vpc_info"]["vpc_id"], p["accept_vpc_info"]["vpc_id"])]
        return 200, {"peerings": [self._peering_view(p)
                                  for p in self._page_marker(items, call.query)]}

    def delete_vpc_peering(self, call: Call):
        pid = call.params["peering_id"]
        self._get("peering", pid, "vpc", "vpc peering")
        del self.r["peering"][pid]
        for rt in self.r["routetable"].values():
            rt["routes"] = [r for r in rt["routes"] if r.get("nexthop") != pid]
        return 204, None

    def _rt_view(self, rt):
        return {"id": rt["id"], "name": rt["name"], "default": rt["default"],
                "routes": rt["routes"], "subnets": [], "tenant_id": self.project_id,
                "vpc_id": rt["vpc_id"], "description": "", "created_at": rt["created_at"],
                "updated_at": rt["created_at"]}

    def list_route_tables(self, call: Call):
        items = [rt for rt in self.r["routetable"].values()
                 if not call.query.get("vpc_id") or rt["vpc_id"] == call.query["vpc_id"]]
        views = [self._rt_view(rt) for rt in items]
        for v in views:  # the list answer carries no routes
            v.pop("routes")
        return 200, {"routetables": views}

    def show_route_table(self, call: Call):
        rt = self._get("routetable", call.params["routetable_id"], "vpc", "route table")
        return 200, {"routetable": self._rt_view(rt)}

    def update_route_table(self, call: Call):
        rt = self._get("routetable", call.params["routetable_id"], "vpc", "route table")
        routes = (self._body(call, "routetable").get("routes") or {})
        for r in routes.get("add") or []:
            if any(x["destination"] == r.get("destination") for x in rt["routes"]):
                raise conflict("vpc", f"a route to {r.get('destination')} exists", "VPC.1805")
            rt["routes"].append({"type": r.get("type"), "destination": r.get("destination"),
                                 "nexthop": r.get("nexthop"), "description": ""})
        for r in routes.get("del") or []:
            rt["routes"] = [x for x in rt["routes"] if x["destination"] != r.get("destination")]
        return 200, {"routetable": self._rt_view(rt)}

    # ============================================================== EIP ==================
    def _eip_view(self, e):
        return {"id": e["id"], "alias": e.get("alias"), "status": e["status"],
                "type": e["type"], "public_ip_address": e["address"],
                "private_ip_address": e.get("private_ip"), "port_id": e.get("port_id"),
                "tenant_id": self.project_id, "create_time": e["created_at"],
                "bandwidth_id": e["bandwidth_id"], "bandwidth_name": e["bandwidth_name"],
                "bandwidth_share_type": e["share_type"], "bandwidth_size": e["size"],
                "ip_version": 4, "enterprise_project_id": "0", "tags": []}

    def _new_eip(self, *, alias: str | None, size: int, share_type: str, bw_name: str,
                 iptype: str = "5_bgp", server_id: str | None = None) -> dict[str, Any]:
        self._check_quota("eip", "publicip")
        e = {"id": new_id(), "alias": alias, "status": "DOWN", "type": iptype,
             "address": self._alloc_public(), "created_at": now_iso(),
             "bandwidth_id": new_id(), "bandwidth_name": bw_name, "share_type": share_type,
             "size": size, "server_id": server_id, "delete_on_termination": False}
        self.r["publicip"][e["id"]] = e
        return e

    def list_common_pools(self, call: Call):
        q = call.query
        border = q.get("public_border_group")
        pools = [{"name": t, "status": "active", "type": t.split("_", 1)[-1], "used": 0,
                  "public_border_group": "center", "allow_share_bandwidth_types": [t]}
                 for t in self.eip_pools]
        pools += [{"name": "5_bgp", "status": "active", "type": "bgp", "used": 0,
                   "public_border_group": z, "allow_share_bandwidth_types": []}
                  for z in self.edge_zones]  # an edge site's own pool
        if border:
            pools = [p for p in pools if p["public_border_group"] == border]
        if q.get("name"):
            pools = [p for p in pools if p["name"] == q["name"]]
        return 200, {"common_pools": pools, "request_id": new_id()}

    def create_publicip(self, call: Call):
        body = self._body(call)
        pub = body.get("publicip") or {}
        bw = body.get("bandwidth") or {}
        if pub.get("type") not in self.eip_pools:
            # "must be a type the system supports" (the code is our reading)
            raise bad_request("eip", f"publicip.type {pub.get('type')!r} is not supported "
                              f"in this region ({', '.join(self.eip_pools)})", "EIP.0002")
        size = bw.get("size") or 0
        if bw.get("share_type") not in ("PER", "WHOLE") or not 1 <= int(size) <= 2000:
            raise bad_request("eip", "bandwidth.share_type must be PER or WHOLE and size 1..2000")
        # CreatePublicipBandwidthOption: a PER bandwidth needs its name (1-64 of letters,
        # digits, '_', '-', '.'); charge_mode is bandwidth or traffic
        if bw["share_type"] == "PER" and not NAME_RE.match(bw.get("name") or ""):
            raise bad_request("eip", f"bandwidth.name {bw.get('name')!r} is required for a "
                              "PER bandwidth (1-64 of letters, digits, '_', '-', '.')")
        if bw.get("charge_mode") not in (None, "", "bandwidth", "traffic"):
            raise bad_request("eip", "bandwidth.charge_mode must be bandwidth or traffic")
        if pub.get("alias") is not None and not NAME_RE.match(pub["alias"]):
            raise bad_request("eip", f"publicip.alias {pub['alias']!r} is invalid")
        e = self._new_eip(alias=pub.get("alias"), size=int(size), share_type=bw["share_type"],
                          bw_name=bw.get("name") or "", iptype=pub["type"])
        v = self._eip_view(e)
        return 200, {"publicip": {k: v[k] for k in (
            "id", "status", "type", "public_ip_address", "tenant_id", "create_time",
            "bandwidth_size", "ip_version", "enterprise_project_id", "alias")}}

    def list_publicips(self, call: Call):
        items = list(self.r["publicip"].values())
        if call.query.get("id"):
            items = [e for e in items if e["id"] == call.query["id"]]
        return 200, {"publicips": [self._eip_view(e)
                                   for e in self._page_marker(items, call.query)]}

    def show_publicip(self, call: Call):
        e = self._get("publicip", call.params["publicip_id"], "eip", "publicip")
        return 200, {"publicip": self._eip_view(e)}

    def delete_publicip(self, call: Call):
        eid = call.params["publicip_id"]
        e = self._get("publicip", eid, "eip", "publicip")
        if any(r["floating_ip_id"] == eid for r in self.r["snat"].values()):
            raise conflict("eip", f"EIP {e['address']} is used by a SNAT rule.", "VPC.0520")
        if e.get("server_id"):
            raise conflict("eip", f"EIP {e['address']} is bound to a server.", "VPC.0520")
        del self.r["publicip"][eid]
        self._free_public.append(e["address"])
        return 204, None

    # ============================================================== NAT ==================
    def _nat_view(self, n):
        return {k: n[k] for k in ("id", "name", "description", "spec", "status", "router_id",
                                  "internal_network_id", "created_at")} | {
            "tenant_id": self.project_id, "admin_state_up": True, "enterprise_project_id": "0"}

    def create_nat_gateway(self, call: Call):
        opt = self._body(call, "nat_gateway")
        vpc = self._get("vpc", opt.get("router_id") or "-", "nat", "router")
        sub = self._get("subnet", opt.get("internal_network_id") or "-", "nat", "network")
        if sub["vpc_id"] != vpc["id"]:
            raise bad_request("nat", "internal_network_id is not a subnet of router_id")
        if str(opt.get("spec")) not in ("1", "2", "3", "4", "5"):
            raise bad_request("nat", f"spec {opt.get('spec')!r} must be 1, 2, 3, 4 or 5")
        # CreateNatGatewayOption.name: at most 64 of digits, letters, '_', '-' (no '.')
        if not re.match(r"^[A-Za-z0-9_\-\u4e00-\u9fa5]{1,64}$", opt.get("name") or ""):
            raise bad_request("nat", f"name {opt.get('name')!r} is invalid: at most 64 "
                              "characters of digits, letters, '_', '-'")
        if any(n["router_id"] == vpc["id"] for n in self.r["nat"].values()):
            raise conflict("nat", f"VPC {vpc['id']} already has a NAT gateway.", "NAT.0009")
        self._check_quota("nat", "nat")
        n = {"id": new_id(), "name": opt.get("name") or "", "spec": str(opt["spec"]),
             "description": opt.get("description") or "", "status": "PENDING_CREATE",
             "router_id": vpc["id"], "internal_network_id": sub["id"],
             "created_at": now_iso().replace("T", " ").rstrip("Z") + ".000000",
             "ready_at": time.time() + self.settle_seconds}
        self.r["nat"][n["id"]] = n
        return 201, {"nat_gateway": self._nat_view(n)}

    def list_nat_gateways(self, call: Call):
        items = list(self.r["nat"].values())
        for k in ("name", "router_id", "id", "status"):
            if call.query.get(k):
                items = [n for n in items if n[k] == call.query[k]]
        return 200, {"nat_gateways": [self._nat_view(n)
                                      for n in self._page_marker(items, call.query)]}

    def show_nat_gateway(self, call: Call):
        n = self._get("nat", call.params["nat_gateway_id"], "nat", "nat gateway")
        return 200, {"nat_gateway": self._nat_view(n)}

    def delete_nat_gateway(self, call: Call):
        nid = call.params["nat_gateway_id"]
        self._get("nat", nid, "nat", "nat gateway")
        n = self.r["nat"][nid]
        if any(r["nat_gateway_id"] == nid for r in self.r["snat"].values()):
            raise conflict("nat", "The NAT gateway still has SNAT rules (deleting ones "
                           "included).", "NAT.0013")
        if n["status"] != "PENDING_DELETE":
            n["status"], n["delete_at"] = "PENDING_DELETE", time.time() + self.delete_seconds
        return 204, None

    def _snat_view(self, r):
        e = self.r["publicip"].get(r["floating_ip_id"]) or {}
        return {k: r[k] for k in ("id", "nat_gateway_id", "network_id", "cidr",
                                  "floating_ip_id", "status", "description", "created_at")} | {
            "tenant_id": self.project_id, "source_type": 0, "admin_state_up": True,
            "floating_ip_address": e.get("address")}

    def create_nat_gateway_snat_rule(self, call: Call):
        opt = self._body(call, "snat_rule")
        nat = self._get("nat", opt.get("nat_gateway_id") or "-", "nat", "nat gateway")
        if nat["status"] != "ACTIVE":
            raise conflict("nat", f"The NAT gateway is {nat['status']}, not ACTIVE.",
                           "NAT.0030")
        eip = self._get("publicip", opt.get("floating_ip_id") or "-", "nat", "floating ip")
        if eip.get("server_id"):
            raise conflict("nat", "The EIP is bound to a server.", "NAT.0031")
        net = opt.get("network_id")
        if net:
            sub = self._get("subnet", net, "nat", "network")
            if sub["vpc_id"] != nat["router_id"]:
                raise bad_request("nat", "network_id is not in the NAT gateway's VPC")
        elif not opt.get("cidr"):
            raise bad_request("nat", "one of network_id or cidr is required")
        for r in self.r["snat"].values():
            if r["nat_gateway_id"] == nat["id"] and net and r["network_id"] == net:
                raise conflict("nat", f"Subnet {net} already has a SNAT rule.", "NAT.0012")
        r = {"id": new_id(), "nat_gateway_id": nat["id"], "network_id": net,
             "cidr": opt.get("cidr") or "", "floating_ip_id": eip["id"], "status": "ACTIVE",
             "description": opt.get("description") or "", "created_at": now_iso()}
        self.r["snat"][r["id"]] = r
        eip["status"] = "ACTIVE"
        return 201, {"snat_rule": self._snat_view(r)}

    def list_nat_gateway_snat_rules(self, call: Call):
        items = list(self.r["snat"].values())
        for k in ("nat_gateway_id", "network_id", "floating_ip_id", "id"):
            if call.query.get(k):
                items = [r for r in items if r[k] == call.query[k]]
        return 200, {"snat_rules": [self._snat_view(r)
                                    for r in self._page_marker(items, call.query)]}

    def delete_nat_gateway_snat_rule(self, call: Call):
        rid = call.params["snat_rule_id"]
        r = self._get("snat", rid, "nat", "snat rule")
        if r["nat_gateway_id"] != call.params["nat_gateway_id"]:
            raise not_found("nat", "snat rule", rid)
        if r["status"] != "PENDING_DELETE":
            r["status"], r["delete_at"] = "PENDING_DELETE", time.time() + self.delete_seconds
        return 204, None

    def _drop_snat(self, rid: str) -> None:
        r = self.r["snat"].pop(rid)
        eip = self.r["publicip"].get(r["floating_ip_id"])
        if eip and not any(x["floating_ip_id"] == eip["id"] for x in self.r["snat"].values()):
            eip["status"] = "DOWN"

    # ============================================================== IMS ==================
    def list_images(self, call: Call):
        items = list(self.images)
        q = call.query
        if q.get("__platform"):
            items = [i for i in items if i["platform"] == q["__platform"]]
        if q.get("name"):
            items = [i for i in items if i["name"] == q["name"]]
        if q.get("id"):
            items = [i for i in items if i["id"] == q["id"]]
        if q.get("status") and q["status"] != "active":
            items = []
        if q.get("architecture"):
            if q["architecture"] not in ("x86", "arm"):
                raise bad_request("ims", "architecture must be x86 or arm")
            items = [i for i in items if i["arch"] == q["architecture"]]
        if q.get("virtual_env_type"):
            items = [i for i in items if i["env"] == q["virtual_env_type"]]
        if q.get("__imagetype") and q["__imagetype"] != "gold":
            items = []
        # ListImagesRequest.sort_key: name, container_format, disk_format, status, id or size;
        # without it, by creation time (SDK docstring)
        key = q.get("sort_key")
        if key is not None and key not in ("name", "container_format", "disk_format",
                                           "status", "id", "size"):
            raise bad_request("ims", f"sort_key {key!r} is not supported (name, "
                              "container_format, disk_format, status, id, size)")
        if q.get("sort_dir") not in (None, "asc", "desc"):
            raise bad_request("ims", "sort_dir must be asc or desc")
        if key in ("container_format", "disk_format", "status", "size"):
            key = None
        items.sort(key=lambda i: i[key or "created_at"],
                   reverse=(q.get("sort_dir") or "desc") == "desc")
        out = [{"id": i["id"], "name": i["name"], "status": "active", "visibility": "public",
                "__platform": i["platform"], "__os_version": i["os_version"],
                "__imagetype": "gold", "__os_type": "Linux", "__os_bit": "64",
                "__isregistered": "true", "__support_kvm": "true", "min_disk": 40,
                "min_ram": 0, "disk_format": "zvhd2", "container_format": "bare",
                "protected": True, "created_at": i["created_at"],
                "updated_at": i["created_at"], "virtual_env_type": i["env"],
                "__support_arm": "true" if i["arch"] == "arm" else "false",
                "owner": "public", "size": 0, "tags": []}
               for i in self._page_marker(items, q, default=500)]
        return 200, {"images": out}

    # ============================================================== KPS ==================
    # A key pair's scope (CreateKeypairAction.scope, "domain or user"): a user-scope one
    # is the creating IAM user's only, a domain-scope one every user's of the account
    # (terraform-provider-huaweicloud, huaweicloud_kps_keypair: "account: tenant-level,
    # available to all users under the same account; user: user-level, only available to
    # that user"; the default is user).  Names are unique in the account here (stricter).
    def _keypair_visible(self, k, user: str) -> bool:
        return k.get("scope") == "domain" or k.get("user_id", DEFAULT_USER) == user

    def _my_keypair(self, call: Call, name: str):
        k = self.r["keypair"].get(name)
        if k is None or not self._keypair_visible(k, call.user):
            raise not_found("kps", "key pair", name)
        return k

    def _keypair_view(self, k, private: bool = False):
        out = {"name": k["name"], "type": "ssh", "public_key": k["public_key"],
               "fingerprint": k["fingerprint"], "user_id": k.get("user_id", DEFAULT_USER)}
        if private:
            out["private_key"] = k["private_key"]
        return out

    def create_keypair(self, call: Call):
        opt = self._body(call, "keypair")
        name = opt.get("name") or ""
        # CreateKeypairAction.name: letters, digits, '_', '-', at most 255 bytes
        if not re.match(r"^[A-Za-z0-9_-]{1,255}$", name):
            raise bad_request("kps", f"key pair name {name!r} is invalid")
        if any(k["name"] == name for k in self.r["keypair"].values()):
            raise conflict("kps", f"A key pair named {name} already exists.", "KPS.0003")
        scope = opt.get("scope") or "user"
        if scope not in ("domain", "user"):
            raise bad_request("kps", f"scope {scope!r} must be domain or user")
        self._check_quota("kps", "keypair")
        private_key = None
        if opt.get("public_key"):
            public_key = opt["public_key"]
        else:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import ed25519

            key = ed25519.Ed25519PrivateKey.generate()
            private_key = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption()).decode()
            public_key = key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        k = {"id": next(self._seq), "name": name, "public_key": public_key,
             "private_key": private_key,
             "fingerprint": "SHA256:" + base64.b64encode(
                 hashlib.sha256(public_key.encode()).digest()).decode().rstrip("="),
             "created": int(time.time() * 1000), "scope": scope, "user_id": call.user}
        self.r["keypair"][name] = k
        view = self._keypair_view(k, private=private_key is not None)
        k["private_key"] = None  # the cloud gives the private key once and forgets it
        return 200, {"keypair": view}

    def list_keypairs(self, call: Call):
        items = sorted((k for k in self.r["keypair"].values()
                        if self._keypair_visible(k, call.user)), key=lambda k: k["id"])
        page = self._page_marker([{**k, "id": k["name"]} for k in items], call.query, 1000)
        nxt = page[-1]["name"] if page and page[-1]["name"] != items[-1]["name"] else None
        return 200, {"keypairs": [{"keypair": self._keypair_view(k)} for k in page],
                     "page_info": {"next_marker": nxt, "current_count": len(page)}}

    def list_keypair_detail(self, call: Call):
        k = self._my_keypair(call, call.params["keypair_name"])
        return 200, {"keypair": {**self._keypair_view(k), "id": k["id"],
                                 "scope": k.get("scope", "user"),
                                 "is_key_protection": False, "deleted": False,
                                 "create_time": k["created"], "update_time": k["created"],
                                 "frozen_state": 0}}

    def delete_keypair(self, call: Call):
        name = call.params["keypair_name"]
        self._my_keypair(call, name)
        del self.r["keypair"][name]
        return 204, None

    # ============================================================== ECS ==================
    def _flavor(self, fid: str) -> tuple[str, int, int] | None:
        return next((f for f in FLAVORS if f[0] == fid), None)

    def list_flavors(self, call: Call):
        zone = call.query.get("availability_zone")
        if zone and zone not in self.zones and zone not in self.edge_zones:
            raise bad_request("ecs", f"availability_zone {zone} does not exist")
        out = []
        for fid, vcpus, ram in FLAVORS:
            sale = self.flavor_sale.get(fid) or {}
            per_zone = dict(sale.get("az") or ({} if sale else {
                z: "normal" for z in [*self.zones, *self.edge_zones]}))
            per_zone.update({z: "sellout" for f, z in self.sold_out if f == fid})
            az = ",".join(f"{z}({st})" for z, st in per_zone.items())
            if zone and (fid, zone) in self.sold_out:
                continue
            sale_specs = {"cond:operation:status": sale.get("status", "normal"),
                          "cond:operation:az": az,
                          **({"cond:operation:charge": sale["charge"]}
                             if sale.get("charge") else {})}
            out.append({"id": fid, "name": fid, "vcpus": str(vcpus), "ram": ram, "disk": "0",
                        "swap": "", "OS-FLV-EXT-DATA:ephemeral": 0,
                        "OS-FLV-DISABLED:disabled": False, "rxtx_factor": 1.0,
                        "os-flavor-access:is_public": True, "links": [],
                        "os_extra_specs": {**sale_specs,
                                           "cond:spot:operation:az": az,
                                           "ecs:performancetype": "normal",
                                           "ecs:virtualization_env_types": "CloudCompute",
                                           **FLAVOR_SPECS.get(fid, {})}})
        return 200, {"flavors": out}

    def _check_sale(self, fid: str, zone: str) -> None:
        """A pay-per-use server of a flavor not sold so in ``zone`` is refused (the
        status of the zone, else the region's; ``promotion`` is sold; a monthly-only
        flavor is not sold pay-per-use).  A sold-out flavor is a capacity error, which
        placement fails over on; the others are the request's fault.  The codes are the
        emulator's reading: no published source names them (docs/huaweicloud.md)."""
        sale = self.flavor_sale.get(fid)
        if not sale:
            return
        status = (sale.get("az") or {}).get(zone) or sale.get("status") or "normal"
        if status == "sellout":
            raise ApiError(400, CAPACITY_CODE, f"The capacity of flavor {fid} in {zone} is "
                           "insufficient (sold out).", "ecs")
        if status not in ("normal", "promotion"):
            raise bad_request("ecs", f"flavorRef {fid} is not on sale in {zone} ({status})",
                              "Ecs.0003")
        charge = [c.strip() for c in str(sale.get("charge") or "").split(",") if c.strip()]
        if charge and "demand" not in charge:
            raise bad_request("ecs", f"flavorRef {fid} is sold only as {sale['charge']}, "
                              "not pay-per-use", "Ecs.0003")

    def nova_list_availability_zones(self, call: Call):
        return 200, {"availabilityZoneInfo": [
            {"zoneName": z, "zoneState": {"available": True}, "hosts": None}
            for z in [*self.zones, *self.edge_zones]]}

    def list_server_az_info(self, call: Call):
        # type Center | Edge, mode shared | dedicated, category 0 default, 21 Homezone,
        # 41 IES (ECS API reference, "Listing AZs")
        return 200, {"availability_zones": [
            {"availability_zone_id": z, "type": "Center", "mode": "shared",
             "public_border_group": "center", "alias": z, "az_group_ids": [],
             "category": 0} for z in self.zones] + [
            {"availability_zone_id": z, "type": "Edge", "mode": "dedicated",
             "public_border_group": z, "alias": f"IES {z}", "az_group_ids": [z],
             "category": 41} for z in self.edge_zones]}

    def _used(self, spot: bool | None = None) -> dict[str, int]:
        used = {"instances": 0, "cores": 0, "ram": 0}
        for s in self.r["server"].values():
            if s["status"] == "DELETED":
                continue
            used["instances"] += 1
            used["cores"] += s["vcpus"]
            used["ram"] += s["ram"]
        return used

    def show_server_limits(self, call: Call):
        u = self._used()
        q = self.quotas
        return 200, {"absolute": {
            "maxTotalInstances": q["instances"], "totalInstancesUsed": u["instances"],
            "maxTotalCores": q["cores"], "totalCoresUsed": u["cores"],
            "maxTotalRAMSize": q["ram"], "totalRAMUsed": u["ram"],
            "maxTotalFloatingIps": q["publicip"],
            "totalFloatingIpsUsed": len(self.r["publicip"]),
            "maxTotalKeypairs": q["keypair"], "maxSecurityGroups": q["security_group"],
            "totalSecurityGroupsUsed": len(self.r["security_group"]),
            "maxSecurityGroupRules": q["security_group_rule"], "maxServerMeta": 100,
            "maxImageMeta": 50, "maxPersonality": 5, "maxPersonalitySize": 10240,
            "maxServerGroups": 10, "maxServerGroupMembers": 16, "totalServerGroupsUsed": 0}}

    def create_post_paid_servers(self, call: Call):
        # "Idempotent Requests" (ECS API reference): the token is an 8-4-4-4-12 lower-case
        # UUID (Ecs.0123 otherwise); the same token with the same parameters returns the
        # first request's result (the same job and servers, nothing new is made); with
        # other parameters it is Ecs.0122; a token is valid for 8 hours, then Ecs.0124
        # (the zh-cn page: "幂等标识具有时效性(8小时)…返回Ecs.0124错误码")
        token = call.headers.get("x-client-token")
        digest = hashlib.sha256(json.dumps(call.body, sort_keys=True).encode()).hexdigest()
        if token is not None:
            if not UUID_RE.match(token):
                raise bad_request("ecs", f"X-Client-Token {token!r} is not a UUID in the "
                                  "format xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", "Ecs.0123")
            if token in self.client_tokens:
                seen_digest, answer, at = self.client_tokens[token]
                if time.time() - at > self.token_ttl:
                    raise bad_request("ecs", f"X-Client-Token {token} has expired (an "
                                      "idempotency identifier is valid for "
                                      f"{self.token_ttl / 3600:g} hours)", "Ecs.0124")
                if seen_digest != digest:
                    raise bad_request("ecs", f"X-Client-Token {token} was already used with "
                                      "different request parameters", "Ecs.0122")
                return 200, answer
        spec = self._body(call, "server")
        count = spec.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= MAX_CREATE_COUNT:
            raise bad_request("ecs", f"count {count!r} is invalid: one request creates 1 to "
                              f"{MAX_CREATE_COUNT} servers")
        base = spec.get("name") or ""
        most = 59 if count > 1 else 64
        if not SERVER_NAME_RE.match(base) or len(base) > most:
            raise bad_request("ecs", f"name {base!r} is invalid: 1-{most} characters of "
                              "letters, digits, '_', '-', '.'" + (
                                  " (59 when count > 1)" if count > 1 else ""))
        metadata = spec.get("metadata") or {}
        if len(metadata) > MAX_METADATA or not all(
                METADATA_KEY_RE.match(str(k)) and len(str(v)) <= 255
                for k, v in metadata.items()):
            raise bad_request("ecs", f"metadata is invalid: at most {MAX_METADATA} pairs, keys "
                              "of 1-255 of A-Z a-z 0-9 - _ : ., values of at most 255")
        root = spec.get("root_volume")
        if not isinstance(root, dict) or root.get("volumetype") not in VOLUME_TYPES:
            raise bad_request("ecs", f"root_volume.volumetype is required, one of "
                              f"{', '.join(sorted(VOLUME_TYPES))}")
        if root.get("size") is not None and not 1 <= int(root["size"]) <= 1024:
            raise bad_request("ecs", f"root_volume.size {root['size']} must be 1..1024 GB")
        eip_req = (spec.get("publicip") or {}).get("eip")
        if eip_req:
            bw = eip_req.get("bandwidth") or {}
            if eip_req.get("iptype") not in self.eip_pools:
                raise bad_request("ecs", f"publicip.eip.iptype {eip_req.get('iptype')!r} is "
                                  f"not offered in this region ({', '.join(self.eip_pools)})")
            if bw.get("sharetype") not in ("PER", "WHOLE"):
                raise bad_request("ecs", "publicip.eip.bandwidth.sharetype must be PER or "
                                  "WHOLE")
            if bw.get("sharetype") == "PER" and not 1 <= int(bw.get("size") or 0) <= 2000:
                raise bad_request("ecs", "publicip.eip.bandwidth.size must be 1..2000 Mbit/s")
            if bw.get("chargemode") not in (None, "", "traffic"):
                raise bad_request("ecs", f"publicip.eip.bandwidth.chargemode "
                                  f"{bw.get('chargemode')!r} must be empty or 'traffic'")
        fid = spec.get("flavorRef")
        flavor = self._flavor(fid or "")
        if flavor is None:
            raise bad_request("ecs", f"flavorRef {fid!r} does not exist", "Ecs.0003")
        zone = spec.get("availability_zone") or self.zones[0]
        if zone in self.edge_zones:
            raise bad_request("ecs", f"availability_zone {zone} is an edge zone: its servers "
                              "need the edge site's own subnets", "Ecs.0019")
        if zone not in self.zones:
            raise bad_request("ecs", f"availability_zone {zone} does not exist", "Ecs.0019")
        if (fid, zone) in self.sold_out:
            raise ApiError(400, CAPACITY_CODE, f"The capacity of flavor {fid} in {zone} is "
                           "insufficient (sold out).", "ecs")
        self._check_sale(fid, zone)
        if (fid, zone) in self.full_hosts:
            raise ApiError(400, CAPACITY_CODE, f"The capacity of flavor {fid} in {zone} is "
                           "insufficient.", "ecs")
        image = next((i for i in self.images if i["id"] == spec.get("imageRef")), None)
        if image is None:
            raise bad_request("ecs", f"imageRef {spec.get('imageRef')!r} does not exist",
                              "Ecs.0004")
        family = (fid or "").split(".")[0]
        flavor_arch = "arm" if "arm64" in str((FLAVOR_SPECS.get(fid or "") or {}).get(
            "ecs:instance_architecture", "")) else "x86"
        if image["env"] != "FusionCompute" or image["arch"] != flavor_arch:
            # an ECS flavor boots only ECS (FusionCompute) images of its own architecture
            raise ApiError(400, "Ecs.0007", f"The image {image['name']} cannot be used with "
                           f"flavor {fid}: adjust the flavor or the image type.", "ecs")
        if (image["name"], family) in self.image_flavor_refusals:
            raise ApiError(400, "Ecs.0007", f"The image {image['name']} cannot be used with "
                           f"flavor {fid}: adjust the flavor or the image type.", "ecs")
        vpc = self._get("vpc", spec.get("vpcid") or "-", "ecs", "vpc")
        nics = spec.get("nics") or []
        if len(nics) != 1:
            raise bad_request("ecs", "exactly one nic is supported here")
        sub = self._get("subnet", nics[0].get("subnet_id") or "-", "ecs", "subnet")
        if sub["vpc_id"] != vpc["id"]:
            raise bad_request("ecs", "the nic's subnet is not in vpcid", "Ecs.0011")
        if self._subnet_room(sub) < count:
            raise ApiError(400, "Ecs.0012", f"The subnet {sub['name'] or sub['id']} does not "
                           f"contain enough IP addresses for {count} server(s) "
                           f"({max(self._subnet_room(sub), 0)} left).", "ecs")
        sgs = [g.get("id") for g in spec.get("security_groups") or []]
        for g in sgs:
            self._get("security_group", g or "-", "ecs", "security group")
        if spec.get("key_name") and (spec["key_name"] not in self.r["keypair"] or not
                                     self._keypair_visible(self.r["keypair"][spec["key_name"]],
                                                           call.user)):
            raise bad_request("ecs", f"key pair {spec['key_name']} does not exist", "Ecs.0314")
        metadata = dict(metadata)
        agency = metadata.get("agency_name")
        if agency and not any(a["name"] == agency for a in self.r["agency"].values()):
            raise bad_request("ecs", f"agency {agency} does not exist", "Ecs.0051")
        tags = spec.get("server_tags") or []
        self._check_create_tags(tags)
        # PostPaidServer.user_data: base64; at most 32 KB *before* encoding
        user_data = spec.get("user_data") or ""
        try:
            script = base64.b64decode(user_data, validate=True) if user_data else b""
        except ValueError:
            raise bad_request("ecs", "user_data is not base64", "Ecs.0014") from None
        if len(script) > MAX_USER_DATA:
            raise bad_request("ecs", "user_data is longer than 32 KB", "Ecs.0014")
        ext = spec.get("extendparam") or {}
        spot = ext.get("marketType") == "spot"
        eip_spec = (spec.get("publicip") or {}).get("eip")
        u = self._used()
        _, vcpus, ram = flavor
        for kind, asked in (("instances", count), ("cores", count * vcpus),
                            ("ram", count * ram)):
            self._check_quota("ecs", kind, asked, used=u[kind])
        if eip_spec:
            self._check_quota("eip", "publicip", count)
        faults = self.pending_faults.pop("ecs.create_post_paid_servers", [])
        fail_idx: set[int] = set()
        if "half_fail" in faults:
            fail_idx = set(range(count // 2 if count > 1 else 1))
        error_idx = set(range(count)) if "server_error" in faults else set()

        job_id = uuid.uuid4().hex
        ids, subs = [], []
        for i in range(count):
            sid = new_id()
            name = base if count == 1 or not spec.get("is_auto_rename", True) else (
                f"{base}-{i + 1:04d}")
            if i in fail_idx:
                subs.append({"server_id": sid, "failed": True, "status": "FAIL",
                             "job_id": uuid.uuid4().hex, "error_code": CAPACITY_CODE,
                             "fail_reason": "EcsCapacityInsufficient: the host pool has no "
                                            f"free capacity for {fid} in {zone}"})
                ids.append(sid)
                continue
            srv = {
                "id": sid, "name": name, "status": "BUILD", "flavor": fid, "vcpus": vcpus,
                "ram": ram, "image": image["id"], "zone": zone, "vpc_id": vpc["id"],
                "subnet_id": sub["id"], "security_groups": sgs,
                "dns_servers": list(sub["dns_list"]),
                "key_name": spec.get("key_name"), "metadata": metadata,
                "tags": {t["key"]: t.get("value", "") for t in tags},
                "user_data": user_data, "script": script.decode("utf-8", "replace"),
                "private_ip": self._alloc_private(sub), "port_id": new_id(),
                "created_at": now_iso(), "ready_at": time.time() + self.boot_seconds,
                "listed_at": time.time() + self.list_lag,
                "spot": spot, "eip_id": None,
                "fail_as": "the hypervisor reported an error while building the server"
                if i in error_idx else None,
            }
            if spot:
                srv["metadata"] = {**metadata, "charging_mode": "2"}
            if eip_spec:
                bw = eip_spec.get("bandwidth") or {}
                e = self._new_eip(alias=None, size=int(bw.get("size") or 5),
                                  share_type=bw.get("sharetype") or "PER",
                                  bw_name=f"bandwidth-{sid[:8]}",
                                  iptype=eip_spec.get("iptype") or "5_bgp", server_id=sid)
                e.update(status="ACTIVE", port_id=srv["port_id"],
                         private_ip=srv["private_ip"],
                         delete_on_termination=bool(spec["publicip"].get(
                             "delete_on_termination", True)))
                srv["eip_id"] = e["id"]
            self.r["server"][sid] = srv
            ids.append(sid)
            subs.append({"server_id": sid, "status": "RUNNING", "job_id": uuid.uuid4().hex})
        self.r["job"][job_id] = {"id": job_id, "type": "createServer", "status": "RUNNING",
                                 "begin_time": now_iso(), "sub_jobs": subs}
        answer = {"job_id": job_id, "serverIds": ids}
        if token:
            self.client_tokens[token] = (digest, answer, time.time())
        return 200, answer

    def _check_create_tags(self, tags: list[dict[str, Any]]) -> None:
        seen: set[str] = set()
        for t in tags:
            key, value = str(t.get("key") or ""), str(t.get("value") or "")
            if not 1 <= len(key) <= 36 or CREATE_TAG_KEY_BAD.search(key):
                raise bad_request("ecs", f"server_tags key {key!r} is invalid (1-36 "
                                  "characters, none of = * < > \\ , | /)")
            if len(value) > 43 or CREATE_TAG_VALUE_BAD.search(value):
                raise bad_request("ecs", f"server_tags value {value!r} of {key} is invalid "
                                  "(0-43 characters, none of = * < > \\ , |)")
            if key in seen:
                raise bad_request("ecs", f"server_tags key {key} is given twice")
            seen.add(key)
        if len(tags) > MAX_TAGS:
            raise bad_request("ecs", f"a server can have at most {MAX_TAGS} tags "
                              f"({len(tags)} asked)")

    def _check_tags(self, tags: list[dict[str, Any]], existing: dict[str, str] | None = None):
        merged = dict(existing or {})
        for t in tags:
            key, value = t.get("key") or "", t.get("value") or ""
            if not TAG_KEY_RE.match(key):
                raise bad_request("ecs", f"tag key {key!r} is invalid (1-36 characters: "
                                  "letters, digits, '_', '-', '.')", "Ecs.0005")
            if not TAG_VALUE_RE.match(value):
                raise bad_request("ecs", f"tag value {value!r} of {key} is invalid (0-43 "
                                  "characters: letters, digits, '_', '-', '.')", "Ecs.0005")
            merged[key] = value
        if len(merged) > MAX_TAGS:
            raise bad_request("ecs", f"a server can have at most {MAX_TAGS} tags "
                              f"({len(merged)} asked)", "Ecs.0005")

    def show_job(self, call: Call):
        job = self._get("job", call.params["job_id"], "ecs", "job")
        subs = [{"status": s["status"], "job_id": s["job_id"], "job_type": "createSingleServer",
                 "begin_time": job["begin_time"], "end_time": job.get("end_time") or "",
                 "entities": {"server_id": s["server_id"]},
                 "error_code": s.get("error_code"), "fail_reason": s.get("fail_reason")}
                for s in job.get("sub_jobs", [])]
        return 200, {"job_id": job["id"], "job_type": job["type"], "status": job["status"],
                     "begin_time": job["begin_time"], "end_time": job.get("end_time") or "",
                     "error_code": job.get("error_code"), "fail_reason": job.get("fail_reason"),
                     "entities": {"sub_jobs": subs, "sub_jobs_total": len(subs)}}

    def _server_view(self, s):
        eip = self.r["publicip"].get(s.get("eip_id") or "")
        addrs = [{"version": "4", "addr": s["private_ip"], "OS-EXT-IPS:type": "fixed",
                  "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:" + s["port_id"][:8:2],
                  "OS-EXT-IPS:port_id": s["port_id"], "primary": True}]
        if eip:
            addrs.append({"version": "4", "addr": eip["address"],
                          "OS-EXT-IPS:type": "floating",
                          "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:" + s["port_id"][:8:2],
                          "OS-EXT-IPS:port_id": s["port_id"], "primary": False})
        vm_state = {"BUILD": "building", "ACTIVE": "active", "ERROR": "error",
                    "SHUTOFF": "stopped"}.get(s["status"], "deleted")
        return {
            "id": s["id"], "name": s["name"], "status": s["status"],
            "addresses": {s["vpc_id"]: addrs},
            "flavor": {"id": s["flavor"], "name": s["flavor"], "vcpus": str(s["vcpus"]),
                       "ram": str(s["ram"]), "disk": "0"},
            "image": {"id": s["image"]}, "key_name": s.get("key_name"),
            "security_groups": [{"id": g, "name": (self.r["security_group"].get(g) or {})
                                 .get("name", g)} for g in s["security_groups"]],
            "OS-EXT-AZ:availability_zone": s["zone"], "tenant_id": self.project_id,
            "user_id": "emulated-user", "created": s["created_at"], "updated": now_iso(),
            "metadata": s["metadata"], "tags": [f"{k}={v}" for k, v in s["tags"].items()],
            "OS-EXT-STS:vm_state": vm_state,
            "OS-EXT-STS:power_state": {"ACTIVE": 1, "SHUTOFF": 4}.get(s["status"], 0),
            "OS-EXT-STS:task_state": "deleting" if s.get("deleting_until") else
            "spawning" if s["status"] == "BUILD" else None,
            "OS-SRV-USG:launched_at": s.get("launched_at") or "",
            "OS-EXT-SRV-ATTR:user_data": s["user_data"],
            "fault": s.get("fault"), "progress": 100 if s["status"] == "ACTIVE" else 0,
            "locked": False, "enterprise_project_id": "0", "description": "",
            "hostId": hashlib.sha1(s["zone"].encode()).hexdigest()[:16],
        }

    def _visible_servers(self) -> list[dict[str, Any]]:
        # creation order (dicts keep insertion order), as the cloud pages them
        return [s for s in self.r["server"].values() if s["status"] != "DELETED"]

    def list_servers_details(self, call: Call):
        q = call.query
        now = time.time()
        items = [s for s in self._visible_servers()
                 if now >= s.get("listed_at", 0)]
        # ListServersDetailsRequest.tags: "servers whose tag field *contains* this value".
        # The stricter reading: a substring match against each "key=value", so
        # tags=cloudtik-cluster-name=ana also finds the servers of cluster "analysis";
        # the provider must check tags exactly itself.
        if q.get("tags"):
            want = q["tags"]
            items = [s for s in items
                     if any(want in f"{k}={v}" for k, v in s["tags"].items())]
        if q.get("not-tags"):
            nots = q["not-tags"]
            items = [s for s in items
                     if not any(nots in f"{k}={v}" for k, v in s["tags"].items())]
        if q.get("name"):
            items = [s for s in items if re.search(q["name"], s["name"])]
        if q.get("status"):
            items = [s for s in items if s["status"] == q["status"]]
        if q.get("ip"):
            items = [s for s in items if q["ip"] in s["private_ip"]]
        if q.get("server_id"):
            items = [s for s in items if s["id"] == q["server_id"]]
        try:
            limit = int(q.get("limit") or PAGE_DEFAULT)
            offset = int(q.get("offset") or 1)
        except ValueError:
            raise bad_request("ecs", "limit and offset must be numbers") from None
        if not 1 <= limit <= MAX_LIST_LIMIT or offset < 0:
            raise bad_request("ecs", f"limit must be 1..{MAX_LIST_LIMIT} and offset >= 0")
        start = (max(offset, 1) - 1) * limit
        return 200, {"count": len(items),
                     "servers": [self._server_view(s) for s in items[start:start + limit]]}

    def show_server_console_output(self, call: Call):
        """The last ``length`` lines of the server's console (cloud-init's output), as
        ``GET /v1/{project_id}/cloudservers/{server_id}/console-output`` answers
        (huaweicloudsdkecs ShowServerConsoleOutputRequest/Response: ``{"output": str}``)."""
        s = self.r["server"].get(call.params["server_id"])
        if s is None or s["status"] == "DELETED":
            raise not_found("ecs", "Instance", call.params["server_id"])
        try:
            length = int(call.query.get("length") or 50)
        except ValueError:
            raise bad_request("ecs", "length must be an integer") from None
        reader = self.console_reader
        text = reader(s["id"]) if reader is not None else ""
        lines = text.splitlines()
        return 200, {"output": "\n".join(lines[-length:] if length > 0 else lines)}

    def show_server(self, call: Call):
        s = self.r["server"].get(call.params["server_id"])
        if s is None or s["status"] == "DELETED":
            raise not_found("ecs", "Instance", call.params["server_id"])
        return 200, {"server": self._server_view(s)}

    def delete_servers(self, call: Call):
        body = self._body(call)
        ids = [x.get("id") for x in body.get("servers") or []]
        if not ids or len(ids) > MAX_DELETE:
            raise bad_request("ecs", f"servers must list 1..{MAX_DELETE} servers")
        gone = []
        until = time.time() + (self.delete_seconds if self.server_delete_seconds is None
                               else self.server_delete_seconds)
        for sid in ids:
            s = self.r["server"].get(sid or "")
            if s is None or s["status"] == "DELETED":
                continue
            if not s.get("deleting_until"):
                s["deleting_until"] = until
                s["delete_publicip"] = body.get("delete_publicip")
                gone.append(sid)  # its processes stop now; its port goes when the job ends
        job_id = uuid.uuid4().hex
        self.r["job"][job_id] = {"id": job_id, "type": "deleteServers", "status": "RUNNING",
                                 "begin_time": now_iso(), "sub_jobs": [],
                                 "ready_at": max([until] + [
                                     self.r["server"][i]["deleting_until"] for i in ids
                                     if i in self.r["server"]
                                     and self.r["server"][i].get("deleting_until")])}
        return 200, {"job_id": job_id, "_stopped": gone}

    def _finish_delete(self, s: dict[str, Any]) -> None:
        s["status"] = "DELETED"
        if not self.subnet_ips:  # realistic mode hands out addresses per subnet
            self._free_private.append(s["private_ip"])
        eip = self.r["publicip"].get(s.get("eip_id") or "")
        if eip:
            # delete_publicip true deletes; unset leaves it to delete_on_termination
            # (ecs_02_0103, Deleting ECSs)
            drop = s.get("delete_publicip")
            if drop or (drop is None and eip.get("delete_on_termination")):
                del self.r["publicip"][eip["id"]]
                self._free_public.append(eip["address"])
            else:
                eip.update(server_id=None, status="DOWN", port_id=None, private_ip=None)

    def batch_create_server_tags(self, call: Call):
        s = self.r["server"].get(call.params["server_id"])
        if s is None or s["status"] == "DELETED":
            raise not_found("ecs", "Instance", call.params["server_id"])
        body = self._body(call)
        tags = body.get("tags") or []
        if body.get("action") == "create":
            self._check_tags(tags, s["tags"])
            for t in tags:
                s["tags"][t["key"]] = t.get("value") or ""
        elif body.get("action") == "delete":
            for t in tags:
                s["tags"].pop(t.get("key"), None)
        else:
            raise bad_request("ecs", "action must be create or delete")
        return 204, None

    batch_delete_server_tags = batch_create_server_tags

    # ============================================================== TMS ==================
    def _tms_batch(self, call: Call) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """TMS batch-create/-delete ("Creating Tags in Batches",
        https://support.huaweicloud.com/intl/en-us/api-tms/CreateResourceTag.html): at most 50
        resources a call, at most 10 tags a resource, keys 1-36 of A-Z a-z 0-9 - _, values
        0-43 of those and '.'.  Only ECS servers are emulated (resource_type "ecs"), and
        project_id is required for them (a regional service)."""
        body = self._body(call)
        resources = body.get("resources") or []
        tags = body.get("tags") or []
        if not 1 <= len(resources) <= 50:
            raise bad_request("tms", f"resources must list 1..50 resources "
                              f"({len(resources)} given)", "TMS.0001")
        if not 1 <= len(tags) <= 10:
            raise bad_request("tms", f"tags must list 1..10 tags ({len(tags)} given)",
                              "TMS.0001")
        if body.get("project_id") != self.project_id:
            raise bad_request("tms", "project_id is required for regional resources (ecs) "
                              "and must be the caller's", "TMS.0001")
        for r in resources:
            if r.get("resource_type") != "ecs":
                raise bad_request("tms", f"resource_type {r.get('resource_type')!r} is not "
                                  "supported here (ecs)", "TMS.0001")
        for t in tags:
            key, value = t.get("key") or "", t.get("value")
            if not TAG_KEY_RE.match(key) or (value is not None and not TAG_VALUE_RE.match(
                    str(value))):
                raise bad_request("tms", f"tag {key!r}={value!r} is invalid (keys 1-36 of "
                                  "A-Z a-z 0-9 - _, values 0-43 of those and '.')",
                                  "TMS.0001")
        return resources, tags

    def create_resource_tag(self, call: Call):
        resources, tags = self._tms_batch(call)
        failed = []
        for r in resources:
            s = self.r["server"].get(r.get("resource_id") or "")
            if s is None or s["status"] == "DELETED":
                failed.append({"resource_id": r.get("resource_id"), "resource_type": "ecs",
                               "error_code": "TMS.0005",
                               "error_msg": "The resource does not exist."})
                continue
            merged = {**s["tags"], **{t["key"]: t.get("value") or "" for t in tags}}
            if len(merged) > MAX_TAGS:
                failed.append({"resource_id": s["id"], "resource_type": "ecs",
                               "error_code": "TMS.0006",
                               "error_msg": f"A resource has at most {MAX_TAGS} tags."})
                continue
            s["tags"] = merged
        return 200, {"failed_resources": failed}

    def delete_resource_tag(self, call: Call):
        resources, tags = self._tms_batch(call)
        for r in resources:
            s = self.r["server"].get(r.get("resource_id") or "")
            if s is not None:
                for t in tags:
                    s["tags"].pop(t["key"], None)
        return 200, {"failed_resources": []}

    # ============================================================== OBS ==================
    def obs_list_buckets(self, call: Call):
        items = "".join(
            f"<Bucket><Name>{b['name']}</Name><CreationDate>{b['created_at']}</CreationDate>"
            f"<Location>{b['location']}</Location><BucketType>OBJECT</BucketType></Bucket>"
            for b in sorted(self.r["bucket"].values(), key=lambda b: b["name"]))
        return 200, ("<?xml version='1.0' encoding='UTF-8'?><ListAllMyBucketsResult "
                     "xmlns='http://obs.myhwclouds.com/doc/2015-06-30/'><Owner><ID>"
                     f"{self.domain_id}</ID></Owner><Buckets>{items}</Buckets>"
                     "</ListAllMyBucketsResult>")

    def obs_create_bucket(self, call: Call, bucket: str):
        # OBS bucket names: 3-63 of lowercase letters, digits, '-', '.'; starting and ending
        # with a letter or digit; no "..", ".-" or "-."; not an IP address
        # (https://support.huaweicloud.com/intl/en-us/sdk-android-devg-obs/obs_26_0108.html)
        if not BUCKET_RE.match(bucket) or any(x in bucket for x in ("..", ".-", "-.")) or \
                re.match(r"^\d+\.\d+\.\d+\.\d+$", bucket):
            raise ApiError(400, "InvalidBucketName", f"The bucket name {bucket} is invalid.",
                           "obs")
        if bucket in self.r["bucket"]:
            raise ApiError(409, "BucketAlreadyOwnedByYou",
                           f"Your previous request to create the named bucket {bucket} "
                           "succeeded and you already own it.", "obs")
        if bucket in self.foreign_buckets:  # what the outside check saw: a bare 403
            raise ApiError(403, "AccessDenied", "Access Denied", "obs")
        deleted = self.deleted_buckets.get(bucket)
        if deleted is not None and time.time() - deleted < self.bucket_release_seconds:
            # the name is not released yet (the code is our reading: OBS documents the
            # delay, not the answer; S3 answers 409 for a name it does not give out)
            raise ApiError(409, "BucketAlreadyExists", f"The requested bucket name {bucket} "
                           "is not available.", "obs")
        self._check_quota("obs", "bucket")
        location = self.region
        text = call.body.decode() if isinstance(call.body, bytes) else ""
        m = re.search(r"<Location>([^<]+)</Location>", text)
        if m:
            location = m.group(1)
        if location != self.region:
            raise ApiError(400, "IllegalLocationConstraintException",
                           f"The location {location} differs from the endpoint's region "
                           f"{self.region}.", "obs")
        self.r["bucket"][bucket] = {"name": bucket, "location": location,
                                    "created_at": now_iso(), "objects": {}}
        return 200, None

    def obs_head_bucket(self, call: Call, bucket: str):
        if bucket not in self.r["bucket"]:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        return 200, None

    def obs_delete_bucket(self, call: Call, bucket: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        if b["objects"]:
            raise ApiError(409, "BucketNotEmpty", "The bucket you tried to delete is not "
                           "empty", "obs")
        del self.r["bucket"][bucket]
        self.deleted_buckets[bucket] = time.time()
        return 204, None

    def obs_put_object(self, call: Call, bucket: str, key: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        b["objects"][key] = call.body if isinstance(call.body, bytes) else b""
        return 200, None

    def obs_get_object(self, call: Call, bucket: str, key: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        if key not in b["objects"]:
            raise ApiError(404, "NoSuchKey", "The specified key does not exist.", "obs")
        return 200, b["objects"][key]

    def obs_delete_object(self, call: Call, bucket: str, key: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        b["objects"].pop(key, None)
        return 204, None

    def obs_list_objects(self, call: Call, bucket: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        # "Listing Objects in a Bucket" (OBS API, obs_04_0022): lexicographic order, keys
        # after ``marker`` that start with ``prefix``, at most ``max-keys`` (1..1000; more
        # is taken as 1000), and NextMarker (the last key returned) when truncated
        q = call.query or {}
        prefix, marker = q.get("prefix") or "", q.get("marker") or ""
        try:
            most = int(q.get("max-keys") or 1000)
        except ValueError:
            most = 0
        if most < 1:
            raise ApiError(400, "InvalidArgument", f"max-keys {q.get('max-keys')!r} is "
                           "invalid (1 to 1000)", "obs")
        most = min(most, 1000)
        keys = [k for k in sorted(b["objects"]) if k.startswith(prefix) and k > marker]
        page, more = keys[:most], len(keys) > most
        esc = html.escape
        contents = "".join(f"<Contents><Key>{esc(k)}</Key><Size>{len(b['objects'][k])}"
                           "</Size></Contents>" for k in page)
        return 200, ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>"
                     f"{bucket}</Name><Prefix>{esc(prefix)}</Prefix><Marker>{esc(marker)}"
                     f"</Marker><MaxKeys>{most}</MaxKeys>"
                     f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"
                     + (f"<NextMarker>{esc(page[-1])}</NextMarker>" if more else "")
                     + f"{contents}</ListBucketResult>")

    # ============================================================== views ================
    def summary(self) -> dict[str, Any]:
        """Everything that exists, for tests and for the user's "is anything left?"."""
        with self.lock:
            servers = [{"id": s["id"], "name": s["name"], "status": s["status"],
                        "tags": dict(s["tags"]), "private_ip": s["private_ip"],
                        "flavor": s["flavor"], "zone": s["zone"], "spot": s["spot"],
                        "key_name": s.get("key_name"), "metadata": dict(s["metadata"]),
                        "user_data": s["user_data"],
                        "dns_servers": list(s.get("dns_servers") or [])}
                       for s in self._visible_servers()]
            return {
                "servers": servers,
                # what each image carries (its python3 too, which IMS does not say)
                "images": [dict(i) for i in self.images],
                "vpcs": [{"id": v["id"], "name": v["name"], "cidr": v["cidr"]}
                         for v in self.r["vpc"].values()],
                "subnets": [{"id": s["id"], "name": s["name"], "vpc_id": s["vpc_id"],
                             "dns_servers": list(s["dns_list"])}
                            for s in self.r["subnet"].values()],
                "security_groups": [{"id": g["id"], "name": g["name"]}
                                    for g in self.r["security_group"].values()],
                "publicips": [{"id": e["id"], "alias": e.get("alias"),
                               "address": e["address"], "server_id": e.get("server_id"),
                               "type": e["type"]}
                              for e in self.r["publicip"].values()],
                "nat_gateways": [{"id": n["id"], "name": n["name"], "status": n["status"]}
                                 for n in self.r["nat"].values()],
                "snat_rules": [{"id": r["id"], "nat_gateway_id": r["nat_gateway_id"]}
                               for r in self.r["snat"].values()],
                "peerings": [{"id": p["id"], "name": p["name"], "routes": p.get("routes", True)}
                             for p in self.r["peering"].values()],
                "agencies": [{"id": a["id"], "name": a["name"], "roles": sorted(
                    [r["display_name"] for r in self.roles
                     if (a["id"], r["id"]) in self.role_grants]
                    + [p["display_name"] for p in self.r["policy"].values()
                       if (a["id"], p["id"]) in self.role_grants])}
                             for a in self.r["agency"].values()],
                "policies": [{"id": p["id"], "name": p["display_name"],
                              "policy": p["policy"]} for p in self.r["policy"].values()],
                "keypairs": [{"name": k["name"], "scope": k.get("scope", "user"),
                              "user_id": k.get("user_id", DEFAULT_USER)}
                             for k in self.r["keypair"].values()],
                "buckets": [{"name": b["name"], "objects": len(b["objects"])}
                            for b in self.r["bucket"].values()],
                "quotas": dict(self.quotas),
            }

    def set_options(self, options: dict[str, Any]) -> None:
        with self.lock:
            for k, v in (options.get("quotas") or {}).items():
                if k not in self.quotas:
                    raise ValueError(f"unknown quota {k!r}; known: {', '.join(self.quotas)}")
                self.quotas[k] = int(v)
            if "boot_seconds" in options:
                self.boot_seconds = float(options["boot_seconds"])
            if "settle_seconds" in options:
                self.settle_seconds = float(options["settle_seconds"])
            if "delete_seconds" in options:
                self.delete_seconds = float(options["delete_seconds"])
            if "server_delete_seconds" in options:
                v = options["server_delete_seconds"]
                self.server_delete_seconds = None if v is None else float(v)
            if "list_lag" in options:
                self.list_lag = float(options["list_lag"])
            if "token_ttl" in options:
                self.token_ttl = float(options["token_ttl"])
            if "sold_out" in options:
                self.sold_out = {tuple(x) for x in options["sold_out"]}
            if "full_hosts" in options:
                self.full_hosts = {tuple(x) for x in options["full_hosts"]}
            if "bucket_release_seconds" in options:
                self.bucket_release_seconds = float(options["bucket_release_seconds"])
            if "foreign_buckets" in options:
                self.foreign_buckets = set(options["foreign_buckets"] or [])
            if "flavor_sale" in options:
                self.flavor_sale = {str(k): dict(v) for k, v in
                                    (options["flavor_sale"] or {}).items()}
            if "credential_seconds" in options:  # agency credentials' lifetime
                v = float(options["credential_seconds"])
                if not 1 <= v <= 86400:
                    raise ValueError(f"credential_seconds {v}: use 1 to 86400")
                self.credential_seconds = v
            if "eip_pools" in options:
                self.eip_pools = [str(t) for t in options["eip_pools"]]
            if "edge_zones" in options:
                self.edge_zones = [str(z) for z in options["edge_zones"]]
            if "image_flavor_refusals" in options:
                self.image_flavor_refusals = {tuple(x)
                                              for x in options["image_flavor_refusals"]}


def dispatch(cloud: Cloud, call: Call) -> tuple[int, Any]:
    """Carry out ``call`` (the caller holds ``cloud.lock``).  A body of the wrong shape —
    a string where the API has an object, ``"size": "abc"`` — is the service's 400, as the
    real services answer it, not a crash of the emulator (a 500 no Huawei Cloud gives);
    the traceback goes to the emulator's log, where a test that meant a valid call sees it."""
    try:
        return getattr(cloud, call.action)(call)
    except ApiError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as e:
        log.warning("emulator: %s.%s could not read its request (%s: %s)", call.service,
                    call.action, type(e).__name__, e, exc_info=True)
        raise bad_request(call.service, f"the request does not fit {call.action}: "
                          f"{type(e).__name__}: {e}") from None


def dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
