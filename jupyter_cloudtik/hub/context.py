"""The sidekick's shared state and each request's view of it.

``HubContext`` replaces the server extension's ``ServerContext`` in the sidekick: one
cluster manager, storage manager, job manager, catalogue, egress proxy and side-kick
supervisor for the whole hub.  ``for_request`` gives the REST handlers a ``UserContext``
whose managers are the caller's views (``views.py``), so the handlers written for a
single-user server serve many users without a line changed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..api.settings import CloudTikServer
from ..clusters.manager import ClusterManager
from ..core.errors import PermissionDeniedError
from ..core.secrets import open_secret_store
from ..core.settings import CloudTik
from ..core.store import loads
from .catalog import Caller, Catalog, Resource
from .egress_rules import EgressRules
from .settings import CloudTikHub
from .views import ClustersView, JobsView, StorageView, started_today

log = logging.getLogger("jupyter_cloudtik.hub")


class HubContext:
    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp
        self.settings = CloudTik(parent=serverapp)
        self.server = CloudTikServer(parent=serverapp)
        self.hub = CloudTikHub(parent=serverapp)
        self.manager = ClusterManager(settings=self.settings, user="cloudtik-hub")
        self.store = self.manager.store
        self.secrets = open_secret_store(self.settings, self.store)
        self.catalog = Catalog(self.store, self.secrets)
        self.egress_rules = EgressRules(self.store, self.secrets)
        self._storage: Any = None
        self._jobs: Any = None
        self._features: dict[str, Any] = {}
        # started by bootstrap.start_services on the server's loop
        self.egress: Any = None
        self.sidekicks: Any = None
        self.egress_clients: dict[str, tuple[Caller, str]] = {}
        self.services_ready: Any = None
        self.session_watch: Any = None

    # the request's view ------------------------------------------------------------------
    def for_request(self, handler: Any) -> UserContext:
        caller = caller_of(handler)
        return UserContext(self, caller)

    def is_kernel_token(self, token: str | None) -> bool:
        return False  # the sidekick runs no kernels; callers are hub users

    # shared managers, made on first use ---------------------------------------------------
    def storage_manager(self) -> Any:
        if self._storage is None:
            from ..storage.manager import StorageManager

            self._storage = StorageManager(settings=self.settings, store=self.store,
                                           user="cloudtik-hub", secrets=self.secrets)
        return self._storage

    def job_manager(self) -> Any:
        if self._jobs is None:
            from ..hpc.jobs import JobManager
            from ..hpc.settings import HPC

            self._jobs = JobManager(settings=self.settings, hpc=HPC(parent=self.serverapp),
                                    store=self.store, user="cloudtik-hub")
            self._jobs.ensure_poller()
        return self._jobs

    def started(self, name: str) -> Any:
        return {"storage": self._storage, "hpc": self._jobs}.get(name)

    # what the views need -------------------------------------------------------------------
    def deliver_provider_credentials(self, prov: Resource, cfg: dict[str, Any]) -> None:
        """Put a catalogue provider's credentials where its provider reads them, in the
        sidekick's secret store: never in the cluster config (which is recorded and shown)
        nor in anything a node receives.  Huawei Cloud reads a workspace's keys."""
        values = self.catalog.secret_values("provider", prov.name)
        if not values or prov.spec.get("type") != "huaweicloud":
            return
        from ..providers.huaweicloud.credentials import store_workspace_credentials

        workspace = cfg["provider"].get("workspace_name")
        if workspace:
            store_workspace_credentials(self.secrets, workspace, values)

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
        samples say (``core.usage``); one on unpriced offers (local, a gateway) costs the
        catalogue's ``price_per_core_hour`` times its cores, integrated over the same
        samples, as ``spend_today`` counts it."""
        from ..core import usage

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
                types = info.config.get("available_node_types", {})
                head = float(types.get(info.config.get("head_node_type"), {})
                             .get("resources", {}).get("CPU", 1))
                wtypes = [t for t in info.target_workers] or [
                    t for t in types if t != info.config.get("head_node_type")]
                per_worker = float(types.get(wtypes[0], {}).get("resources", {})
                                   .get("CPU", 1)) if wtypes else 0.0
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
        for r in self.store.query(
                "SELECT provider, config, target_workers, created_at, updated_at, state"
                " FROM clusters WHERE owner = ? AND (state != 'stopped' OR updated_at > ?)",
                (user, start)):
            price = prices.get(r["provider"], 0.0)
            if not price:
                continue
            cfg = loads(r["config"], {})
            types = cfg.get("available_node_types", {})
            head = types.get(cfg.get("head_node_type"), {})
            cores = float(head.get("resources", {}).get("CPU", 1)) + sum(
                float(types.get(t, {}).get("resources", {}).get("CPU", 1)) * n
                for t, n in loads(r["target_workers"], {}).items())
            until = now if r["state"] != "stopped" else r["updated_at"]
            hours = max(0.0, until - max(r["created_at"], start)) / 3600
            total += cores * hours * price
        return total


class UserContext:
    """What ``CloudTikHandler.ctx`` is in the sidekick: the caller's view."""

    def __init__(self, hub: HubContext, caller: Caller) -> None:
        self.hub = hub
        self.caller = caller
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
        if not self.caller.admin:
            raise PermissionDeniedError(f"{name}: only hub admins may use this through the "
                                        "sidekick", field=name)
        if name not in self.hub._features:
            self.hub._features[name] = factory(self.hub)
        return self.hub._features[name]

    def started(self, name: str) -> Any:
        return self.hub.started(name)

    def cluster_list_json(self, include_stopped: bool) -> str:
        import json

        clusters = self.manager.list(include_stopped=include_stopped)
        return json.dumps({"clusters": [c.to_dict() for c in clusters]}, default=str,
                          separators=(",", ":"))

    def is_kernel_token(self, token: str | None) -> bool:
        return False

    def kernel_env(self) -> dict[str, str]:
        return {}

    def after_up(self, op_id: str) -> None:
        from ..clusters.reaper import ensure_reaper

        try:
            ensure_reaper(self.settings, self.store)
        except Exception as e:
            self.hub.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                      level="warning")


ADMIN_SCOPE = "custom:cloudtik:admin"
USE_SCOPE = "custom:cloudtik:use"


def caller_of(handler: Any) -> Caller:
    """The hub user behind a request (set by ``auth.HubIdentityProvider``)."""
    user = handler.current_user
    caller = getattr(user, "cloudtik_caller", None)
    if caller is None:
        raise PermissionDeniedError("not a hub user", field="user")
    return caller
