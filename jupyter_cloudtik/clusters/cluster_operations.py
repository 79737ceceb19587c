"""Starting ``up``, ``down`` and ``scale`` as recorded operations: the checks that refuse
early, the desired state written first, one operation per cluster at a time (a repeated
``up`` attaches to the running one), and what a failed or cancelled one leaves
recorded.  The work itself is ``cluster_reconcile`` / ``cluster_teardown``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from ..core import config as cfgmod
from ..core.errors import CapacityError, CloudTikError, ConfigError, ConflictError
from ..core.models import ClusterInfo
from ..core.operations import OperationContext, OperationInfo
from ..core.runner import OperationHandle
from ..core.store import dumps, loads
from ..providers.base import NODE_KIND_HEAD
from ..runtime import base as runtimes
from .cluster_node_config import _contributions
from .cluster_records import _target


class ClusterOperations:
    """The cluster operations' entry points (a part of ``ClusterManager``)."""

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
