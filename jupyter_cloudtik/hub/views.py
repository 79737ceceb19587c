"""One hub user's view of the sidekick's shared managers: what they own, what they may use.

The REST handlers of the server extension are reused unchanged: they call
``self.ctx.manager``, ``ctx.feature("storage")`` and ``ctx.feature("hpc")``; in the sidekick
those are these views, made per request for the calling user.  Every view method either
checks ownership (another user's cluster, job or operation is a 404, exactly like a missing
one, so nothing can be probed) or the catalogue's access lists, and runs the core call
``acting_as`` the caller so what it creates is recorded as theirs.  Whatever a view does
not define is refused: a new core method is not reachable through the hub until a view
decides who may call it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..clusters import table as cluster_table
from ..core import config as cfgmod
from ..core.errors import ConfigError, ConflictError, NotFoundError, PermissionDeniedError
from ..core.grants import Grant
from ..core.identity import acting_as
from ..core.locations import NoLocal, resolve
from ..core.store import loads
from .backend_kinds import local_backend_type
from .catalog import Caller, Resource

if TYPE_CHECKING:
    from .context import HubContext


class _Denied:
    """Refuse any manager method the view does not define."""

    _what = "this call"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise PermissionDeniedError(
            f"{self._what}.{name} is not available through the hub sidekick")


class OperationsView(_Denied):
    _what = "operations"

    def __init__(self, ops: Any, caller: Caller) -> None:
        self._ops = ops
        self.caller = caller

    def _mine(self, op: Any) -> bool:
        return self.caller.admin or op.user == self.caller.name

    def get(self, op_id: str) -> Any:
        # resolved among the caller's own operations: another user's id (or prefix) is
        # answered exactly like a missing one, by the same core lookup
        return self._ops.get(op_id, user=self._user_filter())

    def _user_filter(self) -> str | None:
        return None if self.caller.admin else self.caller.name

    def list(self, target: str | None = None, active_only: bool = False,
             limit: int = 50) -> list[Any]:
        return self._ops.list(target=target, active_only=active_only, limit=limit,
                              user=self._user_filter())

    def events(self, op_id: str | None = None, after: int = 0, limit: int = 500) -> list[Any]:
        if op_id is not None:
            return self._ops.events(self.get(op_id).id, after=after)
        return self._ops.events(after=after, limit=limit, user=self._user_filter())

    def _event_mine(self, event: Any) -> bool:
        try:
            return self._mine(self._ops.get(event.op_id))
        except NotFoundError:
            return False

    def last_event_id(self) -> int:
        return self._ops.last_event_id(user=self._user_filter())

    def watch(self, op_id: str, after: int = 0) -> AsyncIterator[Any]:
        return self._ops.watch(self.get(op_id).id, after=after)

    async def watch_all(self, after: int = 0) -> AsyncIterator[Any]:
        owners: dict[str, bool] = {}
        async for event in self._ops.watch_all(after=after):
            if event.op_id not in owners:
                owners[event.op_id] = self._event_mine(event)
            if owners[event.op_id]:
                yield event

    def emit(self, *args: Any, **kwargs: Any) -> Any:
        return self._ops.emit(*args, **kwargs)


class ClustersView(_Denied):
    """``ClusterManager`` for one hub user: their clusters, the catalogue's providers."""

    _what = "clusters"

    def __init__(self, hub: HubContext, caller: Caller) -> None:
        self.hub = hub
        self._m = hub.manager
        self.caller = caller
        self.ops = OperationsView(self._m.ops, caller)
        self.store = self._m.store
        self.settings = self._m.settings

    # ownership ------------------------------------------------------------------------
    def _owned(self, name: str) -> Any:
        row = cluster_table.owner_and_state(self.store, name)
        if row is None or not (self.caller.admin or row[0] == self.caller.name):
            raise NotFoundError(f"no cluster named '{name}'", field="name", value=name)
        return row

    def get(self, name: str) -> Any:
        self._owned(name)
        return self._m.get(name)

    async def status(self, name: str) -> Any:
        self._owned(name)
        return await self._m.status(name)

    def list(self, include_stopped: bool = False) -> list[Any]:
        return [c for c in self._m.list(include_stopped=include_stopped)
                if self.caller.admin or c.owner == self.caller.name]

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> Any:
        """Node logs (the answer names the sidekick's state folder, never shows it:
        ``UserContext.scrub``)."""
        self._owned(name)
        return self._m.logs(name, node_id, tail)

    def connect_info(self, name: str) -> Any:
        self._owned(name)
        return self._m.connect_info(name)

    async def start_down(self, name: str, reason: str | None = None) -> Any:
        self._owned(name)
        with acting_as(self.caller):
            return await self._m.start_down(name, reason)

    async def start_scale(self, name: str, workers: int, node_type: str | None = None) -> Any:
        self._owned(name)
        self._check_scale_limits(name, workers, node_type)
        with acting_as(self.caller):
            return await self._m.start_scale(name, workers, node_type)

    async def cancel(self, op_id: str) -> Any:
        return await self._m.cancel(self.ops.get(op_id).id)

    def providers(self) -> list[dict[str, Any]]:
        """What the New form offers, in the shape of the server's provider list: the
        templates and providers of the catalogue this user may use, each with the form
        schema of the provider type behind it."""
        installed = {p["name"]: p for p in self._m.providers() if p.get("available")}
        catalog = self.hub.catalog
        out = []
        for res in self.hub.visible(self.caller, "template") + \
                self.hub.visible(self.caller, "provider"):
            if res.kind == "template":
                try:
                    ptype = catalog.get("provider", res.spec["provider"]).spec.get("type")
                except NotFoundError:
                    continue
            else:
                ptype = res.spec.get("type")
            base = installed.get(ptype)
            if base is None:
                continue
            out.append({**base, "name": res.name, "default": False, "kind": res.kind,
                        "provider_type": ptype, "title": f"{res.name} ({ptype} {res.kind})",
                        "description": res.description or base.get("description", ""),
                        "limits": res.spec.get("limits", {}) if res.kind == "template"
                        else {}})
        if len(out) == 1:
            out[0]["default"] = True
        return out

    # starting -------------------------------------------------------------------------
    async def start_up(self, config: Any = None, *, name: str | None = None,
                       workers: int | None = None, provider: str | None = None,
                       template: str | None = None) -> Any:
        cfg, prov_grant, limits = self._config_for(config, name, workers, provider, template)
        prov_res = self.hub.catalog.get("provider", prov_grant.name)
        cname = cfg["cluster_name"]
        row = cluster_table.owner_and_state(self.store, cname)
        if row is not None and row[1] != "stopped" and row[0] != self.caller.name:
            raise ConflictError(f"cluster name '{cname}' is in use; choose another name",
                                field="name", value=cname)
        self._check_quota(cfg, prov_res, replacing=cname)
        self.hub.deliver_provider_credentials(prov_grant, cfg)
        self.hub.audit_use(self.caller, "cluster.up", cname,
                           {"provider": prov_res.name, "limits": limits})
        with acting_as(self.caller):
            return await self._m.start_up(cfg)

    def _config_for(self, config: Any, name: str | None, workers: int | None,
                    provider: str | None, template: str | None
                    ) -> tuple[dict[str, Any], Grant, dict[str, Any]]:
        hub = self.hub
        if config is not None and not isinstance(config, dict):
            raise ConfigError("config: through the hub a cluster config is a JSON object "
                              "(files are read on the user's side)", field="config")
        tmpl = None
        if not provider and not template and isinstance((config or {}).get("provider"), dict):
            # the panel's New form names its choice as config.provider.type
            provider = config["provider"].get("type") or None
        if template:
            tmpl = hub.usable(self.caller, "template", template, field="template")
        elif provider:
            # a name from the New form may be a template or a provider
            try:
                tmpl = hub.usable(self.caller, "template", provider, field="provider")
            except NotFoundError:
                tmpl = None
        if tmpl is not None:
            prov_grant = hub.grant(self.caller, "provider", tmpl.spec["provider"],
                                   field="template")
            base = copy.deepcopy(tmpl.spec.get("config") or {})
            if config:
                base = _merge(base, {k: v for k, v in config.items() if k != "provider"})
            limits = dict(tmpl.spec.get("limits") or {})
        else:
            if provider:
                prov_grant = hub.grant(self.caller, "provider", provider, field="provider")
            else:
                choices = hub.visible(self.caller, "template") or \
                    hub.visible(self.caller, "provider")
                if len(choices) != 1:
                    names = ", ".join(r.name for r in choices) or "none: ask an admin"
                    raise ConfigError(f"template: say which template or provider to use "
                                      f"(you may use: {names})", field="template")
                if choices[0].kind == "template":
                    return self._config_for(config, name, workers, None, choices[0].name)
                prov_grant = hub.grant(self.caller, "provider", choices[0].name,
                                       field="provider")
            base = copy.deepcopy(config or {})
            base.pop("provider", None)
            limits = {}
        prov_res = hub.catalog.get("provider", prov_grant.name)
        # deferred: start-up (hub.bootstrap ~19 ms, loads asyncio, ssl)
        from .bootstrap import local_provider_type

        here = local_provider_type(hub, prov_res.spec)
        if here and not hub.hub.allow_local_execution:  # offered before the setting changed
            raise PermissionDeniedError(
                f"provider: '{prov_res.name}' ({here}) runs clusters on the sidekick's own "
                "machine, which this hub does not allow (c.CloudTikHub.allow_local_execution)",
                field="provider", value=prov_res.name)
        ptype = prov_res.spec["type"]
        base["provider"] = {**copy.deepcopy(prov_res.spec.get("config") or {}),
                            "type": ptype}
        if name:
            base["cluster_name"] = name
        if not base.get("cluster_name"):
            raise ConfigError("name: a cluster started through the hub needs a name",
                              field="name")
        cfg = cfgmod.build_config(base, workers=workers, settings=self.settings)
        self._apply_limits(cfg, limits, workers)
        hub.check_config_names(self.caller, cfg, prov_res)
        return cfg, prov_grant, limits

    def _apply_limits(self, cfg: dict[str, Any], limits: dict[str, Any],
                      workers: int | None) -> None:
        max_workers = limits.get("max_workers")
        if max_workers is not None:
            asked = workers if workers is not None else sum(
                t.get("min_workers", 0) for k, t in cfg["available_node_types"].items()
                if k != cfg["head_node_type"])
            if asked > max_workers:
                raise PermissionDeniedError(
                    f"workers: {asked} is more than this template allows ({max_workers})",
                    field="workers", value=asked)
            cfg["max_workers"] = min(cfg.get("max_workers", max_workers), int(max_workers))
            for k, t in cfg["available_node_types"].items():
                if k != cfg["head_node_type"]:
                    t["max_workers"] = min(t.get("max_workers", max_workers),
                                           int(max_workers))
        idle = limits.get("idle_timeout_minutes")
        if idle is not None:
            current = cfg.get("idle_timeout_minutes") or 0
            cfg["idle_timeout_minutes"] = min(current, idle) if current else idle
        if limits.get("max_price") is not None:
            placement = cfg.setdefault("placement", {})
            placement["max_price"] = min(placement.get("max_price", limits["max_price"]),
                                         limits["max_price"])

    def _check_scale_limits(self, name: str, workers: int,
                            node_type: str | None = None) -> None:
        quota = self.hub.catalog.quota_for(self.caller)
        if quota.get("max_cores") is None or isinstance(workers, bool) or \
                not isinstance(workers, int):
            return  # a bad count is the core's to refuse, naming the field
        recorded = cluster_table.sizing(self.store, name)
        if recorded is None:  # no quota can be judged for it: refuse, never pass
            raise NotFoundError(f"no cluster named '{name}'", field="name", value=name)
        config, target_workers = recorded
        full = loads(config, {})
        target = dict(loads(target_workers, {}))
        wtypes = cfgmod.worker_types(full)
        node_type = node_type or (wtypes[0] if len(wtypes) == 1 else None)
        if node_type not in wtypes:
            return  # the core names the choices
        target[node_type] = workers
        others = self._cores_in_use(exclude=name)
        mine = cfgmod.cluster_cores(full, target, self.settings)
        if others + mine > quota["max_cores"]:
            raise PermissionDeniedError(
                f"workers: {workers} workers would use {others + mine:g} cores; your quota "
                f"is {quota['max_cores']:g} ({quota['subject']})", field="workers",
                value=workers)

    # quotas ---------------------------------------------------------------------------
    def _active_rows(self, exclude: str | None = None) -> list[Any]:
        rows = cluster_table.clusters_of(self.store, self.caller.name)
        return [r for r in rows if r["name"] != exclude]

    def _cores_in_use(self, exclude: str | None = None) -> float:
        """Cores the caller's other clusters have, as their providers provision them."""
        return sum(cfgmod.cluster_cores(loads(r["config"], {}),
                                        loads(r["target_workers"], {}), self.settings)
                   for r in self._active_rows(exclude))

    def _check_quota(self, cfg: dict[str, Any], prov_res: Resource, replacing: str) -> None:
        quota = self.hub.catalog.quota_for(self.caller)
        existing = {r["name"] for r in self._active_rows()}
        if quota.get("max_clusters") is not None and replacing not in existing \
                and len(existing) >= quota["max_clusters"]:
            raise PermissionDeniedError(
                f"quota: you have {len(existing)} clusters; your quota allows "
                f"{quota['max_clusters']:g} ({quota['subject']})", field="quota")
        # what the provider provisions (a flavor's vCPUs, a worker's threads): a declared
        # ``CPU: 0`` is no free node
        new_cores = cfgmod.cluster_cores(cfg, {
            t: cfg["available_node_types"][t].get("min_workers", 0)
            for t in cfgmod.worker_types(cfg)}, self.settings)
        if quota.get("max_cores") is not None:
            used = self._cores_in_use(exclude=replacing)
            if used + new_cores > quota["max_cores"]:
                raise PermissionDeniedError(
                    f"quota: this cluster needs {new_cores:g} cores and you use {used:g}; "
                    f"your quota is {quota['max_cores']:g} cores ({quota['subject']})",
                    field="quota")
        if quota.get("max_spend_per_day") is not None:
            spent = self.hub.spend_today(self.caller.name)
            if spent >= quota["max_spend_per_day"]:
                raise PermissionDeniedError(
                    f"quota: you have spent {spent:.2f} today; your daily limit is "
                    f"{quota['max_spend_per_day']:.2f} ({quota['subject']})", field="quota")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


class StorageView(_Denied):
    """The sidekick's storages a user may use: browse, test, copy between storages.

    Credentials stay in the sidekick; what a user gets is listings and copies, never the
    options marked secret.  Local paths would be the sidekick's own disk, so they are
    refused; mounts are made in the user's own server."""

    _what = "storage"

    def __init__(self, hub: HubContext, caller: Caller) -> None:
        self.hub = hub
        self._s = hub.storage_manager()
        self.caller = caller
        self.catalog = self  # handlers call ``storage.catalog.get(name)`` as an existence check

    def _allowed(self, name: str) -> None:
        self.hub.grant(self.caller, "storage", name, "read", field="name")

    def get(self, name: str) -> Any:
        self._allowed(name)
        with acting_as(self.caller):
            return self._s.get(name)

    def list(self) -> list[Any]:
        if self.caller.admin:
            return self._s.list()
        names = set(self.hub.policy.visible(self.caller, "storage"))
        return [s for s in self._s.list() if s.name in names]

    async def ls(self, where: Any, *args: Any, **kwargs: Any) -> Any:
        loc = self.location(where, "path")
        with acting_as(self.caller):
            return await self._s.ls(loc, *args, **kwargs)

    async def test(self, name: str) -> Any:
        self._allowed(name)
        with acting_as(self.caller):
            return await self._s.test(name)

    @property
    def locations(self) -> NoLocal:
        """The hub's location policy for this caller: no local path is theirs; a storage
        is usable if the catalogue says so (read-only ones for reading)."""
        return hub_locations(self.hub, self.caller)

    def location(self, where: Any, field: str = "location", *, write: bool = False) -> Any:
        from ..storage.manager import Location  # deferred: start-up (storage.manager ~53 ms)

        if isinstance(where, Location):
            where = str(where) if where.storage else where.path
        r = resolve(where, field, self.locations, write=write,
                    is_storage=self._s.catalog.exists)
        if r.kind != "storage":
            raise PermissionDeniedError(
                f"{field}: {where!r} is not a storage path; through the hub, copies go "
                "between storages (NAME:path)", field=field, value=str(where))
        return Location(r.storage, r.path)

    async def start_copy(self, src: Any, dst: Any, mode: str = "copy") -> Any:
        s, d = self.location(src, "src"), self.location(dst, "dst", write=True)
        with acting_as(self.caller):
            return await self._s.start_copy(s, d, mode=mode)

    def backends(self) -> Any:
        return self._s.backends()

    def backend_schema(self, backend: str, provider: str | None = None) -> Any:
        return self._s.backend_schema(backend, provider)

    def add(self, *args: Any, **kwargs: Any) -> Any:
        raise PermissionDeniedError("storages of a hub are defined by its admins "
                                    "(catalogue kind 'storage')", field="name")

    async def remove(self, name: str) -> Any:
        raise PermissionDeniedError("storages of a hub are removed by its admins",
                                    field="name")

    async def start_mount(self, name: str, mode: str = "fuse") -> Any:
        raise PermissionDeniedError(
            f"mount: storage '{name}' belongs to the hub; mounts through the sidekick are "
            "not supported (browse and copy it instead)", field="name", value=name)

    async def start_unmount(self, name: str) -> Any:
        return await self.start_mount(name)


class JobsView(_Denied):
    """HPC jobs of one user, on the backends the catalogue lets them use."""

    _what = "jobs"

    def __init__(self, hub: HubContext, caller: Caller) -> None:
        self.hub = hub
        self._j = hub.job_manager()
        self.caller = caller
        self.hpc = self._j.hpc
        self.ops = OperationsView(self._j.ops, caller)

    def ensure_poller(self) -> None:
        self._j.ensure_poller()  # one poller for everybody's jobs, as in a server

    def _may_backend(self, name: str | None) -> None:
        name = name or self.hpc.default_backend
        self.hub.grant(self.caller, "hpc", name, "run", field="backend")
        btype = local_backend_type(self.hub, name)
        if btype and not self.hub.hub.allow_local_execution:  # offered before it was local
            raise PermissionDeniedError(
                f"backend: '{name}' ({btype}) runs jobs on the sidekick's own machine, which "
                "this hub does not allow (c.CloudTikHub.allow_local_execution)",
                field="backend", value=name)
        if btype == "dask" and not (self._j.registry.configs().get(name) or {}).get(
                "cluster"):
            # "the only running cluster" of a hub is anybody's: a job may not pick it
            raise PermissionDeniedError(
                f"backend: '{name}' runs a job on whichever cluster is running, which on a "
                f"hub may be another user's; an admin names its cluster "
                f"(c.HPC.backends.{name}.cluster)", field="backend", value=name)

    def get(self, job_id: str) -> Any:
        # resolved among the caller's own jobs (admins: all): another user's id or prefix
        # gets the very answer a missing one gets; callers below pass on the whole id
        return self._j.get(job_id, user=None if self.caller.admin else self.caller.name)

    def list(self, active_only: bool = False, backend: str | None = None,
             limit: int = 100, sweep_elements: bool = True) -> list[Any]:
        return self._j.list(active_only=active_only, backend=backend, limit=limit,
                            user=None if self.caller.admin else self.caller.name,
                            sweep_elements=sweep_elements)

    def backends(self) -> list[Any]:
        allowed = None if self.caller.admin else set(
            self.hub.policy.visible(self.caller, "hpc"))
        return [b for b in self._j.backends()
                if allowed is None or _backend_name(b) in allowed]

    @property
    def locations(self) -> NoLocal:
        return hub_locations(self.hub, self.caller)

    async def submit(self, spec: Any, backend: str | None = None, **kwargs: Any) -> Any:
        self._may_backend(backend)
        kwargs["locations"] = self.locations
        with acting_as(self.caller):
            return await self._j.submit(spec, backend, **kwargs)

    async def refresh(self, job_id: str) -> Any:
        return await self._j.refresh(self.get(job_id).id)

    async def cancel(self, job_id: str) -> Any:
        job_id = self.get(job_id).id
        with acting_as(self.caller):
            return await self._j.cancel(job_id)

    async def logs(self, job_id: str, *args: Any) -> Any:
        return await self._j.logs(self.get(job_id).id, *args)

    async def outputs(self, job_id: str) -> Any:
        return await self._j.outputs(self.get(job_id).id)

    async def read_file(self, job_id: str, *args: Any) -> Any:
        return await self._j.read_file(self.get(job_id).id, *args)

    def fetch_dest(self, job_id: str, dest: str | None = None, **kwargs: Any) -> Any:
        kwargs["locations"] = self.locations
        return self._j.fetch_dest(self.get(job_id).id, dest, **kwargs)

    async def fetch(self, job_id: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["locations"] = self.locations
        with acting_as(self.caller):
            return await self._j.fetch(self.get(job_id).id, *args, **kwargs)


    def sweeps(self) -> SweepsView:
        return SweepsView(self)


class SweepsView(_Denied):
    """Parameter sweeps of one user: the grants of single jobs (the backend's ``run``),
    their location policy, and only their own sweeps (another user's is a 404, exactly
    like a missing one)."""

    _what = "sweeps"

    def __init__(self, jobs: JobsView) -> None:
        # deferred: start-up (hpc.sweeps ~49 ms, loads asyncio, psutil)
        from ..hpc.sweeps import sweeps_of

        self._jobs = jobs
        self._s = sweeps_of(jobs._j)
        self.caller = jobs.caller

    def _user(self) -> str | None:
        return None if self.caller.admin else self.caller.name

    def get(self, sweep_id: str) -> Any:
        return self._s.get(sweep_id, user=self._user())

    def list(self, limit: int = 100) -> list[Any]:
        return self._s.list(user=self._user(), limit=limit)

    async def submit(self, spec: Any, backend: str | None = None, **kwargs: Any) -> Any:
        self._jobs._may_backend(backend)
        kwargs["locations"] = self._jobs.locations
        with acting_as(self.caller):
            return await self._s.submit(spec, backend, **kwargs)

    async def cancel(self, sweep_id: str, element: int | None = None) -> Any:
        sweep_id = self.get(sweep_id).id
        with acting_as(self.caller):
            return await self._s.cancel(sweep_id, element)

    async def retry(self, sweep_id: str) -> Any:
        info = self.get(sweep_id)
        self._jobs._may_backend(info.backend)  # still granted: a retry submits again
        with acting_as(self.caller):
            return await self._s.retry(info.id, locations=self._jobs.locations)

    async def results(self, sweep_id: str) -> Any:
        return await self._s.results(self.get(sweep_id).id)


def hub_locations(hub: HubContext, caller: Caller) -> NoLocal:
    """The location policy of one hub user (``core.locations.NoLocal``): no local path of
    the sidekick's machine is theirs, nor a path on an HPC system's shared account; a
    storage is theirs if the catalogue lets them use it — one "no storage named" for
    missing and not-yours — and read-only storages are not written."""

    def check(name: str, field: str, write: bool) -> None:
        # the policy's one answer for missing and not-theirs; read-only ones not written
        try:
            hub.grant(caller, "storage", name, "write" if write else "read", field=field)
        except NotFoundError:
            raise NotFoundError(f"{field}: no storage named {name!r}", field=field,
                                value=name) from None

    policy = NoLocal(check)
    policy.allow_system_paths = caller.admin
    return policy


def _backend_name(b: Any) -> str:
    return b.get("name") if isinstance(b, dict) else getattr(b, "name", str(b))


def started_today() -> float:
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


class NoKernelsView:
    """The sidekick's answer about interactive HPC kernels: it runs none (each user's own
    Jupyter server does, with its own backends), so it lists none and sizes none — never
    with the sidekick's backends, whose use is for jobs under the caller's grants."""

    def status(self) -> dict[str, dict[str, Any]]:
        return {}

    def size(self, backend: str | None, profile: str, size: dict[str, Any],
             hub: bool = False) -> dict[str, str]:
        raise ConflictError(
            "profile: interactive HPC kernels run in your own Jupyter server, not through "
            "the hub's sidekick; ask your server (its launcher's 'HPC kernel…' form; the "
            "sidekick's own check of its profiles is POST hub/kernel-sizes)",
            field="profile", value=profile)
