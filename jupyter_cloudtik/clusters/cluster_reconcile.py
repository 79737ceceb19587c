"""The work of ``up`` and ``scale``, a reconciler: compare the desired state with the
nodes the provider reports (found by tags), start a missing or outdated head, replace
dead or outdated workers, add missing ones, and wait until they have joined the
scheduler.  Run again after a crash, a kill or a cancel, it finishes the job."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

from ..core import config as cfgmod
from ..core.errors import (
    CloudTikError,
    ConflictError,
    NodeLaunchError,
    OperationCancelled,
    OperationTimeout,
)
from ..core.features import cluster_ready_hooks
from ..core.operations import OperationContext
from ..core.store import loads
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
    ConnectInfo,
    NodeProvider,
)
from ..runtime import base as runtimes
from .cluster_node_config import _launch_hash

WORKER_WAIT_POLL = 0.01


class ClusterReconciler:
    """Closing the gap to the desired state (a part of ``ClusterManager``)."""

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
            for ready in cluster_ready_hooks():  # storage's hand-off, through the registry
                said = await ready(self, cfg, info)
                if said:
                    ctx.progress(said[0], said[1], 0.97)
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
                for rt in ([] if prov.picks_workers_to_retire
                           else runtimes.runtimes_of(cfg)):
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
                ended = drop + extra
                await asyncio.to_thread(prov.terminate_nodes, ended)
                if extra and prov.picks_workers_to_retire:
                    # its scheduler chose which went: what still runs is what is kept
                    left = set(await asyncio.to_thread(
                        prov.non_terminated_nodes,
                        {TAG_CLUSTER_NAME: name, TAG_NODE_KIND: NODE_KIND_WORKER,
                         TAG_NODE_TYPE: wtype}))
                    kept = alive + extra
                    alive = [n for n in kept if n in left][:desired]
                    ended = drop + [n for n in kept if n not in alive]
                await asyncio.to_thread(self.placement.release_nodes, name, ended)
                for n in ended:
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
