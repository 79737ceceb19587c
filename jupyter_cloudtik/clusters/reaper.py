"""The idle reaper: shuts down clusters idle longer than ``idle_timeout_minutes``.

It is a small daemon of its own (one per state folder, held by an ``flock``), started when
a cluster with an idle timeout comes up, so idle clusters stop even after the kernel or
the server that started them is gone.  It asks each scheduler since when it has been idle
(Dask's ``check_idle``; for Spark, its master's running applications) and runs the
ordinary ``down`` operation, so the shutdown is recorded with its reason like any other.
It also hosts adaptive scaling when no server does (``clusters/adaptive.py``): for clusters
whose adaptive bounds are recorded (``jupyter cloudtik adapt`` from a shell, or a server
that stopped and handed its lease back) it runs the same loop, holding the store's
adaptive lease as a ``reaper`` — a server that starts takes it over — and records the
clusters' size and price over time meanwhile.  It exits when no cluster with an idle
timeout or recorded adaptive bounds is left.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from ..core.env import scrub_environment
from ..core.errors import ProviderError
from ..core.locks import try_flock
from ..core.operations import Target
from ..core.settings import CloudTik, load_user_config
from ..core.store import Store, loads
from ..runtime import base as runtimes
from . import adaptive, table, usage
from .manager import ClusterManager

log = logging.getLogger("jupyter_cloudtik.reaper")

LOCK_NAME = "reaper.lock"


class Reaper:
    def __init__(self, manager: ClusterManager) -> None:
        self.manager = manager

    def watched(self) -> list:
        """Clusters with an idle timeout that exist (or are being started)."""
        return [c for c in self.manager.list() if c.idle_timeout_minutes > 0]

    async def tick(self) -> list[str]:
        """Check every watched cluster once; returns the names that were shut down."""
        stopped = []
        for info in self.watched():
            if info.state == "stopping":
                # a stop nobody is doing any more (a reaper or server killed in the middle
                # of it): finish it, or the cluster stays half stopped for good
                if not self.manager.ops.active_for(str(Target("cluster", info.name))):
                    row = self.manager.store.query_one(
                        "SELECT params FROM operations WHERE target = ? AND kind = "
                        "'cluster.down' ORDER BY created_at DESC LIMIT 1",
                        (str(Target("cluster", info.name)),))
                    why = (loads(row["params"], {}) or {}).get("reason") if row else None
                    log.info("finishing the interrupted stop of cluster %s", info.name)
                    try:
                        await self.manager.down(
                            info.name, reason=why or info.reason or "an interrupted stop")
                        stopped.append(info.name)
                    except Exception as e:
                        log.warning("could not finish stopping %s: %s", info.name, e)
                continue
            if info.state not in ("running", "degraded") or not info.connect_info:
                continue
            try:
                connect = await asyncio.to_thread(
                    self.manager.usable_connect_info, info.config, info.name,
                    info.connect_info)
                since = await runtimes.idle_since(info.config, connect)
            except (LookupError, runtimes.RuntimeUnreachable, ProviderError):
                continue
            if since is None:
                continue
            idle_minutes = (time.time() - since) / 60
            if idle_minutes < info.idle_timeout_minutes:
                continue
            if self.manager.ops.active_for(str(Target("cluster", info.name))):
                continue
            reason = (f"idle for {idle_minutes:.1f} minutes "
                      f"(idle_timeout_minutes: {info.idle_timeout_minutes:g})")
            log.info("stopping cluster %s: %s", info.name, reason)
            try:
                await self.manager.down(info.name, reason=reason)
                stopped.append(info.name)
            except Exception as e:  # keep reaping the others
                log.warning("could not stop %s: %s", info.name, e)
        return stopped

    def needed(self) -> bool:
        """Something to watch: a cluster with an idle timeout, or one with adaptive bounds."""
        return bool(self.watched()) or bool(adaptive.recorded(self.manager.store))

    async def _sample_usage(self, runner: adaptive.AdaptiveRunner) -> None:
        while True:  # a server samples while it holds the lease; we do when we hold it
            if runner.holding:
                try:
                    await asyncio.to_thread(usage.sample, self.manager)
                except Exception:
                    log.exception("usage sampling failed")
            await asyncio.sleep(1.0)

    async def run(self, interval: float) -> None:
        runner = adaptive.AdaptiveRunner(
            self.manager, lease=adaptive.Lease(self.manager.store, "reaper"))
        runner.start()
        sampler = asyncio.get_event_loop().create_task(self._sample_usage(runner))
        try:
            quiet_ticks = 0
            while quiet_ticks < 2:
                await self.tick()
                quiet_ticks = 0 if self.needed() else quiet_ticks + 1
                await asyncio.sleep(interval)
        finally:
            sampler.cancel()
            runner.stop_now()


def _lock_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / LOCK_NAME


def _try_lock(state_dir: str | Path) -> int | None:
    return try_flock(_lock_path(state_dir))


def reaper_running(state_dir: str | Path) -> bool:
    fd = _try_lock(state_dir)
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_reaper(settings: CloudTik, store: Store | None = None) -> bool:
    """Start the reaper daemon if a cluster needs it (an idle timeout, or adaptive bounds
    recorded) and none runs; True if started."""
    if not settings.start_reaper:
        return False
    store = table.ensure(store or Store(settings.state_dir))
    rows = store.query("SELECT config FROM clusters WHERE state != 'stopped'")
    import json

    if not any((json.loads(r[0]).get("idle_timeout_minutes") or 0) > 0 for r in rows) \
            and not adaptive.recorded(store):
        return False
    if reaper_running(settings.state_dir):
        return False

    with open(Path(settings.state_dir) / "reaper.log", "ab") as logf:
        subprocess.Popen(
            [sys.executable, "-m", "jupyter_cloudtik.clusters.reaper",
             "--state-dir", settings.state_dir, "--interval", str(settings.reaper_interval)],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
            env=scrub_environment(dict(os.environ)), start_new_session=True, close_fds=True,
        )
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jupyter_cloudtik.clusters.reaper")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fd = _try_lock(args.state_dir)
    if fd is None:
        log.info("another reaper serves %s", args.state_dir)
        return
    try:
        import setproctitle

        setproctitle.setproctitle(f"cloudtik reaper {args.state_dir}")
    except Exception:
        pass

    settings = CloudTik(config=load_user_config(), state_dir=args.state_dir)
    manager = ClusterManager(settings=settings, user="reaper")
    log.info("reaper %d watching %s every %.1fs", os.getpid(), args.state_dir, args.interval)
    try:
        asyncio.run(Reaper(manager).run(args.interval))
    finally:
        os.close(fd)
    log.info("no cluster with an idle timeout or adaptive bounds is left; exiting")


if __name__ == "__main__":
    main()
