"""Adaptive scaling that runs where clusters live, not in the kernel.

``adapt(name, minimum, maximum)`` records the bounds in the store; an ``AdaptiveRunner``
in the process that owns the clusters (the Jupyter server, the hub sidekick) follows each
adaptive cluster: every ``interval`` seconds it asks the scheduler for its own adaptive
target (``Scheduler.adaptive_target()``, served by Dask at ``/api/v1/adaptive_target``),
keeps it within the bounds, and scales through the manager's normal ``scale`` path —
placement for new workers, and for fewer workers ``retire_workers`` first, so that no
task or result held in memory is lost before a node is stopped.  Like Dask's ``Adaptive``
it scales up at once and down only after ``wait_count`` consecutive lower targets.

The kernel that asked for it may go away: the bounds and the loop live with the server.
With no server at all (``jupyter cloudtik adapt`` from a shell), the reaper daemon of the
state folder runs the same loop.  One process drives a store's adaptive clusters at a
time: the ``adaptive_lease`` row (``Lease``) names it.  A server takes the lease from the
reaper as it starts and hands it back as it stops; the reaper takes it only when it is
free or expired (its holder died without handing it back).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from ..core import config as cfgmod
from ..core.errors import CloudTikError, ConfigError, ConflictError
from ..core.store import loads

log = logging.getLogger("jupyter_cloudtik.adaptive")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_adaptive (
    cluster    TEXT PRIMARY KEY,
    minimum    INTEGER NOT NULL,
    maximum    INTEGER NOT NULL,
    interval   REAL NOT NULL,
    wait_count INTEGER NOT NULL,
    updated_at REAL NOT NULL
)
"""
LEASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS adaptive_lease (
    name    TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    kind    TEXT NOT NULL,
    host    TEXT NOT NULL,
    pid     INTEGER NOT NULL,
    expires REAL NOT NULL
)
"""
LEASE_TTL = 10.0  # seconds a holder that stops renewing (it died) keeps the lease
DEFAULT_INTERVAL = 1.0  # distributed.adaptive.interval
DEFAULT_WAIT_COUNT = 3  # distributed.adaptive.wait-count


@dataclass
class AdaptiveSpec:
    cluster: str
    minimum: int
    maximum: int
    interval: float = DEFAULT_INTERVAL
    wait_count: int = DEFAULT_WAIT_COUNT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ensure_table(store: Any) -> None:
    with store.transaction() as conn:
        conn.execute(SCHEMA)
        conn.execute(LEASE_SCHEMA)


def _alive_here(host: str, pid: int) -> bool:
    """False only when the holder surely died: same host and no such process."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    """Who drives the adaptive loops of one store: one row, renewed while held.

    ``kind`` is ``"server"`` (a Jupyter server or the hub sidekick) or ``"reaper"``.  A
    server may take the lease from a reaper at any time (a server that starts takes
    over); a reaper takes it only when it is free, expired, or its holder's process is
    gone.  Two servers on one store take turns the same way (free or expired)."""

    NAME = "adaptive"

    def __init__(self, store: Any, kind: str, ttl: float = LEASE_TTL) -> None:
        self.store = store
        self.kind = kind
        self.ttl = ttl
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.holder = f"{kind}:{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"

    def acquire(self, now: float | None = None) -> bool:
        """Take or renew the lease; True if this process holds it now."""
        now = time.time() if now is None else now
        row = self.store.query_one("SELECT * FROM adaptive_lease WHERE name = ?",
                                   (self.NAME,))
        if row is not None and row["holder"] == self.holder and \
                row["expires"] - now > self.ttl / 2:
            return True  # held, and fresh enough: no write
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM adaptive_lease WHERE name = ?",
                               (self.NAME,)).fetchone()
            if row is not None and row["holder"] != self.holder and \
                    row["expires"] > now and _alive_here(row["host"], row["pid"]) and \
                    not (self.kind == "server" and row["kind"] == "reaper"):
                return False
            conn.execute("INSERT OR REPLACE INTO adaptive_lease VALUES (?, ?, ?, ?, ?, ?)",
                         (self.NAME, self.holder, self.kind, self.host, self.pid,
                          now + self.ttl))
        return True

    def held(self) -> bool:
        row = self.store.query_one("SELECT holder FROM adaptive_lease WHERE name = ?",
                                   (self.NAME,))
        return row is not None and row["holder"] == self.holder

    def release(self) -> None:
        """Hand the lease back (the reaper, or another server, takes it next)."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM adaptive_lease WHERE name = ? AND holder = ?",
                         (self.NAME, self.holder))


def lease_holder(store: Any) -> dict[str, Any] | None:
    """The live holder of a store's adaptive lease ({holder, kind, host, pid, expires})."""
    _ensure_table(store)
    row = store.query_one("SELECT * FROM adaptive_lease WHERE name = ?", (Lease.NAME,))
    if row is None or row["expires"] < time.time() or not _alive_here(row["host"],
                                                                        row["pid"]):
        return None
    return dict(row)


def recorded(store: Any) -> list[str]:
    """Clusters with recorded adaptive bounds that are not stopped (someone must drive
    them: a server or the reaper)."""
    _ensure_table(store)
    return [r[0] for r in store.query(
        "SELECT a.cluster FROM cluster_adaptive a JOIN clusters c ON c.name = a.cluster"
        " WHERE c.state != 'stopped' ORDER BY a.cluster")]


def _whole(field: str, value: Any, low: int = 0) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{field}: {value!r} is not a whole number ({low} or more)",
                          field=field, value=value)
    return value


def validate(manager: Any, name: str, minimum: Any, maximum: Any,
             interval: Any = None, wait_count: Any = None) -> AdaptiveSpec:
    """Bounds checked against the cluster, its config and this server's limits; the
    message names the value and the limit.  Nothing is changed here."""
    minimum = _whole("minimum", minimum)
    maximum = _whole("maximum", maximum)
    if minimum > maximum:
        raise ConfigError(f"minimum: {minimum} is more than maximum ({maximum})",
                          field="minimum", value=minimum)
    if interval is None:
        interval = DEFAULT_INTERVAL
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
            0.1 <= interval <= 3600):
        raise ConfigError(f"interval: {interval!r} is not a number of seconds in 0.1..3600",
                          field="interval", value=interval)
    wait_count = _whole("wait_count", DEFAULT_WAIT_COUNT if wait_count is None
                        else wait_count, 1)
    info = manager.get(name)  # 404 (another user's cluster too)
    if info.state in ("stopped", "stopping", "failed"):
        raise ConflictError(f"cluster '{name}' is {info.state}; adaptive scaling needs a "
                            "running cluster (start it with `up`)", field="name", value=name)
    cfg = info.config
    wtypes = cfgmod.worker_types(cfg)
    if len(wtypes) != 1:
        raise ConfigError(f"name: cluster '{name}' has {len(wtypes)} worker types "
                          f"({', '.join(wtypes) or 'none'}); adaptive scaling needs exactly "
                          "one", field="name", value=name)
    limits = [(int(cfg["available_node_types"][wtypes[0]]["max_workers"]),
               f"max_workers of node type '{wtypes[0]}'"),
              (int(cfg["max_workers"]), "the cluster's max_workers")]
    server_max = getattr(manager.settings, "max_workers_per_cluster", 0) or 0
    if server_max:
        limits.append((int(server_max), "c.CloudTik.max_workers_per_cluster"))
    for limit, what in limits:
        if maximum > limit:
            raise ConfigError(f"maximum: {maximum} is more than {what} ({limit})",
                              field="maximum", value=maximum)
    check = getattr(manager, "_check_scale_limits", None)  # the hub's templates and quotas
    if check is not None:
        check(name, maximum)
    return AdaptiveSpec(name, minimum, maximum, float(interval), wait_count)


def adapt(manager: Any, name: str, minimum: Any, maximum: Any, interval: Any = None,
          wait_count: Any = None) -> AdaptiveSpec:
    """Turn adaptive scaling on (or change its bounds) for cluster ``name``."""
    spec = validate(manager, name, minimum, maximum, interval, wait_count)
    _ensure_table(manager.store)
    with manager.store.transaction() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO cluster_adaptive (cluster, minimum, maximum, interval,"
            " wait_count, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, spec.minimum, spec.maximum, spec.interval, spec.wait_count, time.time()))
    return spec


def adapt_off(manager: Any, name: str) -> None:
    manager.get(name)  # 404 for someone else's cluster
    _ensure_table(manager.store)
    with manager.store.transaction() as conn:
        conn.execute("DELETE FROM cluster_adaptive WHERE cluster = ?", (name,))


def adaptive_of(manager: Any, name: str) -> AdaptiveSpec | None:
    manager.get(name)
    _ensure_table(manager.store)
    row = manager.store.query_one("SELECT * FROM cluster_adaptive WHERE cluster = ?", (name,))
    if row is None:
        return None
    return AdaptiveSpec(row["cluster"], row["minimum"], row["maximum"], row["interval"],
                        row["wait_count"])


def adaptive_target(http_address: str, timeout: float = 5.0) -> int:
    """The number of workers the scheduler itself wants (``Scheduler.adaptive_target``)."""
    with urllib.request.urlopen(http_address.rstrip("/") + "/api/v1/adaptive_target",
                                timeout=timeout) as resp:
        return int(json.loads(resp.read())["workers"])


class AdaptiveRunner:
    """Follows every adaptive cluster of one store; one per owning process.

    With a ``lease`` it drives the clusters only while it holds the lease, so a server and
    the reaper daemon never both scale one cluster."""

    def __init__(self, manager: Any, tick: float = 0.25, lease: Lease | None = None) -> None:
        self.manager = manager
        self.tick = tick
        self.lease = lease
        self.holding = lease is None
        self._low: dict[str, int] = {}
        self._due: dict[str, float] = {}
        self._task: asyncio.Task | None = None
        self._from_config: set[tuple[str, float]] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_event_loop().create_task(self._loop())

    def stop_now(self) -> None:
        """Stop the loop and hand the lease back (synchronous: for shutdown hooks)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.lease is not None and self.holding:
            try:
                self.lease.release()
            except Exception:
                log.exception("adaptive lease not released (it expires by itself)")
            self.holding = False

    async def stop(self) -> None:
        self.stop_now()

    def _take_lease(self) -> bool:
        if self.lease is None:
            return True
        holding = self.lease.acquire()
        if holding != self.holding:
            log.info("adaptive scaling of %s %s (%s)", self.manager.store.state_dir,
                     "taken over" if holding else "handed over", self.lease.holder)
            self._low.clear()
            self._due.clear()
        self.holding = holding
        return holding

    async def run(self) -> None:
        """The loop itself (the reaper daemon awaits it beside its idle checks)."""
        await self._loop()

    async def _loop(self) -> None:
        _ensure_table(self.manager.store)
        while True:
            try:
                await self.step_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end adaptive scaling
                log.exception("adaptive scaling round failed")
            await asyncio.sleep(self.tick)

    def apply_configs(self) -> None:
        """A running cluster whose config has ``adaptive:`` adapts from then on (once per
        cluster start in this process, so ``--off`` holds until the server restarts)."""
        for row in self.manager.store.query(
                "SELECT name, created_at, config FROM clusters WHERE state = 'running'"
                " AND config LIKE '%\"adaptive\"%'"):
            key = (row["name"], row["created_at"])
            if key in self._from_config:
                continue
            self._from_config.add(key)
            wanted = loads(row["config"], {}).get("adaptive")
            if not wanted or self.manager.store.query_one(
                    "SELECT 1 FROM cluster_adaptive WHERE cluster = ?", (row["name"],)):
                continue
            try:
                adapt(self.manager, row["name"], wanted.get("minimum"), wanted.get("maximum"),
                      wanted.get("interval"), wanted.get("wait_count"))
            except CloudTikError as e:
                log.warning("cluster %s: adaptive in its config not applied: %s",
                            row["name"], e.message)

    async def step_all(self) -> None:
        if not await asyncio.to_thread(self._take_lease):
            return
        self.apply_configs()
        now = time.monotonic()
        rows = self.manager.store.query("SELECT * FROM cluster_adaptive")
        for row in rows:
            name = row["cluster"]
            if self._due.get(name, 0) > now:
                continue
            self._due[name] = now + row["interval"]
            spec = AdaptiveSpec(name, row["minimum"], row["maximum"], row["interval"],
                                row["wait_count"])
            try:
                await self.step(spec)
            except CloudTikError as e:
                log.info("adaptive %s: %s", name, e.message)
            except OSError as e:
                log.info("adaptive %s: scheduler did not answer (%s)", name, e)

    async def step(self, spec: AdaptiveSpec) -> int | None:
        """One decision for one cluster: the new worker count, or None (unchanged)."""
        m = self.manager
        row = m.store.query_one("SELECT state, target_workers FROM clusters WHERE name = ?",
                                (spec.cluster,))
        if row is None or row["state"] == "stopped":
            with m.store.transaction() as conn:  # the cluster is gone: so is adapting it
                conn.execute("DELETE FROM cluster_adaptive WHERE cluster = ?",
                             (spec.cluster,))
            return None
        if row["state"] not in ("running", "degraded"):
            return None  # starting, scaling, stopping: decide when it has settled
        if m.ops.active_for(f"cluster:{spec.cluster}"):
            return None
        current = sum(loads(row["target_workers"], {}).values())
        _, info = m.connect_info(spec.cluster)
        if not info.http_address:
            return None
        wanted = await asyncio.to_thread(adaptive_target, info.http_address)
        target = max(spec.minimum, min(spec.maximum, wanted))
        if target > current:
            self._low[spec.cluster] = 0
        elif target < current:
            self._low[spec.cluster] = self._low.get(spec.cluster, 0) + 1
            if self._low[spec.cluster] < spec.wait_count:
                return None
            self._low[spec.cluster] = 0
        else:
            self._low[spec.cluster] = 0
            return None
        if self.lease is not None and not self.lease.held():
            return None  # a server took over while we looked
        await m.start_scale(spec.cluster, target)
        return target
