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
import uuid
from collections.abc import Awaitable
from typing import Any
from urllib.parse import quote

from ..core import config as cfgmod
from ..core.errors import (
    CapacityError,
    CloudTikError,
    ConfigError,
    ConflictError,
    NodeLaunchError,
    NotFoundError,
    OperationCancelled,
    OperationTimeout,
    ProviderError,
)
from ..core.identity import ActsForUser
from ..core.models import ClusterInfo, NodeInfo
from ..core.operations import OperationContext, OperationInfo, Operations, Target
from ..core.runner import OperationHandle, OperationRunner
from ..core.settings import CloudTik, default_settings
from ..core.store import Store, dumps, loads
from ..core.units import format_bytes
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
from ..runtime import base as runtimes

log = logging.getLogger("jupyter_cloudtik")

WORKER_WAIT_POLL = 0.01

# Features that add to what every node gets: "module:function" called as
# fn(manager, cfg, role) -> dict merged into node_config["runtime"].  Credentials go in
# runtime["secret_files"] = [{"name", "content", "env"}]: a provider writes each file where
# only the node can read it and points the node's environment variable ``env`` at it (never
# into plain user_data); runtime["env"] holds plain environment variables.
# Features contribute through their ``node_runtime`` parts (core/features.py; storage's
# mounts are one), so the core names none of them.


def _contributions(manager: ClusterManager, cfg: dict[str, Any], role: str) -> dict[str, Any]:
    from ..core.features import node_runtime_contributors

    out: dict[str, Any] = {}
    for contribute in node_runtime_contributors():
        extra = contribute(manager, cfg, role) or {}
        for key, value in extra.items():
            if isinstance(value, list):
                out[key] = [*out.get(key, []), *value]
            elif isinstance(value, dict):
                out[key] = {**out.get(key, {}), **value}
            else:
                out[key] = value
    return out


def _target(name: str) -> str:
    return str(Target("cluster", name))


def _launch_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


class ClusterManager(ActsForUser):
    """Creates, changes, observes and removes clusters; one per process is typical."""

    #: set by a server that serves dashboards (``{base_url}cloudtik/dashboard/``): the
    #: ``dashboard_link`` of every cluster is then that URL, not the cluster's own port
    dashboard_prefix: str | None = None
    #: likewise for Spark's UI (``{base_url}cloudtik/spark/``): ``spark_ui_link``
    spark_ui_prefix: str | None = None

    def __init__(self, settings: CloudTik | None = None, store: Store | None = None,
                 user: str | None = None) -> None:
        self.settings = settings or default_settings()
        self.store = store or Store(self.settings.state_dir)
        self.ops = Operations(self.store)
        self.user = user or _current_user()
        self.runner = OperationRunner(
            self.ops, timeout=lambda: self.settings.operation_timeout,
            on_failed=self._on_failed, on_cancelled=self._on_cancelled,
            what="cluster operation")
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
        from ..core import plugins

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
            # the hint names the caller's own clusters only (a hub serves many owners)
            known = [r[0] for r in self.store.query(
                "SELECT name FROM clusters WHERE state != 'stopped'"
                " AND (owner = ? OR owner IS NULL) ORDER BY name", (self.user,))]
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
            "SELECT id, kind, state, reason, created_at, finished_at, params FROM operations"
            " WHERE target = ? ORDER BY created_at DESC LIMIT 1",
            (_target(row["name"]),),
        )
        if last is not None:  # its warnings (oversubscription) are shown with the cluster
            last = dict(last)
            last["warnings"] = list(loads(last.pop("params"), {}).get("warnings") or [])
        cfg = loads(row["config"], {})
        connect = loads(self._connect_blob(row["name"]), None)
        types = list((cfg.get("runtime") or {}).get("types") or ["dask"])
        spark_ui = (((connect or {}).get("extra") or {}).get("spark") or {}).get("ui")
        if spark_ui and self.spark_ui_prefix:
            spark_ui = self.spark_ui_prefix + quote(row["name"], safe="") + "/"
        # a Spark-only cluster's dashboard is its Spark UI (not Dask's route)
        dask_prefix = self.dashboard_prefix if "dask" in types else None
        return ClusterInfo(
            name=row["name"],
            provider=row["provider"],
            state=row["state"],
            reason=row["reason"],
            config=cfg,
            target_workers=loads(row["target_workers"], {}),
            scheduler_address=row["head_address"],
            dashboard_link=(dask_prefix + quote(row["name"], safe="") + "/status"
                            if dask_prefix and row["dashboard_link"]
                            else spark_ui if "dask" not in types and spark_ui
                            else row["dashboard_link"]),
            connect_info=connect,
            nodes=nodes,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            last_operation=last,
            placement=self.placement.summary(row["name"]),
            spark_ui_link=spark_ui if "spark" in types else None,
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
        return info.provider, self.usable_connect_info(info.config, name,
                                                       info.connect_info)

    def usable_connect_info(self, cfg: dict[str, Any], name: str,
                            recorded: dict[str, Any]) -> ConnectInfo:
        """A recorded connect info as a client in this process uses it: the cluster's TLS
        credentials attached, and a tunnel another process had forwarded (the slurm
        provider's SSH tunnel to a scheduler job) opened here."""
        from ..runtime.tls import attach

        info = attach(ConnectInfo.from_dict(recorded), self.store.state_dir, name)
        if (info.extra or {}).get("tunnel"):
            info = self.provider_for(cfg).client_connect_info(info)
        return info

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
        cfgmod.provider_class(cfg["provider"]["type"], self.settings).check_packages(cfg)
        for rt in runtimes.runtimes_of(cfg):  # e.g. Spark without Java: one line, early
            rt.validate(cfg)
        name = cfg["cluster_name"]
        chash = cfgmod.config_hash(cfg)
        row = self.store.query_one("SELECT * FROM clusters WHERE name = ?", (name,))
        existing = row is not None and row["state"] != "stopped"
        if existing and row["owner"] is not None and row["owner"] != self.user:
            # another owner's cluster: not theirs to repair, nor to learn the config of
            raise ConflictError(f"cluster name '{name}' is in use; choose another name",
                                field="name", value=name)
        if existing and row["config_hash"] != chash:
            diff = "; ".join(cfgmod.config_diff(loads(row["config"], {}), cfg, limit=3))
            raise ConflictError(
                f"a {row['provider']} cluster '{name}' exists with another config: pass "
                f"another name (--name / name=) for a new cluster, `scale` it to change its "
                f"size, or `down` it first (differences: {diff})",
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
        # `up` of a running cluster repairs it at its current size (what `scale` set),
        # unless the caller named a size: `up --workers 2` after `scale 1` ends with 2
        target = (
            loads(row["target_workers"], {}) if existing and workers is None
            else {t: cfg["available_node_types"][t]["min_workers"]
                  for t in cfgmod.worker_types(cfg)}
        )
        await asyncio.to_thread(prov.check_node_types, cfg)  # a flavor not on sale: one line
        warnings = await asyncio.to_thread(self._check_capacity, prov, cfg, target)
        reservation = await asyncio.to_thread(self._reserve, prov, cfg, target)

        if row is not None and row["state"] == "stopped" and row["owner"] != self.user:
            # the name passes to another owner: the old cluster's history is not theirs
            await asyncio.to_thread(self._archive_history, name, row, prov,
                                    reservation.id if reservation else None)
        now = time.time()
        with self.store.transaction() as conn:
            # checked again under the write lock: another owner may have taken the name
            # since it was read (two users racing for a freed name)
            now_row = conn.execute("SELECT owner, state FROM clusters WHERE name = ?",
                                   (name,)).fetchone()
            taken = now_row is not None and now_row["state"] != "stopped" and \
                now_row["owner"] is not None and now_row["owner"] != self.user
            if not taken:
                conn.execute(
                    "INSERT INTO clusters (name, provider, config, config_hash, state,"
                    " target_workers, owner, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, 'starting', ?, ?, ?, ?)"
                    " ON CONFLICT(name) DO UPDATE SET provider = excluded.provider,"
                    " config = excluded.config, config_hash = excluded.config_hash,"
                    " state = 'starting', reason = NULL,"
                    " target_workers = excluded.target_workers,"
                    " updated_at = excluded.updated_at,"
                    " owner = CASE WHEN clusters.state = 'stopped' THEN excluded.owner"
                    " ELSE clusters.owner END,"
                    " created_at = CASE WHEN clusters.state = 'stopped'"
                    " THEN excluded.created_at ELSE clusters.created_at END",
                    (name, cfg["provider"]["type"], dumps(cfg), chash, dumps(target),
                     self.user, now, now),
                )
        if taken:
            if reservation is not None:
                self.placement.finish(reservation.id)
            raise ConflictError(f"cluster name '{name}' is in use; choose another name",
                                field="name", value=name)
        rid = reservation.id if reservation else None
        try:
            op = self.ops.start("cluster.up", _target(name),
                                {"config_hash": chash, "workers": target, "reservation": rid,
                                 **({"warnings": warnings} if warnings else {})},
                                user=self.user)
        except ConflictError:
            self.placement.finish(rid)
            attach = self._attach_to_active(name, "cluster.up", chash)
            if attach is not None:
                return attach
            raise
        self._placement_event(op.id, reservation)
        self._warning_events(op.id, warnings)
        return self._launch(op, self._up(OperationContext(self.ops, op.id), prov, cfg, rid))

    def _archive_history(self, name: str, row: Any, prov: NodeProvider,
                         keep_reservation: str | None) -> str | None:
        """A stopped cluster's name is taken by another owner: what the old cluster left
        must not become the new owner's.  Its finished operations (and so their events)
        and placement records move to a target of their own, ``cluster:NAME@ARCHIVE``
        (the old owner still lists them among their operations); its node records and
        node logs are removed (they are the provider's, under the cluster's name, and
        would be listed by the new cluster's ``logs``)."""
        archive = f"{name}@{uuid.uuid4().hex[:12]}"
        with self.store.transaction() as conn:
            now = conn.execute("SELECT owner, state FROM clusters WHERE name = ?",
                               (name,)).fetchone()
            if now is None or now["state"] != "stopped" or now["owner"] == self.user:
                return None  # taken meanwhile (start_up refuses it under the lock)
            conn.execute(
                "UPDATE operations SET target = ? WHERE target = ? AND state NOT IN"
                " ('pending', 'running')", (_target(archive), _target(name)))
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
        self.placement.archive_cluster(name, archive, keep=keep_reservation)
        forgotten = prov.forget_history()
        log.info("cluster name '%s' passed from %s to %s: history archived as %s, "
                 "%d ended node(s) forgotten", name, row["owner"], self.user, archive,
                 forgotten)
        return archive

    async def start_down(self, name: str, reason: str | None = None) -> OperationHandle:
        row = self._row(name)
        if row["state"] == "stopped":
            op = self.ops.start("cluster.down", _target(name), {"reason": reason},
                                user=self.user, exclusive=False)
            self.ops.finish(op.id, "succeeded", result={"cluster": name, "already": True})
            return self.runner.handle(op.id)
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
        warnings = await asyncio.to_thread(self._check_capacity, prov, cfg, new_target)
        reservation = await asyncio.to_thread(self._reserve, prov, cfg, new_target)
        rid = reservation.id if reservation else None
        try:
            op = self.ops.start("cluster.scale", _target(name),
                                {"node_type": node_type, "workers": workers,
                                 "reservation": rid,
                                 **({"warnings": warnings} if warnings else {})},
                                user=self.user)
        except ConflictError:
            self.placement.finish(rid)
            raise
        self._placement_event(op.id, reservation)
        self._warning_events(op.id, warnings)
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
                return self.runner.handle(op.id)
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
        return self.runner.launch(op, coro)

    def _on_cancelled(self, op: OperationInfo) -> None:
        if op.kind != "cluster.down":
            self._set_state(op.resource.name, "failed", f"{op.kind} was cancelled; run `up` "
                            "to finish it or `down` to remove what was started")

    def _on_failed(self, op: OperationInfo, err: CloudTikError) -> None:
        if op.kind == "cluster.down":
            self._set_state(op.resource.name, "failed", f"down failed: {err.message}")
        else:
            self._set_state(op.resource.name, "failed", err.message)

    async def wait(self, op_id: str, poll: float = 0.1) -> Any:
        """The result of an operation; raises its error if it failed or was cancelled."""
        return await self.runner.wait(op_id, poll)

    async def cancel(self, op_id: str) -> OperationInfo:
        return await self.runner.cancel(op_id)

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
                        target: dict[str, int]) -> list[str]:
        """Refuse before starting anything when the provider cannot hold the new nodes;
        the warnings to carry when it can, oversubscribed (``prov.oversubscription``)."""
        cap: Capacity = prov.capacity()
        if cap.cpus is None and cap.memory is None and cap.gpus is None and (
                cap.max_nodes is None and cap.node_memory is None):
            return []
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
        too_big = [t for t, missing in missing_by_type.items()
                   if missing and cap.node_memory is not None
                   and (types[t]["resources"].get("memory") or 0) > cap.node_memory]
        problems += [f"a {t} node asks {format_bytes(types[t]['resources'].get('memory'))} of "
                     f"memory, more than one node can have ({format_bytes(cap.node_memory)})"
                     for t in too_big]
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
                # a node too big for the machine is its memory's fault, not the count's
                field=(f"available_node_types.{too_big[0]}.resources.memory"
                       if too_big and len(problems) == len(too_big) else "workers"),
            )
        warning = prov.oversubscription(need["CPU"], int(need["memory"]))
        if not warning or self._warned_of_oversubscription(name):
            return []
        adds = [p for p in parts if "(0 CPU, 0 B)" not in p]
        return [f"oversubscribed: with {', '.join(adds)} more, {warning}"]

    def _warned_of_oversubscription(self, name: str) -> bool:
        """Once per cluster: an up or scale of it since it last went down already said so
        (every later up of other clusters and scale would repeat it; the store remembers
        across kernels and the server)."""
        target = _target(name)
        row = self.store.query_one(
            "SELECT 1 FROM operations WHERE target = ? AND kind IN ('cluster.up', "
            "'cluster.scale') AND params LIKE '%\"oversubscribed: %' AND created_at > "
            "COALESCE((SELECT MAX(created_at) FROM operations WHERE target = ? AND "
            "kind = 'cluster.down'), 0) LIMIT 1", (target, target))
        return row is not None

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

    def _warning_events(self, op_id: str, warnings: list[str]) -> None:
        """Allowed but worth saying loudly (oversubscription): an event each; the texts are
        also the operation's ``warnings`` (its params), which every face shows."""
        for text in warnings:
            self.ops.emit(op_id, "warning", text, 0.01, level="warning")

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
                        scheduler_address: str | None = None,
                        head_info: ConnectInfo | None = None,
                        head_node: str | None = None) -> dict[str, Any]:
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
        for key in ("pip", "sync_env"):  # packages the nodes install (providers that can)
            if (cfg.get("runtime") or {}).get(key):
                runtime[key] = cfg["runtime"][key]
        if runtimes.types_of(cfg) != list(runtimes.DEFAULT_RUNTIMES):
            runtime["types"] = runtimes.types_of(cfg)
        if head_node:  # the provider's workers find the scheduler from the head's id
            runtime["head_node_id"] = head_node
        elif scheduler_address:
            runtime["scheduler_address"] = scheduler_address
        for rt in runtimes.runtimes_of(cfg):
            if rt.name != "dask":
                runtime[rt.name] = rt.node_config(cfg, role, head_info)
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
            info, head, head_replaced, early = await self._ensure_head(ctx, prov, cfg,
                                                                       placing)
            if early is not None:  # started with the head, before its scheduler was up
                await self._wait_workers(ctx, prov, cfg, info, early)
            else:
                target = loads(self._row(name)["target_workers"], {})
                await self._reconcile_workers(ctx, prov, cfg, info, target, head_replaced,
                                              placing, head_node=head)
            from ..storage.cluster import attach_to_workers

            if await attach_to_workers(self, cfg, info):
                ctx.progress("storage", "storages handed to the workers over TLS", 0.97)
        finally:  # claims no node was created for go back at once
            await asyncio.to_thread(self.placement.finish, placing["rid"])
        state = await self._observe(prov, cfg, info)
        ready_in = round(time.monotonic() - started, 3)
        self._set_state(name, "running")
        # the link the cluster's info shows (through the server that serves dashboards,
        # if any), not the head's own port a browser of a remote Lab cannot reach
        shown = info.dashboard_link
        if shown and self.dashboard_prefix and "dask" in (
                (cfg.get("runtime") or {}).get("types") or ["dask"]):
            shown = self.dashboard_prefix + quote(name, safe="") + "/status"
        ctx.progress("ready", f"cluster '{name}' is running: {state['workers']} workers, "
                     f"dashboard {shown or '-'}", 1.0, dashboard_link=shown,
                     seconds=ready_in)
        return {"cluster": name, "workers": state["workers"], "seconds": ready_in,
                "dashboard_link": info.dashboard_link}

    async def _ensure_head(
        self, ctx: OperationContext, prov: NodeProvider, cfg: dict[str, Any],
        placing: dict[str, str | None] | None = None,
    ) -> tuple[ConnectInfo, str, bool, dict[str, str] | None]:
        """The head, running and answering: its connect info, its node id, whether it is
        new, and the workers already started for a new head (node id -> type) when the
        provider's workers find the scheduler themselves; else None (the caller reconciles
        the workers)."""
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
        early: dict[str, str] | None = None
        replaced = keep is None
        if keep is None:
            ctx.progress("head", "starting the head node ("
                         + ", ".join(runtimes.types_of(cfg)) + ")", 0.08)
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
            if prov.workers_find_scheduler and runtimes.types_of(cfg) == ["dask"]:
                # the workers queue now and wait for the scheduler themselves (a batch
                # system schedules them meanwhile); the old head's workers all go
                target = loads(self._row(name)["target_workers"], {})
                early = await self._reconcile_workers(
                    ctx, prov, cfg, None, target, True, placing, head_node=keep, wait=False)
        else:
            ctx.progress("head", f"head node {keep} is running", 0.08)
        try:
            info = await prov.wait_head_ready(keep, ctx, self.settings.operation_timeout)
        except OperationCancelled:
            raise  # a `down` that follows finds the workers by their tags
        except Exception as e:
            if not early:
                raise
            # nothing waits in the queue for a scheduler that will not come
            await asyncio.to_thread(prov.terminate_nodes, sorted(early))
            await asyncio.to_thread(self.placement.release_nodes, name, sorted(early))
            for n in early:
                self._forget_node(name, n)
            gone = (f" — its {len(early)} worker node(s) started with it "
                    f"({', '.join(sorted(early))}) were stopped")
            if isinstance(e, CloudTikError):  # the same kind of error, saying so too
                raise type(e)(e.message + gone, field=e.field) from e
            raise NodeLaunchError(f"{type(e).__name__}: {e}{gone}") from e
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
        ctx.progress("head", f"scheduler is up at {info.scheduler_address}",
                     0.3 if early is None else 0.45, dashboard_link=info.dashboard_link)
        return info, keep, replaced, early

    async def _reconcile_workers(
        self,
        ctx: OperationContext,
        prov: NodeProvider,
        cfg: dict[str, Any],
        info: ConnectInfo | None,
        target: dict[str, int],
        head_replaced: bool = False,
        placing: dict[str, str | None] | None = None,
        head_node: str | None = None,
        wait: bool = True,
    ) -> dict[str, str]:
        """Close the gap between the worker nodes there are and ``target``; then wait for
        them to join (``wait``).  ``info`` may be None only with ``head_replaced`` (every
        worker goes) and a provider whose workers find the scheduler from ``head_node``."""
        name = cfg["cluster_name"]
        find = prov.workers_find_scheduler and head_node is not None
        placing = placing if placing is not None else {"rid": None}
        expected: dict[str, str] = {}  # node id -> type
        for wtype in cfgmod.worker_types(cfg):
            desired = int(target.get(wtype, 0))
            node_config = self._runtime_config(
                cfg, wtype, NODE_KIND_WORKER, None if find else info.scheduler_address,
                info, head_node=head_node if find else None)
            want_hash = _launch_hash(node_config)
            nodes = await asyncio.to_thread(
                prov.non_terminated_nodes,
                {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_WORKER, TAG_NODE_TYPE: wtype})
            alive, drop, joined_before = [], [], []
            for n in nodes:
                tags = await asyncio.to_thread(prov.node_tags, n)
                ok = await asyncio.to_thread(prov.is_running, n)
                if ok and tags.get(TAG_LAUNCH_CONFIG) == want_hash and not head_replaced:
                    alive.append(n)
                    if tags.get(TAG_NODE_STATUS) == STATUS_UP_TO_DATE:
                        joined_before.append(n)
                else:
                    drop.append(n)
            gone = await self._left_the_scheduler(cfg, info, prov, joined_before)
            alive = [n for n in alive if n not in gone]
            drop += gone
            extra = alive[desired:] if len(alive) > desired else []
            alive = alive[:desired]
            if extra:
                ctx.progress("workers", f"retiring {len(extra)} worker(s) of type '{wtype}'",
                             0.35)
                for rt in runtimes.runtimes_of(cfg):
                    try:
                        connected = await rt.connected_workers(info, prov, extra)
                        await rt.retire_workers(
                            info, [connected[n] for n in extra if n in connected])
                    except (runtimes.RuntimeUnreachable, LookupError):
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
        if wait:
            await self._wait_workers(ctx, prov, cfg, info, expected)
        return expected

    @staticmethod
    async def _left_the_scheduler(cfg: dict[str, Any], info: ConnectInfo,
                                  prov: NodeProvider, joined_before: list[str]) -> list[str]:
        """Of the nodes that had joined the scheduler (tagged up-to-date when they did),
        those that no longer have: dying or broken.

        A worker whose runtime died a moment ago may still have its node process (the
        provider says it runs); waiting for it to join again would end in "stopped before
        joining" instead of the replacement `up` is for. A node still starting (never
        joined) is left to join; when the head cannot be asked, nothing is dropped."""
        if not joined_before:
            return []
        try:
            connected = await runtimes.connected_workers(cfg, info, prov, joined_before)
        except (runtimes.RuntimeUnreachable, LookupError):
            return []
        return [n for n in joined_before if n not in connected]

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
                connected = await runtimes.connected_workers(cfg, info, prov, list(expected))
            except runtimes.RuntimeUnreachable:
                connected = {}
            now_seen = {n for n in expected if n in connected}
            joined = sorted(now_seen - seen)
            for n in joined:
                self._record_node(name, n, expected[n], NODE_KIND_WORKER, "running",
                                  cfg["available_node_types"][expected[n]]["resources"], prov)
            if joined:  # one batch: a cloud tags many servers per call
                await asyncio.to_thread(prov.set_nodes_tags, joined,
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
        heads = set(await asyncio.to_thread(
            prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_HEAD}))
        try:
            nodes = await asyncio.to_thread(prov.non_terminated_nodes, {TAG_CLUSTER_NAME: name})
        except ProviderError as e:
            # a head that cannot say which workers it has is still stopped; whatever is
            # left afterwards is listed again below and reported if it stays
            ctx.progress("terminate", f"the workers could not be listed ({e.message}); "
                         "stopping the head", 0.1)
            nodes = sorted(heads)
        ctx.progress("terminate", f"stopping {len(nodes)} node(s)", 0.1, nodes=len(nodes))
        # workers first: with their scheduler still up they unregister and exit at once
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
        info, head = None, None
        for h in heads:
            info = await asyncio.to_thread(prov.connect_info, h)
            if info is not None:
                head = h
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
            await self._reconcile_workers(ctx, prov, cfg, info, target, placing=placing,
                                          head_node=head)
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
        view: dict[str, Any] = {}
        if info is not None:
            try:
                connected = await runtimes.connected_workers(cfg, info, prov, node_ids)
            except (runtimes.RuntimeUnreachable, LookupError):
                connected = {}
            view = await runtimes.observe(cfg, info)
        workers = 0
        # every provider call first, then the nodes replaced in one transaction: a reader
        # (the dashboard route, another process's list) never sees the cluster without
        # its head between the delete and the inserts
        rows = []
        for n in node_ids:
            tags = await asyncio.to_thread(prov.node_tags, n)
            kind = tags.get(TAG_NODE_KIND, NODE_KIND_WORKER)
            ntype = tags.get(TAG_NODE_TYPE, "")
            running = await asyncio.to_thread(prov.is_running, n)
            if kind == NODE_KIND_HEAD:
                status = "running" if running and info else ("starting" if running else "broken")
                extra = {"connect_info": info.to_dict()} if info else {}
                if view:
                    extra["runtime"] = view  # the runtime's own view (Spark's master)
            else:
                status = ("running" if n in connected else "starting") if running else "broken"
                workers += status == "running"
                extra = {"address": connected.get(n)} if n in connected else {}
            res = (cfg["available_node_types"].get(ntype) or {}).get("resources", {})
            rows.append(await asyncio.to_thread(self._node_row, name, n, ntype, kind,
                                                status, res, prov, extra))
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            conn.executemany(_UPSERT_NODE, rows)
        return {"workers": workers, "nodes": len(node_ids)}

    # records ------------------------------------------------------------------------------
    def _record_node(self, cluster: str, node_id: str, node_type: str, kind: str, status: str,
                     resources: dict[str, Any], prov: NodeProvider,
                     extra: dict[str, Any] | None = None) -> None:
        row = self._node_row(cluster, node_id, node_type, kind, status, resources, prov, extra)
        with self.store.transaction() as conn:
            conn.execute(_UPSERT_NODE, row)

    def _node_row(self, cluster: str, node_id: str, node_type: str, kind: str, status: str,
                  resources: dict[str, Any], prov: NodeProvider,
                  extra: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """A node's row for ``_UPSERT_NODE`` (asks the provider: not in a transaction)."""
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
        return (cluster, node_id, node_type, kind, status, internal_ip, external_ip,
                dumps(resources), dumps(info), now, now)

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


_UPSERT_NODE = (
    "INSERT INTO nodes (cluster, node_id, node_type, kind, status, internal_ip,"
    " external_ip, resources, info, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(cluster, node_id) DO UPDATE SET status = excluded.status,"
    " internal_ip = excluded.internal_ip, external_ip = excluded.external_ip,"
    " resources = excluded.resources, info = excluded.info,"
    " updated_at = excluded.updated_at")


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
