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
import hashlib
import ipaddress
import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request, conflict, not_found, quota_exceeded

DEFAULT_QUOTAS = {
    "instances": 200, "cores": 800, "ram": 3_276_800,  # ram in MiB, as ECS counts it
    "vpc": 5, "subnet": 100, "security_group": 100, "security_group_rule": 500,
    "publicip": 20, "nat": 5, "agency": 50, "bucket": 100, "keypair": 100,
}
MAX_TAGS = 10
MAX_USER_DATA = 32 * 1024
PAGE_DEFAULT = 25

FLAVORS = [
    # id, vcpus, ram MiB, family note
    ("s6.small.1", 1, 1024), ("s6.medium.2", 1, 2048), ("s6.large.2", 2, 4096),
    ("s6.xlarge.2", 4, 8192), ("s6.2xlarge.2", 8, 16384), ("c7.large.2", 2, 4096),
    ("c7.xlarge.2", 4, 8192), ("c7.2xlarge.4", 8, 32768), ("m7.xlarge.8", 4, 32768),
]

IMAGES = [
    ("Ubuntu 18.04 server 64bit", "Ubuntu", "Ubuntu 18.04 server 64bit", "2021-03-01T00:00:00Z"),
    ("Ubuntu 20.04 server 64bit", "Ubuntu", "Ubuntu 20.04 server 64bit", "2023-06-01T00:00:00Z"),
    ("Ubuntu 22.04 server 64bit", "Ubuntu", "Ubuntu 22.04 server 64bit", "2024-09-01T00:00:00Z"),
    ("CentOS 7.9 64bit", "CentOS", "CentOS 7.9 64bit", "2022-01-01T00:00:00Z"),
]

ROLES = [
    ("ECS FullAccess", "system_ecs_full", "ecs"),
    ("OBS OperateAccess", "system_obs_operate", "obs"),
    ("OBS ReadOnlyAccess", "system_obs_read", "obs"),
    ("VPC ReadOnlyAccess", "system_vpc_read", "vpc"),
]

TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fa5]{1,36}$")
TAG_VALUE_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fa5]{0,43}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
NAME_RE = re.compile(r"^[A-Za-z0-9_\-.\u4e00-\u9fa5]{1,64}$")


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
        self.sold_out: set[tuple[str, str]] = set()  # (flavor, zone) without capacity
        # (flavor, zone) that the flavor listing still shows as "normal" but whose hosts are
        # full: the cloud's view lags, and only the create call finds out (as it happens)
        self.full_hosts: set[tuple[str, str]] = set()
        self.boot_seconds = boot_seconds
        self.settle_seconds = settle_seconds
        self.quotas = dict(DEFAULT_QUOTAS)
        self.lock = threading.RLock()
        self.r: dict[str, dict[str, dict[str, Any]]] = {
            k: {} for k in ("vpc", "subnet", "security_group", "security_group_rule",
                            "peering", "routetable", "publicip", "nat", "snat", "agency",
                            "keypair", "server", "job", "bucket")
        }
        self.role_grants: list[tuple[str, str]] = []  # (agency id, role id)
        self.client_tokens: dict[str, dict[str, Any]] = {}
        self.pending_faults: dict[str, list[str]] = {}  # action -> fault kinds for the cloud
        self._private = iter(list(private_net.hosts())[1:])
        self._public = iter(list(public_net.hosts())[1:])
        self._free_private: list[str] = []
        self._free_public: list[str] = []
        self._seq = itertools.count(1)
        self.images = [
            {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "name": name, "platform": plat,
             "os_version": ver, "created_at": created}
            for name, plat, ver, created in IMAGES
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

    def _alloc_private(self) -> str:
        if self._free_private:
            return self._free_private.pop(0)
        try:
            return str(next(self._private))
        except StopIteration:
            raise ApiError(409, "Ecs.0620", "No free private IP addresses left in the "
                           "emulator's address range.", "ecs") from None

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
                sub["error_code"] = "Ecs.0010"
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
                job["error_code"] = failed[0].get("error_code") or "Ecs.0010"

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
        if not any(r["id"] == rid for r in self.roles):
            raise not_found("iam", "role", rid)
        if (aid, rid) not in self.role_grants:
            self.role_grants.append((aid, rid))
        return 204, None

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
                "dhcp_enable": True, "primary_dns": "100.125.1.250",
                "secondary_dns": "100.125.21.250", "availability_zone": s["availability_zone"],
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
        self._check_quota("vpc", "subnet")
        s = {"id": new_id(), "name": opt.get("name") or "", "cidr": str(net),
             "gateway_ip": str(gw), "vpc_id": vpc["id"], "status": "UNKNOWN",
             "availability_zone": opt.get("availability_zone") or "",
             "neutron_subnet_id": new_id(), "created_at": now_iso(),
             "ready_at": time.time() + self.settle_seconds}
        self.r["subnet"][s["id"]] = s
        return 200, {"subnet": self._subnet_view(s)}

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
        if ipaddress.ip_network(a["cidr"]).overlaps(ipaddress.ip_network(b["cidr"])):
            raise bad_request("vpc", f"the CIDR blocks {a['cidr']} and {b['cidr']} overlap",
                              "VPC.0403")
        p = {"id": new_id(), "name": opt.get("name") or "", "status": "ACTIVE",
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

    def create_publicip(self, call: Call):
        body = self._body(call)
        pub = body.get("publicip") or {}
        bw = body.get("bandwidth") or {}
        if pub.get("type") not in ("5_bgp", "5_sbgp", "5_telcom", "5_union"):
            raise bad_request("eip", f"publicip.type {pub.get('type')!r} is not supported")
        size = bw.get("size") or 0
        if bw.get("share_type") not in ("PER", "WHOLE") or not 1 <= int(size) <= 2000:
            raise bad_request("eip", "bandwidth.share_type must be PER or WHOLE and size 1..2000")
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
        if str(opt.get("spec")) not in ("1", "2", "3", "4"):
            raise bad_request("nat", f"spec {opt.get('spec')!r} must be 1, 2, 3 or 4")
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
        if any(r["nat_gateway_id"] == nid for r in self.r["snat"].values()):
            raise conflict("nat", "The NAT gateway still has SNAT rules.", "NAT.0013")
        del self.r["nat"][nid]
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
        del self.r["snat"][rid]
        eip = self.r["publicip"].get(r["floating_ip_id"])
        if eip and not any(x["floating_ip_id"] == eip["id"] for x in self.r["snat"].values()):
            eip["status"] = "DOWN"
        return 204, None

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
        if q.get("__imagetype") and q["__imagetype"] != "gold":
            items = []
        key = q.get("sort_key") or "created_at"
        if key not in ("created_at", "name", "id"):
            raise bad_request("ims", f"sort_key {key!r} is not supported")
        items.sort(key=lambda i: i[key], reverse=(q.get("sort_dir") or "desc") == "desc")
        out = [{"id": i["id"], "name": i["name"], "status": "active", "visibility": "public",
                "__platform": i["platform"], "__os_version": i["os_version"],
                "__imagetype": "gold", "__os_type": "Linux", "__os_bit": "64",
                "__isregistered": "true", "__support_kvm": "true", "min_disk": 40,
                "min_ram": 0, "disk_format": "zvhd2", "container_format": "bare",
                "protected": True, "created_at": i["created_at"],
                "updated_at": i["created_at"], "virtual_env_type": "FusionCompute",
                "owner": "public", "size": 0, "tags": []}
               for i in self._page_marker(items, q, default=500)]
        return 200, {"images": out}

    # ============================================================== KPS ==================
    def _keypair_view(self, k, private: bool = False):
        out = {"name": k["name"], "type": "ssh", "public_key": k["public_key"],
               "fingerprint": k["fingerprint"], "user_id": "emulated-user"}
        if private:
            out["private_key"] = k["private_key"]
        return out

    def create_keypair(self, call: Call):
        opt = self._body(call, "keypair")
        name = opt.get("name") or ""
        if not re.match(r"^[A-Za-z0-9_-]{1,64}$", name):
            raise bad_request("kps", f"key pair name {name!r} is invalid")
        if any(k["name"] == name for k in self.r["keypair"].values()):
            raise conflict("kps", f"A key pair named {name} already exists.", "KPS.0003")
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
             "created": int(time.time() * 1000)}
        self.r["keypair"][name] = k
        view = self._keypair_view(k, private=private_key is not None)
        k["private_key"] = None  # the cloud gives the private key once and forgets it
        return 200, {"keypair": view}

    def list_keypairs(self, call: Call):
        items = sorted(self.r["keypair"].values(), key=lambda k: k["id"])
        page = self._page_marker([{**k, "id": k["name"]} for k in items], call.query, 1000)
        nxt = page[-1]["name"] if page and page[-1]["name"] != items[-1]["name"] else None
        return 200, {"keypairs": [{"keypair": self._keypair_view(k)} for k in page],
                     "page_info": {"next_marker": nxt, "current_count": len(page)}}

    def list_keypair_detail(self, call: Call):
        k = self._get("keypair", call.params["keypair_name"], "kps", "key pair")
        return 200, {"keypair": {**self._keypair_view(k), "id": k["id"], "scope": "user",
                                 "is_key_protection": False, "deleted": False,
                                 "create_time": k["created"], "update_time": k["created"],
                                 "frozen_state": 0}}

    def delete_keypair(self, call: Call):
        name = call.params["keypair_name"]
        self._get("keypair", name, "kps", "key pair")
        del self.r["keypair"][name]
        return 204, None

    # ============================================================== ECS ==================
    def _flavor(self, fid: str) -> tuple[str, int, int] | None:
        return next((f for f in FLAVORS if f[0] == fid), None)

    def list_flavors(self, call: Call):
        zone = call.query.get("availability_zone")
        if zone and zone not in self.zones:
            raise bad_request("ecs", f"availability_zone {zone} does not exist")
        out = []
        for fid, vcpus, ram in FLAVORS:
            az = ",".join(f"{z}({'sellout' if (fid, z) in self.sold_out else 'normal'})"
                          for z in self.zones)
            if zone and (fid, zone) in self.sold_out:
                continue
            out.append({"id": fid, "name": fid, "vcpus": str(vcpus), "ram": ram, "disk": "0",
                        "swap": "", "OS-FLV-EXT-DATA:ephemeral": 0,
                        "OS-FLV-DISABLED:disabled": False, "rxtx_factor": 1.0,
                        "os-flavor-access:is_public": True, "links": [],
                        "os_extra_specs": {"cond:operation:status": "normal",
                                           "cond:operation:az": az,
                                           "cond:spot:operation:az": az,
                                           "ecs:performancetype": "normal",
                                           "ecs:virtualization_env_types": "CloudCompute"}})
        return 200, {"flavors": out}

    def nova_list_availability_zones(self, call: Call):
        return 200, {"availabilityZoneInfo": [
            {"zoneName": z, "zoneState": {"available": True}, "hosts": None}
            for z in self.zones]}

    def list_server_az_info(self, call: Call):
        return 200, {"availability_zones": [
            {"availability_zone_id": z, "type": "Core", "mode": "single",
             "public_border_group": "center", "alias": z, "az_group_ids": [],
             "category": 0} for z in self.zones]}

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
        token = call.headers.get("x-client-token")
        if token and token in self.client_tokens:
            return 200, self.client_tokens[token]
        spec = self._body(call, "server")
        count = spec.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= 500:
            raise bad_request("ecs", f"count {count!r} must be 1..500")
        fid = spec.get("flavorRef")
        flavor = self._flavor(fid or "")
        if flavor is None:
            raise bad_request("ecs", f"flavorRef {fid!r} does not exist", "Ecs.0003")
        zone = spec.get("availability_zone") or self.zones[0]
        if zone not in self.zones:
            raise bad_request("ecs", f"availability_zone {zone} does not exist", "Ecs.0019")
        if (fid, zone) in self.sold_out:
            raise ApiError(400, "Ecs.0039", f"Flavor {fid} is sold out in {zone}.", "ecs")
        if (fid, zone) in self.full_hosts:
            raise ApiError(400, "Ecs.0039", f"Flavor {fid} is sold out in {zone}: "
                           "insufficient capacity.", "ecs")
        image = next((i for i in self.images if i["id"] == spec.get("imageRef")), None)
        if image is None:
            raise bad_request("ecs", f"imageRef {spec.get('imageRef')!r} does not exist",
                              "Ecs.0004")
        vpc = self._get("vpc", spec.get("vpcid") or "-", "ecs", "vpc")
        nics = spec.get("nics") or []
        if len(nics) != 1:
            raise bad_request("ecs", "exactly one nic is supported here")
        sub = self._get("subnet", nics[0].get("subnet_id") or "-", "ecs", "subnet")
        if sub["vpc_id"] != vpc["id"]:
            raise bad_request("ecs", "the nic's subnet is not in vpcid", "Ecs.0011")
        sgs = [g.get("id") for g in spec.get("security_groups") or []]
        for g in sgs:
            self._get("security_group", g or "-", "ecs", "security group")
        if spec.get("key_name") and spec["key_name"] not in self.r["keypair"]:
            raise bad_request("ecs", f"key pair {spec['key_name']} does not exist", "Ecs.0314")
        metadata = dict(spec.get("metadata") or {})
        agency = metadata.get("agency_name")
        if agency and not any(a["name"] == agency for a in self.r["agency"].values()):
            raise bad_request("ecs", f"agency {agency} does not exist", "Ecs.0051")
        tags = spec.get("server_tags") or []
        self._check_tags(tags)
        user_data = spec.get("user_data") or ""
        if len(user_data) > MAX_USER_DATA:
            raise bad_request("ecs", "user_data is longer than 32 KB", "Ecs.0014")
        try:
            script = base64.b64decode(user_data, validate=True) if user_data else b""
        except ValueError:
            raise bad_request("ecs", "user_data is not base64", "Ecs.0014") from None
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

        base = spec.get("name") or "server"
        job_id = uuid.uuid4().hex
        ids, subs = [], []
        for i in range(count):
            sid = new_id()
            name = base if count == 1 or not spec.get("is_auto_rename", True) else (
                f"{base}-{i + 1:04d}")
            if i in fail_idx:
                subs.append({"server_id": sid, "failed": True, "status": "FAIL",
                             "job_id": uuid.uuid4().hex, "error_code": "Ecs.0010",
                             "fail_reason": "EcsCapacityInsufficient: the host pool has no "
                                            f"free capacity for {fid} in {zone}"})
                ids.append(sid)
                continue
            srv = {
                "id": sid, "name": name, "status": "BUILD", "flavor": fid, "vcpus": vcpus,
                "ram": ram, "image": image["id"], "zone": zone, "vpc_id": vpc["id"],
                "subnet_id": sub["id"], "security_groups": sgs,
                "key_name": spec.get("key_name"), "metadata": metadata,
                "tags": {t["key"]: t.get("value", "") for t in tags},
                "user_data": user_data, "script": script.decode("utf-8", "replace"),
                "private_ip": self._alloc_private(), "port_id": new_id(),
                "created_at": now_iso(), "ready_at": time.time() + self.boot_seconds,
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
            self.client_tokens[token] = answer
        return 200, answer

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
            "OS-EXT-STS:task_state": "spawning" if s["status"] == "BUILD" else None,
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
        items = self._visible_servers()
        if q.get("tags"):
            want = [t for t in q["tags"].split(",") if t]
            items = [s for s in items
                     if all(w in {f"{k}={v}" for k, v in s["tags"].items()} or
                            ("=" not in w and w in s["tags"]) for w in want)]
        if q.get("not-tags"):
            nots = [t for t in q["not-tags"].split(",") if t]
            items = [s for s in items if not any(n in s["tags"] for n in nots)]
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
        if not 1 <= limit <= 1000 or offset < 0:
            raise bad_request("ecs", "limit must be 1..1000 and offset >= 0")
        start = (max(offset, 1) - 1) * limit
        return 200, {"count": len(items),
                     "servers": [self._server_view(s) for s in items[start:start + limit]]}

    def show_server(self, call: Call):
        s = self.r["server"].get(call.params["server_id"])
        if s is None or s["status"] == "DELETED":
            raise not_found("ecs", "Instance", call.params["server_id"])
        return 200, {"server": self._server_view(s)}

    def delete_servers(self, call: Call):
        body = self._body(call)
        ids = [x.get("id") for x in body.get("servers") or []]
        if not ids or len(ids) > 1000:
            raise bad_request("ecs", "servers must list 1..1000 servers")
        gone = []
        for sid in ids:
            s = self.r["server"].get(sid or "")
            if s is None or s["status"] == "DELETED":
                continue
            s["status"] = "DELETED"
            gone.append(sid)
            self._free_private.append(s["private_ip"])
            eip = self.r["publicip"].get(s.get("eip_id") or "")
            if eip:
                if body.get("delete_publicip") or eip.get("delete_on_termination"):
                    del self.r["publicip"][eip["id"]]
                    self._free_public.append(eip["address"])
                else:
                    eip.update(server_id=None, status="DOWN", port_id=None, private_ip=None)
        job_id = uuid.uuid4().hex
        self.r["job"][job_id] = {"id": job_id, "type": "deleteServers", "status": "RUNNING",
                                 "begin_time": now_iso(), "sub_jobs": [],
                                 "ready_at": time.time() + self.settle_seconds}
        return 200, {"job_id": job_id, "_stopped": gone}

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
        if not BUCKET_RE.match(bucket) or ".." in bucket:
            raise ApiError(400, "InvalidBucketName", f"The bucket name {bucket} is invalid.",
                           "obs")
        if bucket in self.r["bucket"]:
            raise ApiError(409, "BucketAlreadyOwnedByYou",
                           f"Your previous request to create the named bucket {bucket} "
                           "succeeded and you already own it.", "obs")
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
        return 204, None

    def obs_put_object(self, call: Call, bucket: str, key: str):
        b = self.r["bucket"].get(bucket)
        if b is None:
            raise ApiError(404, "NoSuchBucket", "The specified bucket does not exist", "obs")
        b["objects"][key] = call.body if isinstance(call.body, bytes) else b""
        return 200, None

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
        contents = "".join(f"<Contents><Key>{k}</Key><Size>{len(v)}</Size></Contents>"
                           for k, v in sorted(b["objects"].items()))
        return 200, ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>"
                     f"{bucket}</Name><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
                     f"{contents}</ListBucketResult>")

    # ============================================================== views ================
    def summary(self) -> dict[str, Any]:
        """Everything that exists, for tests and for the user's "is anything left?"."""
        with self.lock:
            servers = [{"id": s["id"], "name": s["name"], "status": s["status"],
                        "tags": dict(s["tags"]), "private_ip": s["private_ip"],
                        "flavor": s["flavor"], "zone": s["zone"], "spot": s["spot"],
                        "key_name": s.get("key_name"), "metadata": dict(s["metadata"]),
                        "user_data": s["user_data"]}
                       for s in self._visible_servers()]
            return {
                "servers": servers,
                "vpcs": [{"id": v["id"], "name": v["name"], "cidr": v["cidr"]}
                         for v in self.r["vpc"].values()],
                "subnets": [{"id": s["id"], "name": s["name"], "vpc_id": s["vpc_id"]}
                            for s in self.r["subnet"].values()],
                "security_groups": [{"id": g["id"], "name": g["name"]}
                                    for g in self.r["security_group"].values()],
                "publicips": [{"id": e["id"], "alias": e.get("alias"),
                               "address": e["address"], "server_id": e.get("server_id")}
                              for e in self.r["publicip"].values()],
                "nat_gateways": [{"id": n["id"], "name": n["name"], "status": n["status"]}
                                 for n in self.r["nat"].values()],
                "snat_rules": [{"id": r["id"], "nat_gateway_id": r["nat_gateway_id"]}
                               for r in self.r["snat"].values()],
                "peerings": [{"id": p["id"], "name": p["name"]}
                             for p in self.r["peering"].values()],
                "agencies": [{"id": a["id"], "name": a["name"]}
                             for a in self.r["agency"].values()],
                "keypairs": [{"name": k["name"]} for k in self.r["keypair"].values()],
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
            if "sold_out" in options:
                self.sold_out = {tuple(x) for x in options["sold_out"]}
            if "full_hosts" in options:
                self.full_hosts = {tuple(x) for x in options["full_hosts"]}


def dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
