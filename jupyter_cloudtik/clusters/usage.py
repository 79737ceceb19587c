"""Size, price and load of each cluster over time, and what it has cost so far.

A small table, ``cluster_usage``: one row per change of a cluster's running workers or
price per hour, one at least every ``PERIOD`` seconds while it runs, and one each
``METRICS_PERIOD`` seconds with the workers' CPU and memory use as the cluster's Dask
scheduler reports them (its HTTP server's ``/json/identity.json``: each worker's
``metrics.cpu``, ``metrics.memory``, ``nthreads`` and ``memory_limit``).  Cost so far is
the price integrated over time between samples (each sample's price holds until the
next).  Sampled by the process that owns the clusters (the server), next to adaptive
scaling.  A cluster whose scheduler has no HTTP server this process can reach (a
mutual-TLS head, a Spark cluster) has samples without load figures (``null``)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from typing import Any

from ..core.errors import CloudTikError

log = logging.getLogger("jupyter_cloudtik.usage")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_usage (
    cluster       TEXT NOT NULL,
    at            REAL NOT NULL,
    workers       INTEGER NOT NULL,
    cost_per_hour REAL,
    currency      TEXT,
    cpu           REAL,
    memory        INTEGER,
    memory_limit  INTEGER
)
"""
#: columns added after the first release of the table (added to an older table in place)
LOAD_COLUMNS = (("cpu", "REAL"), ("memory", "INTEGER"), ("memory_limit", "INTEGER"))
INDEX = "CREATE INDEX IF NOT EXISTS cluster_usage_by_cluster ON cluster_usage (cluster, at)"
PERIOD = 60.0
#: how often the workers' CPU and memory use is asked for (and written) per cluster
METRICS_PERIOD = 10.0
METRICS_TIMEOUT = 3.0
MAX_POINTS = 500
#: (store, cluster) -> when its load was last asked for (in this process)
_asked: dict[tuple[int, str], float] = {}


def _ensure(store: Any) -> None:
    with store.transaction() as conn:
        conn.execute(SCHEMA)
        conn.execute(INDEX)
        have = {r[1] for r in conn.execute("PRAGMA table_info(cluster_usage)")}
        for column, kind in LOAD_COLUMNS:
            if column not in have:
                conn.execute(f"ALTER TABLE cluster_usage ADD COLUMN {column} {kind}")


def load_from_identity(identity: dict[str, Any]) -> dict[str, Any] | None:
    """{cpu, memory, memory_limit} of a Dask scheduler's ``identity()``: ``cpu`` is the
    workers' CPU use in percent of their threads (0..100; a worker's ``metrics.cpu`` is
    its process's percent of one core), ``memory`` the bytes their processes hold,
    ``memory_limit`` the sum of their limits (0 when none is set).  None without workers
    or metrics (nothing to plot, not a zero), and None for an answer of another shape: the
    head is the cluster owner's machine, and what it answers must not stop the samples of
    the other clusters."""
    threads = used = limit = 0
    cpu = 0.0
    seen = False
    try:
        for w in (identity.get("workers") or {}).values():
            metrics = w.get("metrics") or {}
            if "cpu" not in metrics or "memory" not in metrics:
                continue
            seen = True
            threads += max(int(w.get("nthreads") or 1), 1)
            cpu += float(metrics["cpu"] or 0.0)
            used += int(metrics["memory"] or 0)
            limit += int(w.get("memory_limit") or 0)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None
    if not seen or cpu != cpu:  # NaN: no figure
        return None
    return {
        "cpu": round(min(max(cpu / threads, 0.0), 100.0), 1),
        "memory": used,
        "memory_limit": limit,
    }


def worker_load(manager: Any, name: str, timeout: float = METRICS_TIMEOUT) -> dict[str, Any] | None:
    """The workers' load now (``load_from_identity``), or None when the scheduler has no
    HTTP server here or does not answer in ``timeout`` seconds (logged, never raised: a
    chart's gap, not a failed sample)."""
    try:
        _, info = manager.connect_info(name)
    except CloudTikError:
        return None
    if not info.http_address:
        return None
    url = info.http_address.rstrip("/") + "/json/identity.json"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return load_from_identity(json.loads(resp.read()))
    except (OSError, ValueError) as e:
        log.debug("usage %s: no worker metrics from %s (%s)", name, url, e)
        return None


def sample(manager: Any, now: float | None = None, load: Any = None) -> int:
    """Record every running cluster whose size or price changed (or PERIOD passed), and
    its workers' load every METRICS_PERIOD.  ``load(manager, name)`` gives the load
    (default ``worker_load``, asked only when a load sample is due)."""
    _ensure(manager.store)
    now = time.time() if now is None else now
    load = worker_load if load is None else load
    written = 0
    for info in manager.list():
        last = manager.store.query_one(
            "SELECT at, workers, cost_per_hour FROM cluster_usage WHERE cluster = ?"
            " AND at >= ? ORDER BY at DESC LIMIT 1",
            (info.name, info.created_at),
        )
        last_load = manager.store.query_one(
            "SELECT at FROM cluster_usage WHERE cluster = ? AND at >= ? AND cpu IS NOT NULL"
            " ORDER BY at DESC LIMIT 1",
            (info.name, info.created_at),
        )
        workers, price = info.running_workers, info.cost_per_hour
        figures = None
        asked = (id(manager.store), info.name)
        if (
            info.state in ("running", "degraded", "scaling")
            and workers > 0
            and (last_load is None or now - last_load["at"] >= METRICS_PERIOD)
            and now - _asked.get(asked, 0.0) >= METRICS_PERIOD
        ):
            _asked[asked] = now  # a scheduler that does not answer is asked again later
            figures = load(manager, info.name)
        if (
            figures is None
            and last is not None
            and last["workers"] == workers
            and last["cost_per_hour"] == price
            and now - last["at"] < PERIOD
        ):
            continue
        figures = figures or {}
        currency = (info.placement or {}).get("currency") or ""
        with manager.store.transaction() as conn:
            conn.execute(
                "INSERT INTO cluster_usage (cluster, at, workers, cost_per_hour, currency,"
                " cpu, memory, memory_limit) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.name,
                    now,
                    workers,
                    price,
                    currency,
                    figures.get("cpu"),
                    figures.get("memory"),
                    figures.get("memory_limit"),
                ),
            )
        written += 1
    return written


def usage(manager: Any, name: str, now: float | None = None) -> dict[str, Any]:
    """{cluster, cost_so_far, cost_per_hour, currency, samples: [{at, workers,
    cost_per_hour, cpu, memory, memory_limit}]} of the cluster's current life (since its
    last start); ``cpu`` (percent of the workers' threads), ``memory`` and
    ``memory_limit`` (bytes) are null where no load was measured."""
    info = manager.get(name)  # 404, another user's cluster too
    _ensure(manager.store)
    now = time.time() if now is None else now
    rows = manager.store.query(
        "SELECT at, workers, cost_per_hour, currency, cpu, memory, memory_limit"
        " FROM cluster_usage WHERE cluster = ? AND at >= ? ORDER BY at",
        (name, info.created_at),
    )
    end = now if info.state != "stopped" else (rows[-1]["at"] if rows else now)
    cost = 0.0
    for i, r in enumerate(rows):
        until = rows[i + 1]["at"] if i + 1 < len(rows) else end
        cost += (r["cost_per_hour"] or 0.0) * max(until - r["at"], 0.0) / 3600
    samples = [
        {
            "at": r["at"],
            "workers": r["workers"],
            "cost_per_hour": r["cost_per_hour"],
            "cpu": r["cpu"],
            "memory": r["memory"],
            "memory_limit": r["memory_limit"],
        }
        for r in rows
    ]
    if len(samples) > MAX_POINTS:  # a chart needs no more
        step = len(samples) / MAX_POINTS
        samples = [samples[int(i * step)] for i in range(MAX_POINTS)] + [samples[-1]]
    return {
        "cluster": name,
        "cost_so_far": round(cost, 6),
        "cost_per_hour": info.cost_per_hour,
        "currency": (rows[-1]["currency"] if rows else "")
        or (info.placement or {}).get("currency")
        or "",
        "samples": samples,
    }


class UsageRecorder:
    """Samples every ``tick`` seconds (writes only on change or every PERIOD)."""

    def __init__(self, manager: Any, tick: float = 1.0) -> None:
        self.manager = manager
        self.tick = tick
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_event_loop().create_task(self._loop())

    def stop(self) -> None:
        """Cancel the loop (the host stops); a later ``start`` begins a new one."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(sample, self.manager)
            except Exception:
                log.exception("usage sampling failed")
            await asyncio.sleep(self.tick)
