"""The HTTP face of the emulator: real API paths, signature checks, faults, a request log.

One tornado application serves every service on one port (a real account has one host
per service; a client is pointed at this one address for all of them).  OBS is reached
the way the SDK addresses buckets, ``http://BUCKET.obs.REGION.emulated.invalid/``: the
client sends those requests to this server as its HTTP proxy, and the bucket is read from
the Host header, exactly as OBS does.

Admin endpoints under ``/_emulator/`` (header ``X-Emulator-Token``) inject faults, change
quotas, and show what exists and which requests were made.  ``/_emulator/metadata/ID/``
is the instance metadata service of server ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import json
import logging
import os
import random
import re
import secrets
import string
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import tornado.httpserver
import tornado.netutil
import tornado.web
from tornado.ioloop import PeriodicCallback

from jupyter_cloudtik.core import env as envnames

from .agency_credentials import check_temporary_credential, issue_temporary_credential
from .cloud import COLLEAGUE_USER, DEFAULT_USER, Call, Cloud, dispatch, now_iso
from .errors import BAD_SIGNATURE, THROTTLED, ApiError, quota_exceeded
from .machines import Machines, reap_children
from .signing import SignatureError, verify_obs_signature, verify_sdk_signature

log = logging.getLogger("jupyter_cloudtik.emulator")

# (method, path template, action, service) — the paths the huaweicloudsdk* clients call
ROUTES: list[tuple[str, str, str, str]] = [
    ("POST", "/v1/{project_id}/cloudservers", "create_post_paid_servers", "ecs"),
    ("GET", "/v1/{project_id}/jobs/{job_id}", "show_job", "ecs"),
    ("GET", "/v1/{project_id}/cloudservers/detail", "list_servers_details", "ecs"),
    ("GET", "/v1/{project_id}/cloudservers/flavors", "list_flavors", "ecs"),
    ("GET", "/v1/{project_id}/cloudservers/limits", "show_server_limits", "ecs"),
    ("POST", "/v1/{project_id}/cloudservers/delete", "delete_servers", "ecs"),
    ("POST", "/v1/{project_id}/cloudservers/{server_id}/tags/action",
     "batch_create_server_tags", "ecs"),
    ("GET", "/v1/{project_id}/cloudservers/{server_id}", "show_server", "ecs"),
    ("GET", "/v1/{project_id}/cloudservers/{server_id}/console-output",
     "show_server_console_output", "ecs"),
    ("GET", "/v2.1/{project_id}/os-availability-zone", "nova_list_availability_zones", "ecs"),
    ("GET", "/v1/{project_id}/availability-zones", "list_server_az_info", "ecs"),
    ("POST", "/v1/{project_id}/vpcs", "create_vpc", "vpc"),
    ("GET", "/v1/{project_id}/vpcs", "list_vpcs", "vpc"),
    ("GET", "/v1/{project_id}/vpcs/{vpc_id}", "show_vpc", "vpc"),
    ("DELETE", "/v1/{project_id}/vpcs/{vpc_id}", "delete_vpc", "vpc"),
    ("POST", "/v1/{project_id}/subnets", "create_subnet", "vpc"),
    ("GET", "/v1/{project_id}/subnets", "list_subnets", "vpc"),
    ("GET", "/v1/{project_id}/subnets/{subnet_id}", "show_subnet", "vpc"),
    ("PUT", "/v1/{project_id}/vpcs/{vpc_id}/subnets/{subnet_id}", "update_subnet", "vpc"),
    ("DELETE", "/v1/{project_id}/vpcs/{vpc_id}/subnets/{subnet_id}", "delete_subnet", "vpc"),
    ("POST", "/v1/{project_id}/security-groups", "create_security_group", "vpc"),
    ("GET", "/v1/{project_id}/security-groups", "list_security_groups", "vpc"),
    ("DELETE", "/v1/{project_id}/security-groups/{security_group_id}",
     "delete_security_group", "vpc"),
    ("POST", "/v1/{project_id}/security-group-rules", "create_security_group_rule", "vpc"),
    ("GET", "/v1/{project_id}/security-group-rules", "list_security_group_rules", "vpc"),
    ("DELETE", "/v1/{project_id}/security-group-rules/{security_group_rule_id}",
     "delete_security_group_rule", "vpc"),
    ("POST", "/v2.0/vpc/peerings", "create_vpc_peering", "vpc"),
    ("GET", "/v2.0/vpc/peerings", "list_vpc_peerings", "vpc"),
    ("DELETE", "/v2.0/vpc/peerings/{peering_id}", "delete_vpc_peering", "vpc"),
    ("GET", "/v1/{project_id}/routetables", "list_route_tables", "vpc"),
    ("GET", "/v1/{project_id}/routetables/{routetable_id}", "show_route_table", "vpc"),
    ("PUT", "/v1/{project_id}/routetables/{routetable_id}", "update_route_table", "vpc"),
    ("POST", "/v1/{project_id}/publicips", "create_publicip", "eip"),
    ("GET", "/v3/{project_id}/eip/publicip-pools/common-pools", "list_common_pools", "eip"),
    ("GET", "/v1/{project_id}/publicips", "list_publicips", "eip"),
    ("GET", "/v1/{project_id}/publicips/{publicip_id}", "show_publicip", "eip"),
    ("DELETE", "/v1/{project_id}/publicips/{publicip_id}", "delete_publicip", "eip"),
    ("POST", "/v2/{project_id}/nat_gateways", "create_nat_gateway", "nat"),
    ("GET", "/v2/{project_id}/nat_gateways", "list_nat_gateways", "nat"),
    ("GET", "/v2/{project_id}/nat_gateways/{nat_gateway_id}", "show_nat_gateway", "nat"),
    ("DELETE", "/v2/{project_id}/nat_gateways/{nat_gateway_id}", "delete_nat_gateway", "nat"),
    ("POST", "/v2/{project_id}/snat_rules", "create_nat_gateway_snat_rule", "nat"),
    ("GET", "/v2/{project_id}/snat_rules", "list_nat_gateway_snat_rules", "nat"),
    ("DELETE", "/v2/{project_id}/nat_gateways/{nat_gateway_id}/snat_rules/{snat_rule_id}",
     "delete_nat_gateway_snat_rule", "nat"),
    ("GET", "/v3/auth/domains", "keystone_list_auth_domains", "iam"),
    ("GET", "/v3/projects", "keystone_list_projects", "iam"),
    ("GET", "/v3/roles", "keystone_list_permissions", "iam"),
    ("POST", "/v3.0/OS-AGENCY/agencies", "create_agency", "iam"),
    ("GET", "/v3.0/OS-AGENCY/agencies", "list_agencies", "iam"),
    ("DELETE", "/v3.0/OS-AGENCY/agencies/{agency_id}", "delete_agency", "iam"),
    ("PUT", "/v3.0/OS-INHERIT/domains/{domain_id}/agencies/{agency_id}/roles/{role_id}"
            "/inherited_to_projects", "associate_agency_with_all_projects_permission", "iam"),
    ("POST", "/v3.0/OS-ROLE/roles", "create_cloud_service_custom_policy", "iam"),
    ("GET", "/v3.0/OS-ROLE/roles", "list_custom_policies", "iam"),
    ("DELETE", "/v3.0/OS-ROLE/roles/{role_id}", "delete_custom_policy", "iam"),
    ("GET", "/v2/cloudimages", "list_images", "ims"),
    ("POST", "/v1.0/resource-tags/batch-create", "create_resource_tag", "tms"),
    ("POST", "/v1.0/resource-tags/batch-delete", "delete_resource_tag", "tms"),
    ("POST", "/v3/{project_id}/keypairs", "create_keypair", "kps"),
    ("GET", "/v3/{project_id}/keypairs", "list_keypairs", "kps"),
    ("GET", "/v3/{project_id}/keypairs/{keypair_name}", "list_keypair_detail", "kps"),
    ("DELETE", "/v3/{project_id}/keypairs/{keypair_name}", "delete_keypair", "kps"),
]
CREATE_ACTIONS = {a for m, _, a, _ in ROUTES if a.startswith("create_")}
# slow_response: the call is carried out and its answer comes ``delay`` seconds later (a
# client killed meanwhile never learns what the cloud made)
# rate_window: every matching call is throttled for ``delay`` seconds from the first one,
# with the window in the answer ("...over ratelimit,limit:N,time:W second"), as the API
# gateway's per-second/per-minute flow control answers (FAQ "How Do I Handle the Error
# APIG.0308?": "time:1 minute")
FAULT_KINDS = ("throttle", "error", "lost_response", "quota", "half_fail", "server_error",
               "slow_response", "rate_window")
OBS_DOMAIN = "emulated.invalid"
# TMS (tags) answers at one endpoint per site, not per region, and an account exists on one
# site only (the SDK's huaweicloudsdktms/v1/region/tms_region.py: cn-north-4
# tms.myhuaweicloud.com, ap-southeast-1 tms-intl.myhuaweicloud.com, eu-west-101
# tms.eu-west-101.myhuaweicloud.eu, ru-moscow-1 and my-kualalumpur-1 their own; the Europe
# site's API reference, "The endpoint of TMS is tms.myhuaweicloud.eu",
# https://support.huaweicloud.com/eu/api-tms/en-us_topic_0126416748.html).  Here each is a
# host name under OBS_DOMAIN reached through this server as the proxy (as OBS is):
# ``tms.`` (the Chinese site), ``tms-intl.`` (the international site), ``tms.REGION.``.
TMS_SITE_HOSTS = {"cn": "tms", "intl": "tms-intl", "eu-west-101": "tms.eu-west-101",
                  "ru-moscow-1": "tms.ru-moscow-1",
                  "my-kualalumpur-1": "tms.my-kualalumpur-1"}


def account_site(region: str) -> str:
    """The site an account working in ``region`` was made on, as far as the region tells:
    the Europe site and dedicated regions are their own; cn-* the Chinese site; else the
    international site (``Options.site`` says otherwise, e.g. an international account
    in a cn-* region)."""
    if region in TMS_SITE_HOSTS:
        return region
    return "cn" if region.startswith("cn-") else "intl"
OBS_MAX_PUT = 5 * 1024**3  # bytes, one PutObject (see _serve)


def _compile(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$")


COMPILED = [(m, _compile(t), a, s) for m, t, a, s in ROUTES]


@dataclass
class Fault:
    action: str          # glob over "service.action", e.g. "ecs.create_*" or "*"
    kind: str
    times: int = 1
    after: int = 0       # let this many matching calls through first
    status: int = 500
    delay: float = 0.0   # slow_response: seconds before the answer
    seen: int = 0
    fired: int = 0
    started: float = 0.0  # rate_window: when its window began

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "kind": self.kind, "times": self.times,
                "after": self.after, "status": self.status, "delay": self.delay,
                "fired": self.fired}


@dataclass
class Options:
    region: str = "cn-north-4"
    #: the site the account is on (TMS_SITE_HOSTS' keys); default: account_site(region)
    site: str | None = None
    project_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    domain_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    access_key: str = field(default_factory=lambda: "EMU" + "".join(
        random.choices(string.ascii_uppercase + string.digits, k=17)))
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    #: a second IAM user of the same account (profile ``colleague`` of the credentials
    #: file): what a user-scope key pair of the first is hidden from
    colleague_access_key: str = field(default_factory=lambda: "EMC" + "".join(
        random.choices(string.ascii_uppercase + string.digits, k=17)))
    colleague_secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    boot: bool = True             # run user data as processes
    realistic: bool = False       # servers are separate hosts (realistic.py)
    image: str | None = None      # realistic mode: boot from a stock Debian root (suite)
    boot_seconds: float = 0.3
    settle_seconds: float = 0.1
    host: str = "127.0.0.1"
    port: int = 0


def pick_networks() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """A /21 (private, room for 2,000 servers) and a /24 (public) on the loopback range no
    other emulator on this machine is likely to use."""
    a = random.randint(100, 250)
    b = random.randrange(0, 240, 16)
    return (ipaddress.ip_network(f"127.{a}.{b}.0/21"),
            ipaddress.ip_network(f"127.{a}.{b + 8}.0/24"))


def server_loopbacks(private: ipaddress.IPv4Network) -> list[str]:
    """Fast mode: an address of its own for each server's loopback, from the seven /24s
    of the /20 that pick_networks leaves unused.  A real server's 127.0.0.1 is its own;
    emulated servers share this machine's, and two heads' dashboards on 127.0.0.1:8787
    would meet there (one bind fails and its relay serves the other's dashboard)."""
    first = ipaddress.ip_address(private.network_address) + 9 * 256
    return [str(first + n * 256 + h) for n in range(7) for h in range(1, 255)]


class Emulator:
    """The emulator: call ``start()`` (background thread) or ``run()`` (foreground)."""

    def __init__(self, root: str | os.PathLike[str], options: Options | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.options = options or Options()
        self.id = uuid.uuid4().hex[:12]
        private, public = pick_networks()
        o = self.options
        if o.realistic:
            from .realistic import public_network

            public = public_network()
        self.cloud = Cloud(region=o.region, project_id=o.project_id, domain_id=o.domain_id,
                           private_net=private, public_net=public,
                           boot_seconds=o.boot_seconds, settle_seconds=o.settle_seconds)
        self.faults: list[Fault] = []
        self.requests: list[dict[str, Any]] = []
        self.seq = 0
        self.counts: dict[str, int] = {}
        self.port = 0
        self.machines: Machines | None = None
        self.forwarders: dict[str, list[asyncio.AbstractServer]] = {}
        self.booted: set[str] = set()
        #: fast mode: server id -> its loopback address (server_loopbacks; freed at delete)
        self.loopbacks: dict[str, str] = {}
        self._free_loopbacks = server_loopbacks(private)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._server: tornado.httpserver.HTTPServer | None = None
        self._callbacks: list[PeriodicCallback] = []
        self._pending: set[asyncio.Future] = set()
        self.realistic: Any = None  # RealisticHosts in realistic mode
        #: temporary AK -> {secret, token, expires, agency, server}: the agency credentials
        #: the metadata service hands a server (see agency_credentials.py)
        self.temporary_credentials: dict[str, dict[str, Any]] = {}

    # addresses ------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    @property
    def obs_endpoint(self) -> str:
        return f"http://obs.{self.options.region}.{OBS_DOMAIN}"

    @property
    def tms_endpoint(self) -> str:
        """The account's site's TMS (reached with this server as the HTTP proxy)."""
        o = self.options
        return f"http://{TMS_SITE_HOSTS[o.site or account_site(o.region)]}.{OBS_DOMAIN}"

    def info(self) -> dict[str, Any]:
        o = self.options
        return {"endpoint": self.endpoint, "obs_endpoint": self.obs_endpoint,
                "obs_proxy": self.endpoint, "region": o.region, "project_id": o.project_id,
                "domain_id": o.domain_id, "access_key": o.access_key,
                "secret_key": o.secret_key, "colleague_access_key": o.colleague_access_key,
                "colleague_secret_key": o.colleague_secret_key,
                "admin_token": o.admin_token, "pid": os.getpid(),
                "emulator_id": self.id}

    def _write_info(self) -> None:
        """The credentials file, then emulator.json whole (renamed into place): whoever
        waits for emulator.json (``process.start_emulator``) finds both complete."""
        info = self.info()
        creds = self.root / "credentials"
        fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# Huawei Cloud credentials of the emulator (jupyter_cloudtik format)\n"
                    "[default]\n"
                    f"access_key = {info['access_key']}\nsecret_key = {info['secret_key']}\n"
                    f"project_id = {info['project_id']}\nregion = {info['region']}\n"
                    f"endpoint = {info['endpoint']}\n"
                    "# another IAM user of the same account\n[colleague]\n"
                    f"access_key = {info['colleague_access_key']}\n"
                    f"secret_key = {info['colleague_secret_key']}\n"
                    f"project_id = {info['project_id']}\nregion = {info['region']}\n"
                    f"endpoint = {info['endpoint']}\n")
        tmp = self.root / "emulator.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2)
        tmp.replace(self.root / "emulator.json")

    # life cycle -----------------------------------------------------------------------
    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        app = make_app(self)
        # OBS takes an object of up to 5 GB in one PUT ("Uploading an object in a single
        # operation: ... not more than 5 GB", https://support.huaweicloud.com/en-us/
        # devg-obs/obs_06_0028.html); tornado's own default is 100 MB (pyspark's wheel,
        # which the Spark runtime stages, is 450 MB)
        self._server = tornado.httpserver.HTTPServer(app, xheaders=False,
                                                     max_body_size=OBS_MAX_PUT)
        sockets = tornado.netutil.bind_sockets(self.options.port, self.options.host)
        self._server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        self.machines = Machines(self.root, f"{self.endpoint}/_emulator/metadata", self.id)
        self.cloud.console_reader = self.machines.console_output
        if self.options.realistic:
            from .realistic import RealisticHosts

            self.realistic = RealisticHosts(self)
        self._callbacks = [PeriodicCallback(self._tick, 50),
                           PeriodicCallback(self._watch_machines, 1000)]
        for cb in self._callbacks:
            cb.start()
        self._write_info()

    def start(self) -> Emulator:
        """Serve on a background thread; returns once the port is known."""
        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve())
            self._started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="hwc-emulator", daemon=True)
        self._thread.start()
        self._started.wait(30)
        return self

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)

    async def _shutdown(self) -> None:
        for cb in self._callbacks:
            cb.stop()
        if self._server is not None:
            self._server.stop()
        for servers in self.forwarders.values():
            for s in servers:
                s.close()
        self.forwarders.clear()
        if self.machines is not None:
            await asyncio.to_thread(self.machines.stop_all)
        if self.realistic is not None:
            self.realistic.shutdown()

    def run(self) -> None:
        """Serve in the foreground until SIGINT/SIGTERM, then stop every server's processes."""
        import signal

        async def main() -> None:
            await self._serve()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            self._stop_event = stop
            self._started.set()
            await stop.wait()
            await self._shutdown()

        asyncio.run(main())

    def request_stop(self) -> None:
        ev = getattr(self, "_stop_event", None)
        if ev is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(ev.set)
        else:
            self.stop()

    # time -------------------------------------------------------------------------------
    def _tick(self) -> None:
        eff = self.cloud.advance()
        for srv in eff.boot:
            self._boot(srv)

    def _boot(self, srv: dict[str, Any]) -> None:
        sid = srv["id"]
        if self.machines is None or sid in self.booted:
            return
        self.booted.add(sid)
        if self.options.boot:
            if self.realistic is not None:
                try:
                    self.machines.boot(srv, *self.realistic.prepare(srv))
                except Exception as e:  # the host could not be made: the server fails
                    log.exception("server %s: could not make its host", sid)
                    with self.cloud.lock:
                        srv["status"] = "ERROR"
                        srv["fault"] = {"code": 500, "message": f"host: {e}",
                                        "created": now_iso()}
            else:
                self.machines.boot(srv, env=self._loopback_env(sid))
        if srv.get("eip_id"):
            task = asyncio.ensure_future(self._open_forwarders(srv))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _loopback_env(self, sid: str) -> dict[str, str]:
        if sid not in self.loopbacks and self._free_loopbacks:
            self.loopbacks[sid] = self._free_loopbacks.pop(0)
        lo = self.loopbacks.get(sid)
        return {envnames.NODE_LOOPBACK: lo} if lo else {}

    def _watch_machines(self) -> None:
        if self.machines is None:
            return
        if self.machines.subreaper:
            reap_children()
        if self.realistic is not None:
            self.realistic.sync()
        if not self.options.boot:
            return
        with self.cloud.lock:
            active = [s["id"] for s in self.cloud.r["server"].values()
                      if s["status"] == "ACTIVE" and s["id"] in self.booted]
        for sid in active:
            if sid not in self.machines.procs:
                continue
            if not self.machines.alive(sid):
                with self.cloud.lock:
                    s = self.cloud.r["server"].get(sid)
                    if s and s["status"] == "ACTIVE":
                        s["status"] = "SHUTOFF"
                log.info("server %s powered off: its processes ended", sid)

    def crash_server(self, sid: str, status: str = "ERROR") -> None:
        """Fault: a running server fails (its processes are killed, it shows ``status``)."""
        with self.cloud.lock:
            s = self.cloud.r["server"].get(sid)
            if s is None or s["status"] == "DELETED":
                raise KeyError(sid)
            s["status"] = status
            s["fault"] = {"code": 500, "message": "emulated host failure", "created": now_iso()}
        if self.machines is not None:
            self.machines.stop(sid)

    def _servers_deleted(self, ids: list[str]) -> None:
        for sid in ids:
            for s in self.forwarders.pop(sid, []):
                s.close()
            if self.machines is not None:
                self.machines.stop(sid)
            if self.realistic is not None:
                self.realistic.deleted(sid)
            if (lo := self.loopbacks.pop(sid, None)) is not None:
                self._free_loopbacks.append(lo)

    async def _open_forwarders(self, srv: dict[str, Any]) -> None:
        """DNAT from the server's EIP to its private IP, for ports its security groups open
        to the loopback address the client comes from."""
        with self.cloud.lock:
            eip = self.cloud.r["publicip"].get(srv["eip_id"])
            rules = [r for r in self.cloud.r["security_group_rule"].values()
                     if r["security_group_id"] in srv["security_groups"]
                     and r["direction"] == "ingress" and r["protocol"] in ("tcp", None)]
        if eip is None:
            return
        client = ipaddress.ip_address("127.0.0.1")
        ports: set[int] = set()
        for r in rules:
            if r.get("remote_group_id"):
                continue  # traffic from other members only: not from outside
            prefix = r.get("remote_ip_prefix")
            if prefix and client not in ipaddress.ip_network(prefix):
                continue
            lo, hi = r.get("port_range_min") or 1, r.get("port_range_max") or 65535
            if hi - lo <= 64:
                ports.update(range(lo, hi + 1))
        if self.realistic is not None:
            self.realistic.bind_eip(srv, eip["address"], sorted(ports))
            return
        servers = []
        for port in sorted(ports):
            with contextlib.suppress(OSError):
                servers.append(await asyncio.start_server(
                    _forward_to(srv["private_ip"], port), eip["address"], port))
        self.forwarders[srv["id"]] = servers

    # faults -------------------------------------------------------------------------------
    def _fault_for(self, name: str) -> Fault | None:
        for f in self.faults:
            if f.kind == "rate_window" and fnmatch.fnmatchcase(name, f.action):
                now = time.monotonic()
                f.started = f.started or now
                if now - f.started < f.delay:
                    f.fired += 1
                    return f
                continue
            if f.fired >= f.times or not fnmatch.fnmatchcase(name, f.action):
                continue
            f.seen += 1
            if f.seen <= f.after:
                continue
            f.fired += 1
            return f
        return None

    def record(self, entry: dict[str, Any]) -> None:
        self.seq += 1
        entry["seq"] = self.seq
        self.requests.append(entry)
        if len(self.requests) > 20000:
            del self.requests[:5000]
        if entry.get("action"):
            self.counts[entry["action"]] = self.counts.get(entry["action"], 0) + 1


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _forward_to(host: str, port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, w2), _pipe(r2, writer))
    return handle


# ------------------------------------------------------------------------------ handlers
class ApiHandler(tornado.web.RequestHandler):
    """Every cloud API call: find the action, check the signature, apply faults, run it."""

    SUPPORTED_METHODS = ("GET", "POST", "PUT", "DELETE", "HEAD")

    def initialize(self, emu: Emulator) -> None:
        self.emu = emu

    def check_xsrf_cookie(self) -> None:
        pass

    def set_default_headers(self) -> None:
        self.clear_header("Server")

    async def get(self, *_):
        await self._handle()

    post = put = delete = head = get

    def _reply(self, status: int, body: Any, request_id: str, xml: bool = False) -> None:
        self.set_status(status)
        self.set_header("X-Request-Id", request_id)
        if body is None or self.request.method == "HEAD":
            self.finish()
            return
        if isinstance(body, bytes):  # an OBS object
            self.set_header("Content-Type", "application/octet-stream")
            self.finish(body)
        elif xml:
            self.set_header("Content-Type", "application/xml")
            self.finish(body)
        else:
            self.set_header("Content-Type", "application/json;charset=UTF-8")
            self.finish(json.dumps(body))

    async def _handle(self) -> None:
        emu, req = self.emu, self.request
        request_id = uuid.uuid4().hex
        headers = {k.lower(): v for k, v in req.headers.get_all()}
        host = (req.host or "").split(":")[0]
        query_pairs = parse_qsl(req.query, keep_blank_values=True)
        entry = {"ts": time.time(), "method": req.method, "path": req.path,
                 "query": req.query, "host": host, "body": (req.body or b"")[:65536]
                 .decode("utf-8", "replace"), "client_token": headers.get("x-client-token")}
        self._host = host
        is_obs = host.endswith(OBS_DOMAIN) and not host.startswith("tms")
        try:
            if is_obs:
                status, body, xml, name = self._obs(headers, host, query_pairs, request_id)
            else:
                status, body, name = await self._api(headers, query_pairs)
                xml = False
        except ApiError as e:
            entry.update(status=e.status, action=getattr(self, "_action", None),
                         error=e.code)
            emu.record(entry)
            if is_obs:
                self._reply(e.status, f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                            f"{e.code}</Code><Message>{e.message}</Message><RequestId>"
                            f"{request_id}</RequestId></Error>", request_id, xml=True)
            else:
                self._reply(e.status, e.body(request_id), request_id)
            return
        entry.update(status=status, action=name)
        emu.record(entry)
        self._reply(status, body, request_id, xml=xml)

    def _faults(self, name: str, service: str) -> Fault | None:
        fault = self.emu._fault_for(name)
        if fault is None:
            return None
        if fault.kind == "throttle":
            raise ApiError(429, *THROTTLED, "apigw")
        if fault.kind == "rate_window":
            raise ApiError(429, THROTTLED[0], "The throttling threshold has been reached: "
                           f"policy user over ratelimit,limit:{fault.times},"
                           f"time:{fault.delay:g} second", "apigw")
        if fault.kind == "error":
            raise ApiError(fault.status, "SYS.5000" if service != "ecs" else "Ecs.0500",
                           "Internal server error (injected)", service)
        if fault.kind == "quota":
            kind = {"ecs": "instances", "vpc": "vpc", "eip": "publicip", "nat": "nat",
                    "iam": "agency", "kps": "keypair", "obs": "bucket"}.get(service, service)
            used = len(self.emu.cloud.r.get(kind, {}))
            raise quota_exceeded(service, kind, used, used, 1)
        if fault.kind in ("half_fail", "server_error"):
            self.emu.cloud.pending_faults.setdefault(name, []).append(fault.kind)
            return None
        return fault  # lost_response: applied after the action

    def _site_check(self, service: str, req) -> None:
        """TMS only at a TMS host, and only at the account's site's; nothing else there.

        A regional endpoint has no TMS API (404 APIGW.0101, the gateway's answer for a path
        it does not publish); another site's TMS does not know the account's access key
        (401 APIGW.0301: the sites keep separate accounts)."""
        host = getattr(self, "_host", "")
        at_tms = host.startswith("tms") and host.endswith("." + OBS_DOMAIN)
        if (service == "tms") != at_tms:
            raise ApiError(404, "APIGW.0101", f"The API does not exist or has not been "
                           f"published: {req.method} {req.path}", "apigw")
        if at_tms:
            o = self.emu.options
            site = o.site or account_site(o.region)
            if host != f"{TMS_SITE_HOSTS[site]}.{OBS_DOMAIN}":
                raise ApiError(401, BAD_SIGNATURE, "Incorrect IAM authentication "
                               "information: the access key does not exist (the account "
                               "is on another site)", "apigw")

    async def _api(self, headers, query_pairs):
        emu, req = self.emu, self.request
        for method, pattern, action, service in COMPILED:  # noqa: B007 (used after the loop)
            if method != req.method:
                continue
            m = pattern.match(req.path)
            if m:
                break
        else:
            raise ApiError(404, "APIGW.0101", f"The API does not exist or has not been "
                           f"published: {req.method} {req.path}", "apigw")
        name = f"{service}.{action}"
        self._action = name
        self._site_check(service, req)
        try:
            ak = verify_sdk_signature(
                req.method, req.path, query_pairs, headers, req.body or b"",
                {emu.options.access_key: emu.options.secret_key,
                 emu.options.colleague_access_key: emu.options.colleague_secret_key})
        except SignatureError as e:
            raise ApiError(401, BAD_SIGNATURE, f"Incorrect IAM authentication information: "
                           f"{e}", "apigw") from None
        params = m.groupdict()
        pid = params.get("project_id")
        if pid is not None and pid != emu.cloud.project_id:
            raise ApiError(403, "APIGW.0305", "The project id in the path does not belong "
                           "to the caller", "apigw")
        fault = self._faults(name, service)
        body: Any = None
        if req.body:
            try:
                body = json.loads(req.body)
            except ValueError:
                raise ApiError(400, "APIGW.0201", "The request body is not JSON", "apigw") \
                    from None
        call = Call(action=action, service=service, project_id=emu.cloud.project_id,
                    params=params, query=dict(query_pairs), body=body, headers=headers,
                    user=COLLEAGUE_USER if ak == emu.options.colleague_access_key
                    else DEFAULT_USER)
        with emu.cloud.lock:
            eff = emu.cloud.advance()
            status, out = dispatch(emu.cloud, call)
        for srv in eff.boot:
            emu._boot(srv)
        if isinstance(out, dict) and "_stopped" in out:
            emu._servers_deleted(out.pop("_stopped"))
        if fault is not None and fault.kind == "lost_response":
            raise ApiError(fault.status, "SYS.5000" if service != "ecs" else "Ecs.0500",
                           "Internal server error (the request was carried out; the answer "
                           "was lost)", service)
        if fault is not None and fault.kind == "slow_response":
            await asyncio.sleep(fault.delay)
        return status, out, name

    def _obs(self, headers, host, query_pairs, request_id):
        emu, req = self.emu, self.request
        # virtual-host style: BUCKET.obs.REGION.DOMAIN (a bucket name may hold dots)
        head, sep, _ = host.partition(f".obs.{emu.options.region}.")
        bucket = head if sep and head else None
        key = req.path.lstrip("/")
        if bucket is None:
            action = "list_buckets" if req.method == "GET" else None
        elif not key:
            action = {"PUT": "create_bucket", "HEAD": "get_bucket_metadata",
                      "DELETE": "delete_bucket", "GET": "list_objects"}.get(req.method)
        else:
            action = {"PUT": "put_object", "DELETE": "delete_object",
                      "GET": "get_object"}.get(req.method)
        if action is None:
            raise ApiError(405, "MethodNotAllowed", "The method is not supported here", "obs")
        name = f"obs.{action}"
        self._action = name
        try:
            ak = verify_obs_signature(req.method, bucket, key, query_pairs, headers, {
                emu.options.access_key: emu.options.secret_key,
                emu.options.colleague_access_key: emu.options.colleague_secret_key,
                **{k: v["secret"] for k, v in emu.temporary_credentials.items()}})
        except SignatureError as e:
            raise ApiError(403 if "match" in str(e) else 401, "SignatureDoesNotMatch",
                           str(e), "obs") from None
        check_temporary_credential(emu, ak, headers)
        cred = emu.temporary_credentials.get(ak)
        if cred is not None and not emu.cloud.obs_allows(cred["agency"], action, bucket,
                                                         unquote(key) if key else None):
            # a node's agency may do what its grants allow, on what they name, only
            raise ApiError(403, "AccessDenied", "Access Denied", "obs")
        fault = self._faults(name, "obs")
        call = Call(action=action, service="obs", project_id=emu.cloud.project_id,
                    query=dict(query_pairs), body=req.body, headers=headers, host=host)
        with emu.cloud.lock:
            fn = getattr(emu.cloud, "obs_" + {"get_bucket_metadata": "head_bucket"}.get(
                action, action))
            args = (call,) if bucket is None else (call, bucket) if not key else (
                call, bucket, unquote(key))  # a%2Fb and a/b name the same object
            status, out = fn(*args)
        if fault is not None and fault.kind == "lost_response":
            raise ApiError(500, "InternalError", "We encountered an internal error", "obs")
        return status, out, isinstance(out, str), name


class AdminHandler(tornado.web.RequestHandler):
    """/_emulator/...: state, request log, faults, options, server crashes, shutdown."""

    def initialize(self, emu: Emulator) -> None:
        self.emu = emu

    def check_xsrf_cookie(self) -> None:
        pass

    def prepare(self) -> None:
        token = self.request.headers.get("X-Emulator-Token", "")
        if not secrets.compare_digest(token, self.emu.options.admin_token):
            self.set_status(401)
            self.finish({"message": "missing or wrong X-Emulator-Token"})

    def _json(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise tornado.web.HTTPError(400, "body is not JSON") from None

    def get(self, what: str) -> None:
        emu = self.emu
        if what == "state":
            state = emu.cloud.summary()
            state["counts"] = dict(emu.counts)
            state["requests"] = emu.seq
            if emu.machines is not None:
                state["processes"] = len(emu.machines.leftovers())
            if emu.realistic is not None:  # where "outside" is for each VPC's servers
                state["network"] = {vid: {"outside": v.host_ip}
                                    for vid, v in emu.realistic.net.vpcs.items()}
            self.finish(state)
        elif what == "requests":
            after = int(self.get_argument("after", "0"))
            self.finish({"requests": [r for r in emu.requests if r["seq"] > after],
                         "last": emu.seq})
        elif what == "faults":
            self.finish({"faults": [f.to_dict() for f in emu.faults]})
        elif what == "info":
            info = emu.info()
            info.pop("secret_key")
            info.pop("admin_token")
            self.finish(info)
        else:
            raise tornado.web.HTTPError(404)

    def post(self, what: str) -> None:
        emu = self.emu
        body = self._json() or {}
        if what == "faults":
            items = body if isinstance(body, list) else [body]
            for item in items:
                if item.get("kind") not in FAULT_KINDS:
                    raise tornado.web.HTTPError(400, f"kind must be one of {FAULT_KINDS}")
                emu.faults.append(Fault(action=item.get("action", "*"), kind=item["kind"],
                                        times=int(item.get("times", 1)),
                                        after=int(item.get("after", 0)),
                                        status=int(item.get("status", 500)),
                                        delay=float(item.get("delay", 0))))
            self.finish({"faults": [f.to_dict() for f in emu.faults]})
        elif what == "options":
            try:
                emu.cloud.set_options(body)
            except ValueError as e:
                raise tornado.web.HTTPError(400, str(e)) from None
            if "boot" in body:
                emu.options.boot = bool(body["boot"])
            self.finish({"ok": True})
        elif what == "crash":
            try:
                emu.crash_server(body["server_id"], body.get("status", "ERROR"))
            except KeyError:
                raise tornado.web.HTTPError(404, "no such server") from None
            self.finish({"ok": True})
        elif what == "shutdown":
            self.finish({"ok": True})
            emu.request_stop()
        else:
            raise tornado.web.HTTPError(404)

    def delete(self, what: str) -> None:
        if what == "faults":
            self.emu.faults.clear()
            self.emu.cloud.pending_faults.clear()
            self.finish({"faults": []})
        elif what == "requests":
            self.emu.requests.clear()
            self.emu.counts.clear()
            self.finish({"ok": True})
        else:
            raise tornado.web.HTTPError(404)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        msg = getattr(exc, "log_message", None) or self._reason
        self.finish({"message": msg})


class MetadataHandler(tornado.web.RequestHandler):
    """The instance metadata service a server sees at http://169.254.169.254/."""

    def initialize(self, emu: Emulator) -> None:
        self.emu = emu

    def get(self, server_id: str, path: str) -> None:
        cloud = self.emu.cloud
        with cloud.lock:
            s = cloud.r["server"].get(server_id)
            if s is None or s["status"] == "DELETED":
                raise tornado.web.HTTPError(404)
            eip = cloud.r["publicip"].get(s.get("eip_id") or "")
            meta = {"uuid": s["id"], "name": s["name"], "availability_zone": s["zone"],
                    "hostname": s["name"], "launch_index": 0, "project_id": cloud.project_id,
                    "region_id": cloud.region,
                    "meta": {**{k: v for k, v in s["metadata"].items()}, "vpc_id": s["vpc_id"]},
                    "public_keys": ({s["key_name"]: cloud.r["keypair"][s["key_name"]]
                                     ["public_key"]} if s.get("key_name") in cloud.r["keypair"]
                                    else {})}
            private_ip, public_ip = s["private_ip"], eip["address"] if eip else ""
            # the name servers DHCP hands out: the subnet's, none when it was created
            # without any (as the real metadata service shows under "services")
            network = {"services": [{"type": "dns", "address": ip}
                                    for ip in s.get("dns_servers") or []],
                       "networks": [{"network_id": s["subnet_id"], "type": "ipv4_dhcp",
                                     "id": "network0", "ip_address": private_ip}]}
        if path == "openstack/latest/meta_data.json":
            self.finish(meta)
        elif path == "openstack/latest/network_data.json":
            self.finish(network)
        elif path == "latest/meta-data/local-ipv4":
            self.finish(private_ip)
        elif path == "latest/meta-data/public-ipv4":
            self.finish(public_ip)
        elif path == "latest/meta-data/instance-id":
            self.finish(server_id)
        elif path == "openstack/latest/securitykey":
            self.finish(issue_temporary_credential(self.emu, s))
        else:
            raise tornado.web.HTTPError(404)


class App(tornado.web.Application):
    """Accepts absolute-form request targets, as an HTTP proxy does (the OBS path)."""

    def find_handler(self, request, **kwargs):
        if request.path.startswith("http://"):
            u = urlsplit(request.uri)
            request.path = u.path or "/"
            request.uri = request.path + ("?" + u.query if u.query else "")
            request.query = u.query
        return super().find_handler(request, **kwargs)


def make_app(emu: Emulator) -> tornado.web.Application:
    return App([
        (r"/_emulator/health", HealthHandler),
        (r"/_emulator/metadata/([^/]+)/(.+)", MetadataHandler, {"emu": emu}),
        (r"/_emulator/(\w+)", AdminHandler, {"emu": emu}),
        (r"(.*)", ApiHandler, {"emu": emu}),
    ], log_function=lambda handler: None)


class HealthHandler(tornado.web.RequestHandler):
    def get(self) -> None:
        self.finish({"ok": True})
