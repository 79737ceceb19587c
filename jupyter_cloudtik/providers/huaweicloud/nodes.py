"""The huaweicloud node provider: ECS servers found by their tags.

* N nodes are one ``create_post_paid_servers`` call with ``count=N`` and an
  ``X-Client-Token`` (a retried create returns the same servers, never a second batch);
  the provider waits for the ECS job and creates again what the job could not (a
  half-failed batch, servers that landed in ERROR), a bounded number of times.
* Nodes are listed by server tags (``list_servers_details(tags=...)``, paginated); the
  cloud is the truth.  One listing serves many questions for a second (a cache), so
  waiting for 100 workers does not cost 100 calls a second.
* ERROR and SHUTOFF servers exist and are broken: ``non_terminated_nodes`` returns them,
  ``is_running`` says no, so ``up`` replaces them and ``down`` deletes them.
* Terminating deletes in batches (with their EIPs and disks) and waits for the jobs.
* Quota and capacity refusals become ``NodeLaunchError`` with the cloud's code and message.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from ...core.errors import ConfigError, NodeLaunchError, OperationTimeout, ProviderError
from ..base import (
    NODE_KIND_HEAD,
    TAG_CLUSTER_NAME,
    TAG_NODE_KIND,
    Capacity,
    ConnectInfo,
    NodeProvider,
)
from .account import make_clients, retry_reporter, settings_for, wait_until
from .offers import flavor_resources, list_flavors, offer_set, quota_limits
from .retry import as_launch_error
from .userdata import DASHBOARD_PORT, SCHEDULER_PORT, encode, render
from .workspace import PROVIDER_PROPERTIES

if TYPE_CHECKING:
    from distributed import Client

    from ...core.operations import OperationContext

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

TAG_WORKSPACE = "cloudtik-workspace"
MAX_TAGS = 10
GONE = {"DELETED", "SOFT_DELETED"}
ALIVE = {"ACTIVE", "BUILD", "REBOOT", "HARD_REBOOT", "RESIZE", "VERIFY_RESIZE", "MIGRATING"}
PAGE = 100
CACHE_SECONDS = 1.0
DEFAULT_FLAVOR = "s6.large.2"
CREATE_ROUNDS = 3          # first create plus two for what a job could not make
DELETE_BATCH = 1000        # ECS deletes at most 1000 servers per call


def tags_of(server) -> dict[str, str]:
    out = {}
    for t in server.tags or []:
        k, _, v = t.partition("=")
        out[k] = v
    return out


def list_servers(clients, tags: dict[str, str]) -> list[Any]:
    """Every server (not deleted) carrying all ``tags``, page by page."""
    from huaweicloudsdkecs.v2 import ListServersDetailsRequest

    query = ",".join(f"{k}={v}" for k, v in sorted(tags.items()))
    out: list[Any] = []
    page = 1
    while True:
        resp = clients.call("ecs", "list_servers_details", ListServersDetailsRequest(
            tags=query, limit=PAGE, offset=page))
        servers = resp.servers or []
        out.extend(servers)
        if not servers or len(out) >= (resp.count or 0) or len(servers) < PAGE:
            return [s for s in out if s.status not in GONE]
        page += 1


def addresses(server) -> tuple[str | None, str | None]:
    private = public = None
    for addrs in (server.addresses or {}).values():
        for a in addrs:
            if a.os_ext_ip_stype == "floating":
                public = public or a.addr
            else:
                private = private or a.addr
    return private, public


class HuaweiCloudNodeProvider(NodeProvider):
    provider_type = "huaweicloud"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "title": "Huawei Cloud",
        "description": "ECS servers in a workspace (`jupyter cloudtik workspace create`).",
        "additionalProperties": False,
        "properties": {
            **{k: v for k, v in PROVIDER_PROPERTIES.items() if k != "type"},
            "type": {"const": "huaweicloud"},
            "workspace_name": {"type": "string", "title": "Workspace",
                               "description": "Default: the only huaweicloud workspace."},
            "use_spot": {"type": "boolean", "description": "Spot servers for workers."},
            "use_internal_ips": {"type": "boolean", "description": "Reach the head at its "
                                 "private IP (VPN, peering, SSH tunnel) instead of an EIP."},
            "key_name": {"type": "string", "description": "An existing key pair."},
            "bandwidth": {"type": "integer", "minimum": 1, "maximum": 300,
                          "description": "Mbit/s of the head's EIP."},
            "prices": {"type": "object", "additionalProperties": {"type": "number"},
                       "description": "Hourly price per flavor, for offers and placement."},
            "currency": {"type": "string", "description": "Currency of the prices."},
        },
    }
    node_config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "flavor": {"type": "string", "pattern": r"^[a-z0-9]+\.[a-z0-9]+\.[0-9]+$",
                       "description": "ECS flavor, e.g. s6.large.2 (2 vCPUs, 4 GiB)."},
            "image_id": {"type": "string", "description": "Default: latest public Ubuntu."},
            "availability_zone": {"type": "string"},
            "use_spot": {"type": "boolean"},
            "public_ip": {"type": "boolean"},
            "root_volume": {"type": "object", "additionalProperties": False, "properties": {
                "volumetype": {"enum": ["SATA", "SAS", "SSD", "GPSSD", "ESSD"]},
                "size": {"type": "integer", "minimum": 40, "maximum": 1024}}},
            "server_tags": {"type": "object", "maxProperties": 4,
                            "additionalProperties": {"type": "string", "maxLength": 43},
                            "description": "Your own server tags (a server has at most 10; "
                                           "jupyter_cloudtik uses 6)."},
        },
    }

    def __init__(self, provider_config, cluster_name, context) -> None:
        super().__init__(provider_config, cluster_name, context)
        self.settings = settings_for(context)
        self._clients = None
        self._workspace: dict[str, Any] | None = None
        self._cache: dict[str, Any] = {}
        self._cache_at = 0.0
        self._lock = threading.RLock()

    # defaults -------------------------------------------------------------------------------
    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        return {
            "head": {"node_config": {"flavor": "s6.large.2"}, "resources": {}},
            "worker": {"node_config": {"flavor": "s6.large.2"}, "resources": {},
                       "min_workers": 1, "max_workers": 100},
        }

    @classmethod
    def fill_resources(cls, provider_config: dict[str, Any],
                       node_type: dict[str, Any]) -> dict[str, Any]:
        res = dict(node_type.get("resources") or {})
        flavor = (node_type.get("node_config") or {}).get("flavor") or DEFAULT_FLAVOR
        known = flavor_resources(flavor) or {}
        res.setdefault("CPU", known.get("CPU", 1))
        if "memory" not in res and known:
            res["memory"] = int(known["memory"] * 0.9)
        return res

    @classmethod
    def placement_options(cls, provider_config: dict[str, Any],
                          node_type: dict[str, Any]) -> dict[str, Any]:
        """Keep the node type's flavor, and pack a batch into one zone (one create call);
        a config's ``placement:`` overrides either."""
        nc = node_type.get("node_config") or {}
        out: dict[str, Any] = {"strategy": "pack",
                               "capabilities": {"flavor": nc.get("flavor") or DEFAULT_FLAVOR}}
        zone = nc.get("availability_zone") or provider_config.get("availability_zone")
        if zone:
            out["availability_zones"] = [zone]
        return out

    # plumbing -------------------------------------------------------------------------------
    def workspace(self) -> dict[str, Any]:
        if self._workspace is None:
            from ...core.workspace_manager import workspace_record, workspaces_of

            name = self.provider_config.get("workspace_name") or \
                self.settings.default_workspace
            if not name:
                found = workspaces_of(self.context.store, "huaweicloud")
                if len(found) != 1:
                    raise ConfigError(
                        "provider.workspace_name: missing, and there are "
                        f"{len(found) or 'no'} huaweicloud workspaces"
                        + (f" ({', '.join(found)})" if found else
                           "; create one with `jupyter cloudtik workspace create NAME "
                           "--provider huaweicloud`"), field="provider.workspace_name")
                name = found[0]
            rec = workspace_record(self.context.store, name)
            if rec is None or rec["provider"] != "huaweicloud" or rec["state"] == "deleted":
                raise ConfigError(f"provider.workspace_name: no huaweicloud workspace named "
                                  f"'{name}'", field="provider.workspace_name", value=name)
            if rec["state"] != "ready":
                raise ConfigError(f"provider.workspace_name: workspace '{name}' is "
                                  f"{rec['state']}, not ready; run `jupyter cloudtik "
                                  f"workspace create {name}` again to finish it",
                                  field="provider.workspace_name", value=name)
            self._workspace = rec
        return self._workspace

    @property
    def clients(self):
        if self._clients is None:
            ws = self.workspace()
            merged = {**{k: v for k, v in ws["config"]["provider"].items()
                         if k in PROVIDER_PROPERTIES}, **self.provider_config}
            self._clients = make_clients(merged, self.context, ws["name"],
                                         on_retry=retry_reporter(None, log))
        return self._clients

    def flavors(self, zone: str | None = None) -> list[Any]:
        return list_flavors(self.clients, zone)

    def offers(self, query=None):
        """Flavors x zones with prices, sharing the project's quota (for placement).

        Placement picks the cheapest offer that fits each node type; to keep a flavor,
        give the node type ``placement: {capabilities: {flavor: NAME}}``."""
        return offer_set(self.clients, self.provider_config.get("prices"),
                         spot=bool(self.provider_config.get("use_spot")),
                         currency=self.provider_config.get("currency", "USD"))

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        from .bootstrap import bootstrap

        return bootstrap(self, cluster_config)

    def capacity(self) -> Capacity:
        try:
            q = quota_limits(self.clients)
            left = {"instances": q["instances_left"], "cores": q["cores_left"],
                    "ram_mib": q["ram_mib_left"]}
        except ConfigError:
            raise
        except ProviderError:
            return Capacity()  # the launch itself will say what is wrong
        return Capacity(cpus=float(left["cores"]), memory=left["ram_mib"] * 2**20,
                        max_nodes=left["instances"],
                        description=f"the account's ECS quota in {self.clients.region} "
                                    f"leaves {left['instances']} servers, {left['cores']} "
                                    f"vCPUs, {left['ram_mib'] // 1024} GiB")

    # listing ------------------------------------------------------------------------------
    def _refresh(self, tag_filters: dict[str, str] | None = None) -> list[Any]:
        tags = {TAG_CLUSTER_NAME: self.cluster_name, **(tag_filters or {})}
        servers = list_servers(self.clients, tags)
        with self._lock:
            if not tag_filters:
                self._cache = {s.id: s for s in servers}
                self._cache_at = time.monotonic()
            else:
                self._cache.update({s.id: s for s in servers})
        return servers

    def _server(self, node_id: str):
        with self._lock:
            fresh = time.monotonic() - self._cache_at < CACHE_SECONDS
            if fresh and node_id in self._cache:
                return self._cache[node_id]
        self._refresh()
        with self._lock:
            if node_id in self._cache:
                return self._cache[node_id]
        from huaweicloudsdkecs.v2 import ShowServerRequest

        got = self.clients.call("ecs", "show_server", ShowServerRequest(server_id=node_id),
                                missing_ok=True)
        return got.server if got is not None and got.server.status not in GONE else None

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        return [s.id for s in self._refresh(tag_filters)]

    def is_running(self, node_id: str) -> bool:
        s = self._server(node_id)
        return s is not None and s.status in ALIVE

    def is_terminated(self, node_id: str) -> bool:
        return self._server(node_id) is None

    def node_tags(self, node_id: str) -> dict[str, str]:
        s = self._server(node_id)
        return tags_of(s) if s is not None else {}

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        from huaweicloudsdkecs.v2 import (
            BatchAddServerTag,
            BatchCreateServerTagsRequest,
            BatchCreateServerTagsRequestBody,
        )

        s = self._server(node_id)
        if s is None:
            return
        have = tags_of(s)
        new = {k: v for k, v in tags.items() if have.get(k) != v}
        if not new:
            return
        self.clients.call("ecs", "batch_create_server_tags", BatchCreateServerTagsRequest(
            server_id=node_id, body=BatchCreateServerTagsRequestBody(
                action="create", tags=[BatchAddServerTag(key=k, value=v)
                                       for k, v in new.items()])),
            missing_ok=True, what="tag a server")
        with self._lock:
            if node_id in self._cache:
                s.tags = [f"{k}={v}" for k, v in {**have, **new}.items()]

    def internal_ip(self, node_id: str) -> str | None:
        s = self._server(node_id)
        return addresses(s)[0] if s is not None else None

    def external_ip(self, node_id: str) -> str | None:
        s = self._server(node_id)
        return addresses(s)[1] if s is not None else None

    def node_info(self, node_id: str) -> dict[str, Any]:
        s = self._server(node_id)
        if s is None:
            return {}
        return {"server_status": s.status, "flavor": s.flavor.id if s.flavor else None,
                "zone": s.os_ext_a_zavailability_zone,
                "spot": (s.metadata or {}).get("charging_mode") == "2"}

    def node_failure_hint(self, node_id: str) -> str:
        s = self._server(node_id)
        if s is None:
            return "the server no longer exists"
        fault = s.fault.get("message") if isinstance(s.fault, dict) else None
        return f"server status {s.status}" + (f": {fault}" if fault else "") + (
            "; its log is /opt/cloudtik/node.log on the server")

    def recent_nodes(self, limit: int = 50) -> list[str]:
        return [s.id for s in self._refresh()][:limit]

    # creating ------------------------------------------------------------------------------
    def _server_tags(self, node_config: dict[str, Any], tags: dict[str, str]) -> dict[str, str]:
        out = {**(node_config.get("server_tags") or {}), **tags,
               TAG_CLUSTER_NAME: self.cluster_name, TAG_WORKSPACE: self.workspace()["name"]}
        if len(out) > MAX_TAGS:
            raise ConfigError(f"node_config.server_tags: a server has at most {MAX_TAGS} tags "
                              f"and {len(out)} are needed; use fewer server_tags",
                              field="node_config.server_tags")
        return out

    def _request(self, node_config: dict[str, Any], tags: dict[str, str], count: int,
                 user_data: str):
        from huaweicloudsdkecs.v2 import (
            CreatePostPaidServersRequest,
            CreatePostPaidServersRequestBody,
            PostPaidServer,
            PostPaidServerEip,
            PostPaidServerEipBandwidth,
            PostPaidServerExtendParam,
            PostPaidServerNic,
            PostPaidServerPublicip,
            PostPaidServerRootVolume,
            PostPaidServerSecurityGroup,
            PostPaidServerTag,
        )

        nc = node_config
        role = (nc.get("runtime") or {}).get("role") or tags.get(TAG_NODE_KIND, "worker")
        missing = [k for k in ("flavor", "image_id", "vpc_id", "subnet_id") if not nc.get(k)]
        if missing:
            raise ConfigError(f"node_config: {', '.join(missing)} missing; the config was not "
                              "bootstrapped from a workspace", field="node_config")
        server = PostPaidServer(
            name=f"cloudtik-{self.cluster_name}-{role}", count=count, is_auto_rename=True,
            flavor_ref=nc["flavor"], image_ref=nc["image_id"], vpcid=nc["vpc_id"],
            nics=[PostPaidServerNic(subnet_id=nc["subnet_id"])],
            security_groups=[PostPaidServerSecurityGroup(id=g)
                             for g in nc.get("security_group_ids") or []],
            key_name=nc.get("key_name"),
            metadata={"agency_name": nc["agency_name"]} if nc.get("agency_name") else None,
            server_tags=[PostPaidServerTag(key=k, value=v) for k, v in tags.items()],
            user_data=user_data, availability_zone=nc.get("availability_zone"),
            root_volume=PostPaidServerRootVolume(**(nc.get("root_volume") or {
                "volumetype": "SSD", "size": 40})),
            extendparam=PostPaidServerExtendParam(market_type="spot")
            if nc.get("market_type") == "spot" else None,
            publicip=PostPaidServerPublicip(eip=PostPaidServerEip(
                iptype="5_bgp", bandwidth=PostPaidServerEipBandwidth(
                    size=int(nc.get("bandwidth") or 10), sharetype="PER",
                    chargemode="traffic")), delete_on_termination=True)
            if nc.get("public_ip") else None,
        )
        return CreatePostPaidServersRequest(
            x_client_token=uuid.uuid4().hex,
            body=CreatePostPaidServersRequestBody(server=server))

    def _wait_job(self, job_id: str, what: str):
        from huaweicloudsdkecs.v2 import ShowJobRequest

        def done():
            job = self.clients.call("ecs", "show_job", ShowJobRequest(job_id=job_id))
            return job if job.status in ("SUCCESS", "FAIL") else None

        return wait_until(done, what=what, timeout=self.settings.boot_timeout,
                          first=self.settings.job_poll_interval / 4,
                          most=max(self.settings.job_poll_interval * 5, 1.0))

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, dict[str, Any]]:
        runtime = node_config.get("runtime") or {}
        role = runtime.get("role") or tags.get(TAG_NODE_KIND, "worker")
        all_tags = self._server_tags(node_config, tags)
        ws = self.workspace()
        user_data = encode(render(role, runtime, storage={
            "bucket": ws["resources"].get("bucket"),
            "endpoint": f"https://obs.{self.clients.region}.myhuaweicloud.com"}
            if ws["resources"].get("bucket") else None))
        made: dict[str, dict[str, Any]] = {}
        wanted = count
        last_reason = ""
        for round_ in range(CREATE_ROUNDS):
            request = self._request(node_config, all_tags, wanted, user_data)
            try:
                resp = self.clients.call("ecs", "create_post_paid_servers", request,
                                         what=f"create {wanted} {role} server(s)")
            except ProviderError as e:
                raise as_launch_error(e, f"create {wanted} {role} server(s)") from None
            job = self._wait_job(resp.job_id, f"the creation of {wanted} {role} server(s)")
            subs = (job.entities.sub_jobs if job.entities else None) or []
            ok = [s.entities.server_id for s in subs if s.status == "SUCCESS"]
            if not subs and job.status == "SUCCESS":
                ok = list(resp.server_ids or [])
            broken = [s.entities.server_id for s in subs
                      if s.status != "SUCCESS" and s.entities and s.entities.server_id]
            for sid in ok:
                made[sid] = {"round": round_ + 1}
            if job.status == "SUCCESS" and len(ok) >= wanted:
                break
            last_reason = f"{job.error_code or ''} {job.fail_reason or 'creation failed'}"
            log.warning("huaweicloud: %d of %d %s server(s) were not created (%s); %s",
                        wanted - len(ok), wanted, role, last_reason.strip(),
                        "retrying" if round_ + 1 < CREATE_ROUNDS else "giving up")
            # servers that landed in ERROR exist: delete them before making new ones
            existing = [sid for sid in broken if self._server(sid) is not None]
            if existing:
                self.terminate_nodes(existing)
            wanted -= len(ok)
            if str(job.error_code or "") in ("Ecs.0213",):
                break  # out of quota: trying again will not help
        if len(made) < count:
            raise NodeLaunchError(
                f"Huawei Cloud created {len(made)} of {count} {role} server(s) after "
                f"{CREATE_ROUNDS} attempt(s): {last_reason.strip()}",
                code=(last_reason.split() or [None])[0])
        with self._lock:
            self._cache_at = 0.0  # the next question lists again
        return made

    # terminating ---------------------------------------------------------------------------
    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        from huaweicloudsdkecs.v2 import DeleteServersRequest, DeleteServersRequestBody, ServerId

        ids = list(dict.fromkeys(node_ids))
        jobs = []
        for i in range(0, len(ids), DELETE_BATCH):
            batch = ids[i:i + DELETE_BATCH]
            resp = self.clients.call("ecs", "delete_servers", DeleteServersRequest(
                body=DeleteServersRequestBody(delete_publicip=True, delete_volume=True,
                                              servers=[ServerId(id=s) for s in batch])),
                missing_ok=True, what=f"delete {len(batch)} server(s)")
            if resp is not None and resp.job_id:
                jobs.append(resp.job_id)
        for job_id in jobs:
            job = self._wait_job(job_id, f"the deletion of {len(ids)} server(s)")
            if job.status == "FAIL":
                raise ProviderError(f"Huawei Cloud could not delete some servers: "
                                    f"{job.fail_reason or job.error_code}; run `down` again")
        with self._lock:
            for s in ids:
                self._cache.pop(s, None)

    def sweep_orphans(self) -> int:
        return 0  # the cloud is the only record: everything tagged was found above

    # runtime --------------------------------------------------------------------------------
    def _head_host(self, head_node_id: str) -> tuple[str | None, str | None]:
        s = self._server(head_node_id)
        if s is None:
            return None, None
        private, public = addresses(s)
        reach = private if self.provider_config.get("use_internal_ips") or not public else public
        return private, reach

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        import urllib.request

        private, reach = self._head_host(head_node_id)
        if private is None or reach is None:
            return None
        try:
            with urllib.request.urlopen(f"http://{reach}:{DASHBOARD_PORT}/health",
                                        timeout=2) as r:
                if r.status != 200:
                    return None
        except OSError:
            return None
        return ConnectInfo(
            scheduler_address=f"tcp://{private}:{SCHEDULER_PORT}",
            dashboard_link=f"http://{reach}:{DASHBOARD_PORT}/status",
            http_address=f"http://{reach}:{DASHBOARD_PORT}",
            extra={"public_scheduler_address": f"tcp://{reach}:{SCHEDULER_PORT}",
                   "head_node": head_node_id})

    async def wait_head_ready(self, head_node_id: str, ctx: OperationContext,
                              timeout: float) -> ConnectInfo:
        deadline = time.monotonic() + timeout
        said = False
        while True:
            ctx.checkpoint()
            info = await asyncio.to_thread(self.connect_info, head_node_id)
            if info is not None:
                return info
            if not await asyncio.to_thread(self.is_running, head_node_id):
                raise NodeLaunchError(f"the head node {head_node_id} stopped while starting: "
                                      + await asyncio.to_thread(self.node_failure_hint,
                                                                head_node_id))
            if not said:
                ip = await asyncio.to_thread(self.external_ip, head_node_id)
                ctx.progress("head", f"head server {head_node_id} is booting"
                             + (f" (EIP {ip})" if ip else ""), 0.15)
                said = True
            if time.monotonic() > deadline:
                raise OperationTimeout(f"the head node {head_node_id} did not start its "
                                       f"scheduler within {timeout:.0f}s")
            await asyncio.sleep(0.25)

    @classmethod
    def make_client(cls, info: ConnectInfo, **kwargs: Any) -> Client:
        from distributed import Client

        address = (info.extra or {}).get("public_scheduler_address") or info.scheduler_address
        return Client(address, **kwargs)

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        s = self._server(node_id)
        if s is None:
            return ""
        return (f"(server {node_id}: {s.status}; the runtime log is /opt/cloudtik/node.log on "
                f"the server: ssh -i KEY ubuntu@{addresses(s)[1] or addresses(s)[0]})")

    def is_head(self, node_id: str) -> bool:
        return self.node_tags(node_id).get(TAG_NODE_KIND) == NODE_KIND_HEAD
