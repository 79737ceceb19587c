"""The sidekick's shared state and each request's view of it.

``HubContext`` replaces the server extension's ``ServerContext`` in the sidekick: one
cluster manager, storage manager, job manager, catalogue, egress proxy and side-kick
supervisor for the whole hub.  ``for_request`` gives the REST handlers a ``UserContext``
whose managers are the caller's views (``views.py``), so the handlers written for a
single-user server serve many users without a line changed.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..api.settings import CloudTikServer
from ..clusters import usage
from ..clusters.manager import ClusterManager
from ..clusters.reaper import ensure_reaper
from ..clusters.table import clusters_of
from ..core import sandbox
from ..core.config import cluster_cores, provider_class, provisioned_cores, worker_types
from ..core.config_names import named_values
from ..core.errors import PermissionDeniedError
from ..core.grants import Grant, declare_shared, default_mode, install_policy
from ..core.secrets import open_secret_store
from ..core.settings import CloudTik
from ..core.store import loads
from ..runtime.environment import is_local
from .catalog import Caller, Catalog, Resource
from .egress_consent import EgressRules
from .policy import CatalogPolicy
from .settings import CloudTikHub
from .views import ClustersView, JobsView, NoKernelsView, StorageView, started_today

log = logging.getLogger("jupyter_cloudtik.hub")


class HubContext:
    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp
        self.settings = CloudTik(parent=serverapp)
        self.server = CloudTikServer(parent=serverapp)
        self.hub = CloudTikHub(parent=serverapp)
        self.manager = ClusterManager(settings=self.settings, user="cloudtik-hub")
        self.store = self.manager.store
        # the state folder is private to the service, and whatever of a user's runs on
        # this machine for it is sandboxed (core/sandbox.py): declared before anything
        # (here or in a daemon of this folder) starts a node, a job or a side-kick
        os.chmod(self.store.state_dir, 0o700)
        declare_shared(self.store.state_dir, policy="catalog")
        self.policy = CatalogPolicy(self.store)
        install_policy(self.store, self.policy)
        self.sandbox = sandbox.install(
            self.store.state_dir, self.hub.sandbox, uid=self.hub.sandbox_uid,
            gid=self.hub.sandbox_gid, readable=self.hub.sandbox_readable)
        try:
            self.sandbox.check()
        except sandbox.SandboxUnavailable as e:
            log.warning("jupyter_cloudtik hub sidekick: %s — side-kicks, local clusters "
                        "and local jobs will be refused", e.message)
        self.secrets = open_secret_store(self.settings, self.store)
        self.catalog = Catalog(self.store, self.secrets)
        self.egress_rules = EgressRules(self.store, self.secrets, self.policy)
        self._remembered: dict[str, Caller] = {}
        self._storage: Any = None
        self._jobs: Any = None
        self._features: dict[str, Any] = {}
        # started by bootstrap.start_services on the server's loop
        self.egress: Any = None
        self.sidekicks: Any = None
        self.egress_clients: dict[str, tuple[Caller, str]] = {}
        self.services_ready: Any = None
        self.session_watch: Any = None
        self.kernels: Any = None  # hub.kernels.HubKernels

    # the request's view ------------------------------------------------------------------
    def for_request(self, handler: Any) -> UserContext:
        caller = caller_of(handler)
        return UserContext(self, caller, held_ok=self.held_allowed(handler))

    def held_allowed(self, handler: Any) -> bool:
        """May this request do what stays with the person (credentials, consent)?  Only
        from their own browser session, unless the admin allows tokens."""
        user = handler.current_user
        return bool(self.hub.allow_token_user_actions
                    or getattr(user, "cloudtik_browser_session", False))

    def folders_not_shown(self) -> list[tuple[str, str]]:
        """(path, name) of folders no user's answer shows: the state folder (the secret
        store's key, every record) and the HPC backends' work folders (a shared account's
        files on the HPC system), as far as they are known yet."""
        import os

        out = [(str(self.store.state_dir), "<sidekick state>"),
               (os.path.realpath(self.store.state_dir), "<sidekick state>")]
        jobs = self._jobs
        if jobs is not None:
            for backend in list(jobs.registry._backends.values()):
                for folder in backend.known_folders():
                    out.append((folder, f"<{backend.name} work folder>"))
        return sorted({p: n for p, n in out if p and len(p) > 1}.items(),
                      key=lambda pn: len(pn[0]), reverse=True)

    def scrub_anonymous(self, text: str) -> str:
        for path, name in self.folders_not_shown():
            text = text.replace(path, name)
        return text

    def require_held(self, allowed: bool, what: str) -> None:
        if not allowed:
            raise PermissionDeniedError(
                f"{what}: only in your own browser session — open "
                f"{self.serverapp.base_url}egress (rules and shares) or "
                f"{self.serverapp.base_url}admin (admins) after logging in to the hub; a "
                "token (your server's, a kernel's or a script's) may not do this",
                field="token")

    def remember(self, caller: Caller) -> None:
        """Keep the caller's groups for background actions of theirs (once per change)."""
        if self._remembered.get(caller.name) != caller:
            self.catalog.remember(caller)
            self._remembered[caller.name] = caller

    def grant(self, caller: Caller, kind: str, name: str, mode: str | None = None, *,
              field: str | None = None) -> Grant:
        """The access policy's decision (``hub/policy.py``): the only yes/no on catalogue
        items; the same 404 for missing and not-yours."""
        return self.policy.grant(caller, kind, name, mode or default_mode(kind),
                                 field=field)

    def usable(self, caller: Caller, kind: str, name: str, *,
               field: str | None = None) -> Resource:
        """The catalogue item, once the policy granted it (admins: any that exists)."""
        self.grant(caller, kind, name, field=field)
        return self.catalog.get(kind, name)

    def visible(self, caller: Caller, kind: str) -> list[Resource]:
        """What the caller may use of ``kind``, as the policy decides."""
        return [self.catalog.get(kind, n) for n in self.policy.visible(caller, kind)]

    def is_kernel_token(self, token: str | None) -> bool:
        return False  # the sidekick runs no kernels; callers are hub users

    # shared managers, made on first use ---------------------------------------------------
    def storage_manager(self) -> Any:
        if self._storage is None:
            # deferred: start-up (storage.manager ~16 ms)
            from ..storage.manager import StorageManager

            self._storage = StorageManager(settings=self.settings, store=self.store,
                                           user="cloudtik-hub", secrets=self.secrets)
        return self._storage

    def job_manager(self) -> Any:
        if self._jobs is None:
            # deferred: start-up (hpc.jobs ~13 ms; hpc.settings ~7 ms)
            from ..hpc.jobs import JobManager
            from ..hpc.settings import HPC

            self._jobs = JobManager(settings=self.settings, hpc=HPC(parent=self.serverapp),
                                    store=self.store, user="cloudtik-hub")
            self._jobs.ensure_poller()
        return self._jobs

    def started(self, name: str) -> Any:
        return {"storage": self._storage, "hpc": self._jobs}.get(name)

    # what the views need -------------------------------------------------------------------
    def deliver_provider_credentials(self, grant: Grant, cfg: dict[str, Any]) -> None:
        """Put a catalogue provider's credentials where its provider reads them, in the
        sidekick's secret store: never in the cluster config (which is recorded and shown)
        nor in anything a node receives.  Huawei Cloud reads a workspace's keys.  Only
        against the caller's grant on that provider."""
        prov = self.catalog.get("provider", grant.name)
        if prov.spec.get("type") != "huaweicloud":
            return
        values = self.secrets.reveal(grant)
        if not values:
            return
        # deferred: optional extra (huaweicloud: huaweicloudsdkcore)
        from ..providers.huaweicloud.credentials import store_workspace_credentials

        workspace = cfg["provider"].get("workspace_name")
        if workspace:
            store_workspace_credentials(self.secrets, workspace, values)

    def check_config_names(self, caller: Caller, cfg: dict[str, Any],
                           prov: Resource) -> None:
        """Every field of a user's cluster config that names something (the schemas mark
        them: core/config_names.py) passes the access policy: storages and images they
        may use (the same 404 for unknown and not theirs), no folder or path of this
        machine."""
        ptype = cfg["provider"]["type"]
        for path, kind, value in named_values(cfg, provider_class(ptype, self.settings)):
            if kind == "storage":
                self.grant(caller, "storage", str(value), "read", field=path)
            elif kind == "image":
                self.grant(caller, "image", f"{prov.name}/{value}", field=path)
            elif kind == "package" and isinstance(value, str) and is_local(value):
                raise PermissionDeniedError(
                    f"{path}: {value!r} is a folder of the sidekick's machine; through the "
                    "hub, runtime.pip takes requirements from a package index",
                    field=path, value=value)
            elif kind == "node-path" and ptype == "local":
                raise PermissionDeniedError(
                    f"{path}: a local cluster's nodes run on the sidekick's machine; their "
                    "paths are chosen by the sidekick", field=path, value=str(value))

    def audit_use(self, caller: Caller, action: str, target: str,
                  detail: dict[str, Any]) -> None:
        self.catalog.audit(caller.name, action, target, detail)

    def _core_prices(self) -> dict[str, float]:
        prices: dict[str, float] = {}
        for r in self.catalog.list("provider"):
            ptype = r.spec.get("type")
            prices[ptype] = max(prices.get(ptype, 0.0),
                                float(r.spec.get("price_per_core_hour") or 0))
        return prices

    def usage_by_user(self) -> dict[str, Any]:
        """What every user's clusters cost, for admins: per user the clusters, workers
        now, cost per hour and cost so far (of the clusters' current lives).

        A cluster placed on priced offers (a cloud's flavors) costs what its recorded
        samples say (``clusters.usage``); one on unpriced offers (local, a gateway) costs the
        catalogue's ``price_per_core_hour`` times its cores, integrated over the same
        samples, as ``spend_today`` counts it."""
        prices = self._core_prices()
        now = time.time()
        users: dict[str, dict[str, Any]] = {}
        clusters = []
        for info in self.manager.list():
            u = usage.usage(self.manager, info.name, now=now)
            per_hour, so_far = info.cost_per_hour or 0.0, u["cost_so_far"]
            currency = u["currency"]
            price = prices.get(info.provider, 0.0)
            if not per_hour and price:
                # the cores the provider gives each node, not what the config declares
                cfg = info.config
                head = provisioned_cores(cfg, cfg.get("head_node_type"), self.settings)
                wtypes = [t for t in info.target_workers] or worker_types(cfg)
                per_worker = provisioned_cores(cfg, wtypes[0], self.settings) \
                    if wtypes else 0.0
                per_hour = (head + per_worker * info.running_workers) * price
                samples = u["samples"]
                so_far = 0.0
                for i, smp in enumerate(samples):
                    until = samples[i + 1]["at"] if i + 1 < len(samples) else now
                    so_far += (head + per_worker * smp["workers"]) * price * \
                        max(until - smp["at"], 0.0) / 3600
                currency = currency or "catalogue"
            row = {"cluster": info.name, "owner": info.owner or "", "state": info.state,
                   "workers": info.running_workers, "cost_per_hour": round(per_hour, 6),
                   "cost_so_far": round(so_far, 6), "currency": currency}
            clusters.append(row)
            agg = users.setdefault(row["owner"], {
                "user": row["owner"], "clusters": 0, "workers": 0, "cost_per_hour": 0.0,
                "cost_so_far": 0.0})
            agg["clusters"] += 1
            agg["workers"] += row["workers"]
            agg["cost_per_hour"] = round(agg["cost_per_hour"] + row["cost_per_hour"], 6)
            agg["cost_so_far"] = round(agg["cost_so_far"] + row["cost_so_far"], 6)
        return {"users": sorted(users.values(), key=lambda x: x["user"]),
                "clusters": clusters}

    def spend_today(self, user: str) -> float:
        """Core-hours of ``user``'s clusters since midnight times their provider's price
        (``price_per_core_hour`` in the catalogue; 0 when no price is set).  A cluster
        records its provider type, not the catalogue entry: with several entries of one
        type, the highest price counts (a spend limit should not be underestimated)."""
        start = started_today()
        now = time.time()
        prices: dict[str, float] = {}
        for r in self.catalog.list("provider"):
            ptype = r.spec.get("type")
            prices[ptype] = max(prices.get(ptype, 0.0),
                                float(r.spec.get("price_per_core_hour") or 0))
        total = 0.0

        for r in clusters_of(self.store, user, stopped_since=start):
            price = prices.get(r["provider"], 0.0)
            if not price:
                continue
            cores = cluster_cores(loads(r["config"], {}), loads(r["target_workers"], {}),
                                  self.settings)
            until = now if r["state"] != "stopped" else r["updated_at"]
            hours = max(0.0, until - max(r["created_at"], start)) / 3600
            total += cores * hours * price
        return total


class UserContext:
    """What ``CloudTikHandler.ctx`` is in the sidekick: the caller's view."""

    def __init__(self, hub: HubContext, caller: Caller, held_ok: bool = False) -> None:
        self.hub = hub
        self.caller = caller
        self.held_ok = held_ok
        self.settings = hub.settings
        self.server = hub.server
        self.serverapp = hub.serverapp
        self.store = hub.store
        self.manager = ClustersView(hub, caller)

    def feature(self, name: str, factory: Any) -> Any:
        if name == "storage":
            return StorageView(self.hub, self.caller)
        if name == "hpc":
            return JobsView(self.hub, self.caller)
        if name == "hpc-kernels":
            # kernels run in each user's own server with its own backends; the sidekick's
            # backends (and their credentials) are never sized or listed for them
            return NoKernelsView()
        if not self.caller.admin:
            raise PermissionDeniedError(f"{name}: only hub admins may use this through the "
                                        "sidekick", field=name)
        if name not in self.hub._features:
            self.hub._features[name] = factory(self.hub)
        manager = self.hub._features[name]
        if name == "workspaces":
            return _HeldWrites(manager, lambda: self.hub.require_held(
                self.held_ok, "creating or deleting a workspace (it carries the cloud "
                "account)"), ("start_create", "start_delete", "create", "delete"))
        return manager

    def started(self, name: str) -> Any:
        return self.hub.started(name)

    def cluster_list_json(self, include_stopped: bool) -> str:
        import json

        clusters = self.manager.list(include_stopped=include_stopped)
        return json.dumps({"clusters": [c.to_dict() for c in clusters]}, default=str,
                          separators=(",", ":"))

    def is_kernel_token(self, token: str | None) -> bool:
        return False

    def scrub(self, text: str) -> str:
        """Answers to users name the sidekick's own folders instead of showing them (an
        admin sees them as they are)."""
        return text if self.caller.admin else self.hub.scrub_anonymous(text)

    def kernel_env(self) -> dict[str, str]:
        return {}

    def after_up(self, op_id: str) -> None:
        try:
            ensure_reaper(self.settings, self.store)
        except Exception as e:
            self.hub.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                      level="warning")


class _HeldWrites:
    """A manager whose writing methods first ask ``check`` (held actions need the
    person's own browser session)."""

    def __init__(self, manager: Any, check: Any, methods: tuple[str, ...]) -> None:
        self._manager, self._check, self._methods = manager, check, methods

    def __getattr__(self, name: str) -> Any:
        if name in self._methods:
            self._check()
        return getattr(self._manager, name)


ADMIN_SCOPE = "custom:cloudtik:admin"
USE_SCOPE = "custom:cloudtik:use"


def caller_of(handler: Any) -> Caller:
    """The hub user behind a request (set by ``auth.HubIdentityProvider``)."""
    user = handler.current_user
    caller = getattr(user, "cloudtik_caller", None)
    if caller is None:
        raise PermissionDeniedError("not a hub user", field="user")
    return caller
