"""ClusterManager: up, down, scale and status of clusters, as recorded operations.

Operations are reconcilers.  ``up`` writes the desired state first (the cluster row, its
target worker counts), then compares it with what the provider reports (nodes found by
tags) and closes the gap: it starts a missing head, replaces dead or stale workers, adds
missing ones with one ``create_node(count=N)`` per chosen offer, and waits until they have
joined the scheduler.  Running ``up`` again after a crash, a kill or a cancel therefore
finishes the job, and ``down`` finds every node by its tags, so nothing started is ever
forgotten.  Every missing node is placed first, all at once, and held as claims under a
reservation id (``jupyter_cloudtik.placement``), before anything is recorded.

The manager is asynchronous; provider calls (blocking SDKs, process management) run in
worker threads.  Faces use it through ``jupyter_cloudtik.session`` and never re-implement
any of it.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from ..placement.cluster import ClusterPlacement
from ..providers.base import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UNINITIALIZED,
    STATUS_UP_TO_DATE,
    TAG_CLUSTER_NAME,
    TAG_LAUNCH_CONFIG,
    TAG_NODE_KIND,
    TAG_NODE_STATUS,
    TAG_NODE_TYPE,
    Capacity,
    ConnectInfo,
    NodeProvider,
    ProviderContext,
)
from ..runtime import dask as dask_runtime
from . import config as cfgmod
from .errors import (
    CapacityError,
    CloudTikError,
    ConfigError,
    ConflictError,
    NodeLaunchError,
    NotFoundError,
    OperationCancelled,
    OperationTimeout,
    error_from_dict,
)
from .identity import ActsForUser
from .models import ClusterInfo, NodeInfo
from .operations import Event, OperationContext, OperationInfo, Operations
from .settings import CloudTik, default_settings
from .store import Store, dumps, loads
from .units import format_bytes

log = logging.getLogger("jupyter_cloudtik")

WORKER_WAIT_POLL = 0.02

# Features that add to what every node gets: "module:function" called as
# fn(manager, cfg, role) -> dict merged into node_config["runtime"].  Credentials go in
# runtime["secret_files"] = [{"name", "content", "env"}]: a provider writes each file where
# only the node can read it and points the node's environment variable ``env`` at it (never
# into plain user_data); runtime["env"] holds plain environment variables.
RUNTIME_CONTRIBUTORS: tuple[str, ...] = ("jupyter_cloudtik.storage.cluster:node_runtime",)


def _contributions(manager: ClusterManager, cfg: dict[str, Any], role: str) -> dict[str, Any]:
    import importlib

    out: dict[str, Any] = {}
    for spec in RUNTIME_CONTRIBUTORS:
        module, _, name = spec.partition(":")
        extra = getattr(importlib.import_module(module), name)(manager, cfg, role) or {}
        for key, value in extra.items():
            if isinstance(value, list):
                out[key] = [*out.get(key, []), *value]
            elif isinstance(value, dict):
                out[key] = {**out.get(key, {}), **value}
            else:
                out[key] = value
    return out


def _target(name: str) -> str:
    return f"cluster:{name}"


def _launch_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


class OperationHandle:
    """A running (or finished) operation: watch its events, wait for it, cancel it."""

    def __init__(self, manager: ClusterManager, op_id: str,
                 task: asyncio.Task | None = None) -> None:
        self.manager = manager
        self.op_id = op_id
        self.task = task

    @property
    def info(self) -> OperationInfo:
        return self.manager.ops.get(self.op_id)

    def events(self, after: int = 0) -> AsyncIterator[Event]:
        return self.manager.ops.watch(self.op_id, after=after)

    async def wait(self) -> Any:
        return await self.manager.wait(self.op_id)

    async def cancel(self) -> OperationInfo:
        return await self.manager.cancel(self.op_id)


class ClusterManager(ActsForUser):
    """Creates, changes, observes and removes clusters; one per process is typical."""

    def __init__(self, settings: CloudTik | None = None, store: Store | None = None,
                 user: str | None = None) -> None:
        self.settings = settings or default_settings()
        self.store = store or Store(self.settings.state_dir)
        self.ops = Operations(self.store)
        self.user = user or _current_user()
        self._tasks: dict[str, asyncio.Task] = {}
        self.context = ProviderContext(
            state_dir=self.store.state_dir, store=self.store, settings=self.settings, log=log
        )
        # every node is placed (filters, weighers, claims) before it is created
        self.placement = ClusterPlacement(self.store, self.settings)

    # providers --------------------------------------------------------------------------
    def provider_for(self, cfg: dict[str, Any]) -> NodeProvider:
        cls = cfgmod.provider_class(cfg["provider"]["type"], self.settings)
        return cls(cfg["provider"], cfg["cluster_name"], self.context)

    def providers(self) -> list[dict[str, Any]]:
        """Installed providers with the JSON Schemas UIs build their forms from.

        A provider that is not allowed here (``c.CloudTik.allowed_providers``) or cannot be
        imported is listed with ``available: false`` and the reason, so a UI can say why.
        """
        from . import plugins

        out: list[dict[str, Any]] = []
        for name in plugins.installed(plugins.PROVIDERS):
            try:
                cls = cfgmod.provider_class(name, self.settings)
            except Exception as e:  # not allowed here, or a broken plugin: say which
                out.append({"name": name, "available": False, "default": False,
                            "reason": getattr(e, "message", None) or str(e)})
                continue
            out.append({
                "name": name,
                "available": True,
                "default": name == self.settings.default_provider,
                "title": cls.config_schema.get("title") or name,
                "description": cls.config_schema.get("description") or "",
                "config_schema": cls.config_schema,
                "node_config_schema": cls.node_config_schema,
                "default_node_types": cls.default_node_types({"type": name}),
            })
        return out

    # reading ------------------------------------------------------------------------------
    def _row(self, name: str):
        row = self.store.query_one("SELECT * FROM clusters WHERE name = ?", (name,))
        if row is None:
            known = [r[0] for r in self.store.query(
                "SELECT name FROM clusters WHERE state != 'stopped' ORDER BY name")]
            hint = f"; clusters: {', '.join(known)}" if known else "; there are no clusters"
            raise NotFoundError(f"no cluster named '{name}'{hint}", field="name", value=name)
        return row

    def get(self, name: str) -> ClusterInfo:
        """The recorded view of a cluster (no provider calls: cheap)."""
        return self._info(self._row(name))

    def list(self, include_stopped: bool = False) -> list[ClusterInfo]:
        sql = "SELECT * FROM clusters"
        if not include_stopped:
            sql += " WHERE state != 'stopped'"
        return [self._info(r) for r in self.store.query(sql + " ORDER BY created_at")]

    def _info(self, row) -> ClusterInfo:
        nodes = [
            NodeInfo(
                node_id=n["node_id"], node_type=n["node_type"], kind=n["kind"],
                status=n["status"], internal_ip=n["internal_ip"], external_ip=n["external_ip"],
                resources=loads(n["resources"], {}), info=loads(n["info"], {}),
            )
            for n in self.store.query(
                "SELECT * FROM nodes WHERE cluster = ? ORDER BY kind, created_at, node_id",
                (row["name"],),
            )
        ]
        last = self.store.query_one(
            "SELECT id, kind, state, reason, created_at, finished_at FROM operations"
            " WHERE target = ? ORDER BY created_at DESC LIMIT 1",
            (_target(row["name"]),),
        )
        cfg = loads(row["config"], {})
        connect = loads(self._connect_blob(row["name"]), None)
        return ClusterInfo(
            name=row["name"],
            provider=row["provider"],
            state=row["state"],
            reason=row["reason"],
            config=cfg,
            target_workers=loads(row["target_workers"], {}),
            scheduler_address=row["head_address"],
            dashboard_link=row["dashboard_link"],
            connect_info=connect,
            nodes=nodes,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            last_operation=dict(last) if last else None,
            placement=self.placement.summary(row["name"]),
            owner=row["owner"],
        )

    def _connect_blob(self, name: str) -> str | None:
        row = self.store.query_one(
            "SELECT info FROM nodes WHERE cluster = ? AND kind = 'head' AND status = 'running'"
            " ORDER BY created_at DESC LIMIT 1",
            (name,),
        )
        if row is None:
            return None
        return dumps(loads(row[0], {}).get("connect_info"))

    def connect_info(self, name: str) -> tuple[str, ConnectInfo]:
        """(provider type, how to reach the scheduler) of a running cluster."""
        info = self.get(name)
        if info.state == "stopped":
            raise ConflictError(
                f"cluster '{name}' is stopped; start it with `up` first", field="name"
            )
        if not info.connect_info:
            raise ConflictError(
                f"cluster '{name}' has no running scheduler yet (state: {info.state})",
                field="name",
            )
        return info.provider, ConnectInfo.from_dict(info.connect_info)

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        info = self.get(name)
        provider = self.provider_for(info.config)
        ids = provider.recent_nodes() or [n.node_id for n in info.nodes]
        if node_id is not None:
            if node_id not in ids:
                raise NotFoundError(
                    f"cluster '{name}' has no node '{node_id}'; nodes: {', '.join(ids)}",
                    field="node_id",
                )
            ids = [node_id]
        return {n: provider.node_logs(n, tail) for n in ids[-50:]}

    # operations: starting ------------------------------------------------------------------
    async def start_up(
        self,
        config: str | dict[str, Any] | None = None,
        *,
        name: str | None = None,
        workers: int | None = None,
        provider: str | None = None,
        template: str | None = None,
    ) -> OperationHandle:
        if template:
            raise ConfigError(
                f"template: '{template}' — cluster templates are offered by a JupyterHub "
                "sidekick's catalogue; here, give a config, provider and workers instead",
                field="template", value=template)
        cfg = cfgmod.build_config(
            config, name=name, workers=workers, provider=provider, settings=self.settings
        )
        _contributions(self, cfg, NODE_KIND_HEAD)  # a bad storage: section fails here, early
        name = cfg["cluster_name"]
        chash = cfgmod.config_hash(cfg)
        row = self.store.query_one("SELECT * FROM clusters WHERE name = ?", (name,))
        existing = row is not None and row["state"] != "stopped"
        if existing and row["config_hash"] != chash:
            diff = "; ".join(cfgmod.config_diff(loads(row["config"], {}), cfg))
            raise ConflictError(
                f"cluster '{name}' exists with a different config ({diff}); use `scale` "
                f"to change its size, `down` it first, or choose another name",
                field="cluster_name",
                value=name,
            )
        attach = self._attach_to_active(name, "cluster.up", chash)
        if attach is not None:
            return attach
        if not existing and self.settings.max_clusters:
            count = self.store.query_one(
                "SELECT COUNT(*) FROM clusters WHERE state != 'stopped'")[0]
            if count >= self.settings.max_clusters:
                raise CapacityError(
                    f"{count} clusters exist; this installation allows at most "
                    f"{self.settings.max_clusters} (c.CloudTik.max_clusters)",
                    field="cluster_name",
                )

        prov = self.provider_for(cfg)
        target = (
            loads(row["target_workers"], {}) if existing
            else {t: cfg["available_node_types"][t]["min_workers"]
                  for t in cfgmod.worker_types(cfg)}
        )
        await asyncio.to_thread(self._check_capacity, prov, cfg, target)
        reservation = await asyncio.to_thread(self._reserve, prov, cfg, target)

        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO clusters (name, provider, config, config_hash, state, target_workers,"
                " owner, created_at, updated_at) VALUES (?, ?, ?, ?, 'starting', ?, ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET provider = excluded.provider,"
                " config = excluded.config, config_hash = excluded.config_hash,"
                " state = 'starting', reason = NULL, target_workers = excluded.target_workers,"
                " updated_at = excluded.updated_at,"
                " owner = CASE WHEN clusters.state = 'stopped' THEN excluded.owner"
                " ELSE clusters.owner END,"
                " created_at = CASE WHEN clusters.state = 'stopped' THEN excluded.created_at"
                " ELSE clusters.created_at END",
                (name, cfg["provider"]["type"], dumps(cfg), chash, dumps(target), self.user,
                 now, now),
            )
        rid = reservation.id if reservation else None
        try:
            op = self.ops.start("cluster.up", _target(name),
                                {"config_hash": chash, "workers": target, "reservation": rid},
                                user=self.user)
        except ConflictError:
            self.placement.finish(rid)
            attach = self._attach_to_active(name, "cluster.up", chash)
            if attach is not None:
                return attach
            raise
        self._placement_event(op.id, reservation)
        return self._launch(op, self._up(OperationContext(self.ops, op.id), prov, cfg, rid))

    async def start_down(self, name: str, reason: str | None = None) -> OperationHandle:
        row = self._row(name)
        if row["state"] == "stopped":
            op = self.ops.start("cluster.down", _target(name), {"reason": reason},
                                user=self.user, exclusive=False)
            self.ops.finish(op.id, "succeeded", result={"cluster": name, "already": True})
            return OperationHandle(self, op.id)
        await self._cancel_active(name)
        self._set_state(name, "stopping")
        op = self.ops.start("cluster.down", _target(name), {"reason": reason}, user=self.user)
        cfg = loads(row["config"], {})
        return self._launch(
            op, self._down(OperationContext(self.ops, op.id), self.provider_for(cfg), cfg,
                           reason)
        )

    async def start_scale(
        self, name: str, workers: int, node_type: str | None = None
    ) -> OperationHandle:
        row = self._row(name)
        cfg = loads(row["config"], {})
        if row["state"] in ("stopped", "stopping"):
            raise ConflictError(
                f"cluster '{name}' is {row['state']}; start it with `up` before scaling",
                field="name",
            )
        wtypes = cfgmod.worker_types(cfg)
        if node_type is None:
            if len(wtypes) != 1:
                raise ConfigError(
                    f"node_type: cluster '{name}' has several worker types "
                    f"({', '.join(wtypes)}); say which one to scale",
                    field="node_type",
                )
            node_type = wtypes[0]
        if node_type not in wtypes:
            raise ConfigError(
                f"node_type: '{node_type}' is not a worker type of cluster '{name}' "
                f"(worker types: {', '.join(wtypes)})",
                field="node_type",
                value=node_type,
            )
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigError(f"workers: {workers!r} is not a whole number (0 or more)",
                              field="workers", value=workers)
        tmax = cfg["available_node_types"][node_type]["max_workers"]
        if workers > tmax:
            raise ConfigError(
                f"workers: {workers} is more than max_workers of node type '{node_type}' "
                f"({tmax})",
                field="workers",
                value=workers,
            )
        target = loads(row["target_workers"], {})
        new_target = {**target, node_type: workers}
        if sum(new_target.values()) > cfg["max_workers"]:
            raise ConfigError(
                f"workers: {sum(new_target.values())} workers in total is more than the "
                f"cluster's max_workers ({cfg['max_workers']})",
                field="workers",
                value=workers,
            )
        await self._cancel_active(name, kinds=("cluster.scale",))
        prov = self.provider_for(cfg)
        await asyncio.to_thread(self._check_capacity, prov, cfg, new_target)
        reservation = await asyncio.to_thread(self._reserve, prov, cfg, new_target)
        rid = reservation.id if reservation else None
        try:
            op = self.ops.start("cluster.scale", _target(name),
                                {"node_type": node_type, "workers": workers,
                                 "reservation": rid}, user=self.user)
        except ConflictError:
            self.placement.finish(rid)
            raise
        self._placement_event(op.id, reservation)
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE clusters SET target_workers = ?, state = 'scaling', updated_at = ?"
                " WHERE name = ?",
                (dumps(new_target), time.time(), name),
            )
        return self._launch(op, self._scale(OperationContext(self.ops, op.id), prov, cfg, rid))

    def _attach_to_active(self, name: str, kind: str, chash: str) -> OperationHandle | None:
        for op in self.ops.active_for(_target(name)):
            if op.kind == kind and op.params.get("config_hash") == chash:
                return OperationHandle(self, op.id, self._tasks.get(op.id))
        return None

    async def _cancel_active(self, name: str, kinds: tuple[str, ...] | None = None,
                             timeout: float = 60.0) -> None:
        """Cancel running operations on the cluster and wait until they have stopped."""
        active = [op for op in self.ops.active_for(_target(name))
                  if kinds is None or op.kind in kinds]
        for op in active:
            await self.cancel(op.id)
        deadline = time.monotonic() + timeout
        while active:
            active = [op for op in self.ops.active_for(_target(name))
                      if kinds is None or op.kind in kinds]
            if not active:
                return
            if time.monotonic() > deadline:
                raise ConflictError(
                    f"cluster '{name}': operation {active[0].id} ({active[0].kind}) did not "
                    f"stop within {timeout:.0f}s of being cancelled",
                    field="name",
                )
            await asyncio.sleep(0.05)

    def _launch(self, op: OperationInfo, coro: Awaitable[Any]) -> OperationHandle:
        task = asyncio.get_running_loop().create_task(self._run(op, coro))
        self._tasks[op.id] = task
        task.add_done_callback(lambda _t, op_id=op.id: self._tasks.pop(op_id, None))
        return OperationHandle(self, op.id, task)

    async def _run(self, op: OperationInfo, coro: Awaitable[Any]) -> Any:
        name = op.target.split(":", 1)[1]
        try:
            result = await asyncio.wait_for(coro, self.settings.operation_timeout)
        except (OperationCancelled, asyncio.CancelledError):
            self.ops.finish(op.id, "cancelled", reason="cancelled by request",
                            result={"error": OperationCancelled("cancelled").to_dict()})
            if op.kind != "cluster.down":
                self._set_state(name, "failed", f"{op.kind} was cancelled; run `up` to "
                                "finish it or `down` to remove what was started")
            return None
        except (asyncio.TimeoutError, OperationTimeout) as e:
            err = e if isinstance(e, OperationTimeout) else OperationTimeout(
                f"{op.kind} did not finish within {self.settings.operation_timeout:.0f}s "
                "(c.CloudTik.operation_timeout)")
            self._fail(op, name, err)
            return None
        except CloudTikError as e:
            self._fail(op, name, e)
            return None
        except Exception as e:  # a bug or an unexpected provider failure
            log.exception("operation %s (%s) failed", op.id, op.kind)
            self._fail(op, name, CloudTikError(f"internal error: {type(e).__name__}: {e}"))
            return None
        self.ops.finish(op.id, "succeeded", result=result)
        return result

    def _fail(self, op: OperationInfo, name: str, err: CloudTikError) -> None:
        self.ops.finish(op.id, "failed", reason=err.message, result={"error": err.to_dict()})
        if op.kind == "cluster.down":
            self._set_state(name, "failed", f"down failed: {err.message}")
        else:
            self._set_state(name, "failed", err.message)

    async def wait(self, op_id: str, poll: float = 0.1) -> Any:
        """The result of an operation; raises its error if it failed or was cancelled."""
        task = self._tasks.get(op_id)
        if task is not None:
            await asyncio.shield(task)
        else:
            async for _ in self.ops.watch(op_id, poll_interval=poll):
                pass
        op = self.ops.get(op_id)
        if op.state == "succeeded":
            return op.result
        err = (op.result or {}).get("error") if isinstance(op.result, dict) else None
        if op.state == "cancelled":
            raise OperationCancelled(f"{op.kind} {op.target} was cancelled")
        raise error_from_dict(err or {"message": op.reason or "failed"})

    async def cancel(self, op_id: str) -> OperationInfo:
        self.ops.request_cancel(op_id)
        task = self._tasks.get(op_id)
        if task is not None and not task.done():
            task.cancel()
            try:
                await asyncio.shield(task)
            except BaseException:
                pass
        return self.ops.get(op_id)

    async def up(self, config: str | dict[str, Any] | None = None, **kw: Any) -> ClusterInfo:
        handle = await self.start_up(config, **kw)
        result = await handle.wait()
        return self.get(result["cluster"])

    async def down(self, name: str, reason: str | None = None) -> None:
        await (await self.start_down(name, reason)).wait()

    async def scale(self, name: str, workers: int, node_type: str | None = None) -> ClusterInfo:
        await (await self.start_scale(name, workers, node_type)).wait()
        return self.get(name)

    # capacity -------------------------------------------------------------------------------
    def _check_capacity(self, prov: NodeProvider, cfg: dict[str, Any],
                        target: dict[str, int]) -> None:
        """Refuse before starting anything when the provider cannot hold the new nodes."""
        cap: Capacity = prov.capacity()
        if cap.cpus is None and cap.memory is None and cap.gpus is None and (
                cap.max_nodes is None):
            return
        name = cfg["cluster_name"]
        types = cfg["available_node_types"]
        need = {"CPU": 0.0, "memory": 0, "GPU": 0}
        parts = []
        missing_by_type = self._missing(prov, cfg, target)
        for t, missing in missing_by_type.items():
            res = types[t]["resources"]
            for k in need:
                need[k] += missing * (res.get(k) or 0)
            if missing:
                parts.append(
                    f"{missing} x {t} ({res.get('CPU', 0)} CPU, {format_bytes(res.get('memory'))})"
                )
        others = ", ".join(
            f"{c}: {u['CPU']:g} CPU" for c, u in sorted(cap.in_use.items()) if c != name
        )
        in_use = f"; in use by other clusters: {others}" if others else ""
        problems = []
        if cap.cpus is not None and need["CPU"] > cap.cpus + 1e-9:
            problems.append(f"{need['CPU']:g} CPU cores needed, {cap.cpus:g} free")
        if cap.memory is not None and need["memory"] > cap.memory:
            problems.append(
                f"{format_bytes(need['memory'])} of memory needed, "
                f"{format_bytes(cap.memory)} free")
        if cap.gpus is not None and need["GPU"] > cap.gpus:
            problems.append(f"{need['GPU']:g} GPUs needed, {cap.gpus} available")
        new_nodes = sum(missing_by_type.values())
        if cap.max_nodes is not None and new_nodes > cap.max_nodes:
            problems.append(f"{new_nodes} more node(s) needed, {cap.max_nodes} allowed")
        if problems:
            raise CapacityError(
                f"not enough capacity for cluster '{name}' ({', '.join(parts)}): "
                f"{'; '.join(problems)} — {cap.description}{in_use}. Ask for fewer workers "
                f"or smaller resources; nothing was started.",
                field="workers",
            )

    def _missing(self, prov: NodeProvider, cfg: dict[str, Any],
                 target: dict[str, int]) -> dict[str, int]:
        """Nodes of each type that ``target`` (plus the head) needs beyond what exists."""
        name = cfg["cluster_name"]
        wanted = {cfg["head_node_type"]: 1, **target}
        return {
            t: max(count - len(prov.non_terminated_nodes(
                {TAG_CLUSTER_NAME: name, TAG_NODE_TYPE: t})), 0)
            for t, count in wanted.items()
        }

    def _reserve(self, prov: NodeProvider, cfg: dict[str, Any], target: dict[str, int]):
        """Place every missing node at once and hold the choice as claims (placement/)."""
        return self.placement.reserve(prov, cfg, self._missing(prov, cfg, target), self.user)

    def _placement_event(self, op_id: str, reservation) -> None:
        if reservation is None:
            return
        where: dict[str, int] = {}
        for c in reservation.claims:
            spot = "/".join(x for x in (c.provider, c.availability_zone, c.flavor) if x)
            key = f"{c.node_type} on {spot}"
            where[key] = where.get(key, 0) + 1
        unit = f" {reservation.currency}" if reservation.currency else ""
        cost = f"{reservation.price_per_hour:.3f}{unit}"
        self.ops.emit(
            op_id, "placement",
            f"placed {reservation.instances} node(s) at once ("
            + ", ".join(f"{n} x {k}" for k, n in where.items())
            + f"); reservation {reservation.id}; estimated cost {cost} per hour",
            0.01, data={"reservation": reservation.id,
                        "price_per_hour": reservation.price_per_hour,
                        "currency": reservation.currency})

    # operations: the work -------------------------------------------------------------------
    def _runtime_config(self, cfg: dict[str, Any], type_name: str, role: str,
                        scheduler_address: str | None = None) -> dict[str, Any]:
        t = cfg["available_node_types"][type_name]
        res = t["resources"]
        runtime = {
            "role": role,
            "cluster_name": cfg["cluster_name"],
            "nthreads": max(int(res.get("CPU") or 1), 1),
            "memory_limit": int(res.get("memory") or 0),
            "resources": res,
            "setup_commands": list(cfg.get("setup_commands") or []),
            "dask": dict((cfg.get("runtime") or {}).get("dask") or {}),
        }
        if scheduler_address:
            runtime["scheduler_address"] = scheduler_address
        runtime.update(_contributions(self, cfg, role))
        return {**t.get("node_config", {}), "runtime": runtime}

    async def _up(self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
                  rid: str | None = None) -> Any:
        started = time.monotonic()
        name = cfg["cluster_name"]
        placing = {"rid": rid}
        try:
            ctx.progress("bootstrap", f"preparing the {cfg['provider']['type']} provider",
                         0.02)
            cfg = await asyncio.to_thread(prov.bootstrap_config, cfg)
            ctx.checkpoint()
            info, head_replaced = await self._ensure_head(ctx, prov, cfg, placing)
            target = loads(self._row(name)["target_workers"], {})
            await self._reconcile_workers(ctx, prov, cfg, info, target, head_replaced,
                                          placing)
        finally:  # claims no node was created for go back at once
            await asyncio.to_thread(self.placement.finish, placing["rid"])
        state = await self._observe(prov, cfg, info)
        ready_in = round(time.monotonic() - started, 3)
        self._set_state(name, "running")
        ctx.progress("ready", f"cluster '{name}' is running: {state['workers']} workers, "
                     f"dashboard {info.dashboard_link or '-'}", 1.0,
                     dashboard_link=info.dashboard_link, seconds=ready_in)
        return {"cluster": name, "workers": state["workers"], "seconds": ready_in,
                "dashboard_link": info.dashboard_link}

    async def _ensure_head(
        self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
        placing: dict[str, str | None] | None = None,
    ) -> tuple[ConnectInfo, bool]:
        placing = placing if placing is not None else {"rid": None}
        name = cfg["cluster_name"]
        head_type = cfg["head_node_type"]
        want_hash = _launch_hash(cfg["available_node_types"][head_type],
                                 cfg.get("setup_commands"), cfg.get("runtime"))
        heads = await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD})
        keep, drop = None, []
        for h in heads:
            ok = await asyncio.to_thread(prov.is_running, h)
            tags = await asyncio.to_thread(prov.node_tags, h)
            if ok and keep is None and tags.get(TAG_LAUNCH_CONFIG) == want_hash:
                keep = h
            else:
                drop.append(h)
        if drop:
            ctx.progress("head", f"removing {len(drop)} broken or outdated head node(s)", 0.05)
            await asyncio.to_thread(prov.terminate_nodes, drop)
            await asyncio.to_thread(self.placement.release_nodes, name, drop)
        replaced = keep is None
        if keep is None:
            ctx.progress("head", "starting the head node (dask scheduler)", 0.08)
            created, placing["rid"] = await _finish_in_thread(
                self.placement.create_nodes, prov, cfg, placing["rid"], head_type,
                self._runtime_config(cfg, head_type, NODE_KIND_HEAD),
                {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD,
                 TAG_NODE_TYPE: head_type, TAG_NODE_STATUS: STATUS_UNINITIALIZED,
                 TAG_LAUNCH_CONFIG: want_hash},
                1, self.user, self._failover_note(ctx, 0.08),
            )
            if not created:
                raise NodeLaunchError("the provider created no head node")
            keep = next(iter(created))
        else:
            ctx.progress("head", f"head node {keep} is running", 0.08)
        info = await prov.wait_head_ready(keep, ctx, self.settings.operation_timeout)
        await asyncio.to_thread(prov.set_node_tags, keep, {TAG_NODE_STATUS: STATUS_UP_TO_DATE})
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE clusters SET head_address = ?, dashboard_link = ?, updated_at = ?"
                " WHERE name = ?",
                (info.scheduler_address, info.dashboard_link, time.time(), name),
            )
        self._record_node(name, keep, head_type, NODE_KIND_HEAD, "running",
                          cfg["available_node_types"][head_type]["resources"], prov,
                          {"connect_info": info.to_dict()})
        ctx.progress("head", f"scheduler is up at {info.scheduler_address}", 0.3,
                     dashboard_link=info.dashboard_link)
        return info, replaced

    async def _reconcile_workers(
        self,
        ctx: OperationContext,
        prov: NodeProvider,
        cfg: dict[str, Any],
        info: ConnectInfo,
        target: dict[str, int],
        head_replaced: bool = False,
        placing: dict[str, str | None] | None = None,
    ) -> None:
        name = cfg["cluster_name"]
        placing = placing if placing is not None else {"rid": None}
        expected: dict[str, str] = {}  # node id -> type
        for wtype in cfgmod.worker_types(cfg):
            desired = int(target.get(wtype, 0))
            node_config = self._runtime_config(cfg, wtype, NODE_KIND_WORKER,
                                               info.scheduler_address)
            want_hash = _launch_hash(node_config)
            nodes = await asyncio.to_thread(
                prov.non_terminated_nodes,
                {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_WORKER, TAG_NODE_TYPE: wtype})
            alive, drop = [], []
            for n in nodes:
                tags = await asyncio.to_thread(prov.node_tags, n)
                ok = await asyncio.to_thread(prov.is_running, n)
                if ok and tags.get(TAG_LAUNCH_CONFIG) == want_hash and not head_replaced:
                    alive.append(n)
                else:
                    drop.append(n)
            extra = alive[desired:] if len(alive) > desired else []
            alive = alive[:desired]
            if extra:
                ctx.progress("workers", f"retiring {len(extra)} worker(s) of type '{wtype}'",
                             0.35)
                try:
                    connected = await dask_runtime.connected_workers(info)
                    await dask_runtime.retire_workers(
                        info, [connected[n] for n in extra if n in connected])
                except (dask_runtime.SchedulerUnreachable, LookupError):
                    pass  # stopping them is still right; the data is recomputed
            if drop:
                ctx.progress("workers", f"replacing {len(drop)} dead or outdated worker(s) "
                             f"of type '{wtype}'", 0.35)
            if drop or extra:
                await asyncio.to_thread(prov.terminate_nodes, drop + extra)
                await asyncio.to_thread(self.placement.release_nodes, name, drop + extra)
                for n in drop + extra:
                    self._forget_node(name, n)
            ctx.checkpoint()
            missing = desired - len(alive)
            if missing > 0:
                ctx.progress("workers", f"starting {missing} worker(s) of type '{wtype}'", 0.4)
                created, placing["rid"] = await _finish_in_thread(
                    self.placement.create_nodes, prov, cfg, placing["rid"], wtype,
                    node_config,
                    {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_WORKER,
                     TAG_NODE_TYPE: wtype, TAG_NODE_STATUS: STATUS_UNINITIALIZED,
                     TAG_LAUNCH_CONFIG: want_hash},
                    missing, self.user, self._failover_note(ctx, 0.4),
                )
                alive += list(created)
            for n in alive:
                expected[n] = wtype
                self._record_node(name, n, wtype, NODE_KIND_WORKER, "starting",
                                  cfg["available_node_types"][wtype]["resources"], prov)
        await self._wait_workers(ctx, prov, cfg, info, expected)

    def _failover_note(self, ctx: OperationContext, fraction: float):
        return lambda message: ctx.progress("placement", message, fraction, level="warning")

    async def _wait_workers(self, ctx: OperationContext, prov: NodeProvider,
                            cfg: dict[str, Any], info: ConnectInfo,
                            expected: dict[str, str]) -> None:
        name = cfg["cluster_name"]
        total = len(expected)
        if total == 0:
            ctx.progress("workers", "no workers wanted", 0.95)
            return
        deadline = time.monotonic() + self.settings.operation_timeout
        seen: set[str] = set()
        last_liveness = time.monotonic()
        ctx.progress("workers", f"0/{total} workers connected", 0.5, connected=0, total=total)
        while True:
            ctx.checkpoint()
            try:
                connected = await dask_runtime.connected_workers(info)
            except dask_runtime.SchedulerUnreachable:
                connected = {}
            now_seen = {n for n in expected if n in connected}
            for n in sorted(now_seen - seen):
                self._record_node(name, n, expected[n], NODE_KIND_WORKER, "running",
                                  cfg["available_node_types"][expected[n]]["resources"], prov)
                await asyncio.to_thread(prov.set_node_tags, n,
                                        {TAG_NODE_STATUS: STATUS_UP_TO_DATE})
            if now_seen != seen:
                seen = now_seen
                ctx.progress("workers", f"{len(seen)}/{total} workers connected",
                             0.5 + 0.45 * len(seen) / total, connected=len(seen), total=total)
            if len(seen) == total:
                return
            if time.monotonic() - last_liveness > 0.5:
                last_liveness = time.monotonic()
                for n in set(expected) - seen:
                    if not await asyncio.to_thread(prov.is_running, n):
                        hint = await asyncio.to_thread(prov.node_failure_hint, n)
                        raise NodeLaunchError(f"worker {n} stopped before joining the "
                                              f"scheduler: {hint}")
            if time.monotonic() > deadline:
                raise OperationTimeout(
                    f"only {len(seen)} of {total} workers joined the scheduler within "
                    f"{self.settings.operation_timeout:.0f}s"
                )
            await asyncio.sleep(WORKER_WAIT_POLL)

    async def _down(self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
                    reason: str | None) -> Any:
        name = cfg["cluster_name"]
        if reason:
            ctx.progress("terminate", reason, 0.05)
        nodes = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        ctx.progress("terminate", f"stopping {len(nodes)} node(s)", 0.1, nodes=len(nodes))
        # workers first: with their scheduler still up they unregister and exit at once
        heads = set(await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD}))
        workers = [n for n in nodes if n not in heads]
        if workers:
            await asyncio.to_thread(prov.terminate_nodes, workers)
            ctx.progress("terminate", f"stopped {len(workers)} worker(s)", 0.5)
        if heads:
            await asyncio.to_thread(prov.terminate_nodes, sorted(heads))
        left = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        if left:
            await asyncio.to_thread(prov.terminate_nodes, left)
            left = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
            if left:
                raise CloudTikError(f"{len(left)} node(s) could not be stopped: "
                                    f"{', '.join(left)}; run `down` again")
        orphans = await asyncio.to_thread(prov.sweep_orphans)
        if orphans:
            ctx.progress("terminate", f"stopped {orphans} unrecorded process group(s)", 0.9)
        await asyncio.to_thread(prov.cleanup)
        await asyncio.to_thread(self.placement.release_nodes, name)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            conn.execute(
                "UPDATE clusters SET state = 'stopped', reason = ?, head_address = NULL,"
                " dashboard_link = NULL, updated_at = ? WHERE name = ?",
                (reason, time.time(), name),
            )
        ctx.progress("terminate", f"cluster '{name}' is stopped", 1.0)
        return {"cluster": name, "stopped_nodes": len(nodes)}

    async def _scale(self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
                     rid: str | None = None) -> Any:
        name = cfg["cluster_name"]
        # the same bootstrapped node configs as `up`: same launch hashes, nothing replaced
        cfg = await asyncio.to_thread(prov.bootstrap_config, cfg)
        heads = await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD})
        info = None
        for h in heads:
            info = await asyncio.to_thread(prov.connect_info, h)
            if info is not None:
                break
        if info is None:
            raise ConflictError(
                f"cluster '{name}' has no running head node; run `up` to repair it",
                field="name",
            )
        target = loads(self._row(name)["target_workers"], {})
        ctx.progress("workers", f"scaling to {sum(target.values())} worker(s)", 0.1)
        placing = {"rid": rid}
        try:
            await self._reconcile_workers(ctx, prov, cfg, info, target, placing=placing)
        finally:
            await asyncio.to_thread(self.placement.finish, placing["rid"])
        state = await self._observe(prov, cfg, info)
        self._set_state(name, "running")
        ctx.progress("ready", f"cluster '{name}' has {state['workers']} workers", 1.0)
        return {"cluster": name, "workers": state["workers"]}

    # observing --------------------------------------------------------------------------------
    async def status(self, name: str) -> ClusterInfo:
        """Ask the provider and the scheduler what is really there, record it, return it."""
        row = self._row(name)
        if row["state"] == "stopped":
            return self._info(row)
        cfg = loads(row["config"], {})
        prov = self.provider_for(cfg)
        heads = await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD})
        info = None
        for h in heads:
            if await asyncio.to_thread(prov.is_running, h):
                info = await asyncio.to_thread(prov.connect_info, h)
                if info:
                    break
        observed = await self._observe(prov, cfg, info)
        busy = self.ops.active_for(_target(name))
        if not busy:
            wanted = sum(loads(row["target_workers"], {}).values())
            if info is None:
                self._set_state(name, "failed",
                                "the head node is gone; run `up` to restart it or `down` to "
                                "clean up")
            elif observed["workers"] < wanted:
                self._set_state(name, "degraded",
                                f"{observed['workers']} of {wanted} workers are running; run "
                                "`up` to replace the missing ones")
            else:
                self._set_state(name, "running")
        return self.get(name)

    async def _observe(self, prov: NodeProvider, cfg: dict[str, Any],
                       info: ConnectInfo | None) -> dict[str, int]:
        """Refresh the nodes table from the provider and the scheduler."""
        name = cfg["cluster_name"]
        node_ids = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        connected: dict[str, str] = {}
        if info is not None:
            try:
                connected = await dask_runtime.connected_workers(info)
            except (dask_runtime.SchedulerUnreachable, LookupError):
                connected = {}
        workers = 0
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
        for n in node_ids:
            tags = await asyncio.to_thread(prov.node_tags, n)
            kind = tags.get(TAG_NODE_KIND, NODE_KIND_WORKER)
            ntype = tags.get(TAG_NODE_TYPE, "")
            running = await asyncio.to_thread(prov.is_running, n)
            if kind == NODE_KIND_HEAD:
                status = "running" if running and info else ("starting" if running else "broken")
                extra = {"connect_info": info.to_dict()} if info else {}
            else:
                status = ("running" if n in connected else "starting") if running else "broken"
                workers += status == "running"
                extra = {"address": connected.get(n)} if n in connected else {}
            res = (cfg["available_node_types"].get(ntype) or {}).get("resources", {})
            self._record_node(name, n, ntype, kind, status, res, prov, extra)
        return {"workers": workers, "nodes": len(node_ids)}

    # records ------------------------------------------------------------------------------
    def _record_node(self, cluster: str, node_id: str, node_type: str, kind: str, status: str,
                     resources: dict[str, Any], prov: NodeProvider,
                     extra: dict[str, Any] | None = None) -> None:
        info = {**prov.node_info(node_id), **(extra or {})}
        placed = self.placement.node_placement(cluster, node_id)
        if placed:
            info["placement"] = placed
        now = time.time()
        try:
            internal_ip = prov.internal_ip(node_id)
            external_ip = prov.external_ip(node_id)
        except Exception:
            internal_ip = external_ip = None
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO nodes (cluster, node_id, node_type, kind, status, internal_ip,"
                " external_ip, resources, info, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(cluster, node_id) DO UPDATE SET status = excluded.status,"
                " internal_ip = excluded.internal_ip, external_ip = excluded.external_ip,"
                " resources = excluded.resources, info = excluded.info,"
                " updated_at = excluded.updated_at",
                (cluster, node_id, node_type, kind, status, internal_ip, external_ip,
                 dumps(resources), dumps(info), now, now),
            )

    def _forget_node(self, cluster: str, node_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ? AND node_id = ?",
                         (cluster, node_id))

    def _set_state(self, name: str, state: str, reason: str | None = None) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE clusters SET state = ?, reason = ?, updated_at = ? WHERE name = ?",
                (state, reason, time.time(), name),
            )


async def _finish_in_thread(fn: Any, *args: Any) -> Any:
    """A provider call that creates things, run in a thread and never abandoned.

    When the operation is cancelled meanwhile, the call still finishes before the
    cancellation goes on, so what it created is tagged and a following ``down`` finds it
    (abandoning the thread let a node appear after ``down`` had looked: a leak).
    """
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait({fut})
        raise


def _current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"
