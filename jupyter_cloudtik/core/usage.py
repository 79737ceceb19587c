"""Size and price of each cluster over time, and what it has cost so far.

A small table, ``cluster_usage``: one row per change of a cluster's running workers or
price per hour, and one at least every ``PERIOD`` seconds while it runs.  Cost so far is
the price integrated over time between samples (each sample's price holds until the
next).  Sampled by the process that owns the clusters (the server), next to adaptive
scaling."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("jupyter_cloudtik.usage")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_usage (
    cluster       TEXT NOT NULL,
    at            REAL NOT NULL,
    workers       INTEGER NOT NULL,
    cost_per_hour REAL,
    currency      TEXT
)
"""
INDEX = "CREATE INDEX IF NOT EXISTS cluster_usage_by_cluster ON cluster_usage (cluster, at)"
PERIOD = 60.0
MAX_POINTS = 500


def _ensure(store: Any) -> None:
    with store.transaction() as conn:
        conn.execute(SCHEMA)
        conn.execute(INDEX)


def sample(manager: Any, now: float | None = None) -> int:
    """Record every running cluster whose size or price changed (or PERIOD passed)."""
    _ensure(manager.store)
    now = time.time() if now is None else now
    written = 0
    for info in manager.list():
        last = manager.store.query_one(
            "SELECT at, workers, cost_per_hour FROM cluster_usage WHERE cluster = ?"
            " AND at >= ? ORDER BY at DESC LIMIT 1", (info.name, info.created_at))
        workers, price = info.running_workers, info.cost_per_hour
        if last is not None and last["workers"] == workers and \
                last["cost_per_hour"] == price and now - last["at"] < PERIOD:
            continue
        currency = (info.placement or {}).get("currency") or ""
        with manager.store.transaction() as conn:
            conn.execute("INSERT INTO cluster_usage VALUES (?, ?, ?, ?, ?)",
                         (info.name, now, workers, price, currency))
        written += 1
    return written


def usage(manager: Any, name: str, now: float | None = None) -> dict[str, Any]:
    """{cluster, cost_so_far, cost_per_hour, currency, samples: [{at, workers,
    cost_per_hour}]} of the cluster's current life (since its last start)."""
    info = manager.get(name)  # 404, another user's cluster too
    _ensure(manager.store)
    now = time.time() if now is None else now
    rows = manager.store.query(
        "SELECT at, workers, cost_per_hour, currency FROM cluster_usage WHERE cluster = ?"
        " AND at >= ? ORDER BY at", (name, info.created_at))
    end = now if info.state != "stopped" else (rows[-1]["at"] if rows else now)
    cost = 0.0
    for i, r in enumerate(rows):
        until = rows[i + 1]["at"] if i + 1 < len(rows) else end
        cost += (r["cost_per_hour"] or 0.0) * max(until - r["at"], 0.0) / 3600
    samples = [{"at": r["at"], "workers": r["workers"], "cost_per_hour": r["cost_per_hour"]}
               for r in rows]
    if len(samples) > MAX_POINTS:  # a chart needs no more
        step = len(samples) / MAX_POINTS
        samples = [samples[int(i * step)] for i in range(MAX_POINTS)] + [samples[-1]]
    return {"cluster": name, "cost_so_far": round(cost, 6),
            "cost_per_hour": info.cost_per_hour,
            "currency": (rows[-1]["currency"] if rows else "") or
            (info.placement or {}).get("currency") or "",
            "samples": samples}


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
