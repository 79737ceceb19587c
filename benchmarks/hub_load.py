"""Load on the JupyterHub sidekick: N users listing, creating and deleting clusters at once.

A real JupyterHub + configurable-http-proxy + the cloudtik sidekick (as a managed service,
``cloudtik_emulators.hub``), an admin-defined ``local`` provider shared with group
``physics``, and ``--users`` hub users in that group, each with their own token.  Every user
is a thread that, for ``--duration`` seconds, sends mostly cluster lists through the proxy
and now and then runs a create -> wait -> delete -> wait cycle (at most one cluster per user;
``workers: 0`` so only a head process runs).  The baseline, in the same run and interleaved
with the lists by the same users and tokens, is the hub's own ``GET /hub/api/user``: same
proxy, same auth path, no sidekick work.  So the ratio says what the sidekick adds under
this load.

Reported: requests and errors per kind (errors = any 5xx, or a 4xx that is not an expected
409 conflict; each distinct one is printed), p50/p95/p99 latency, the sidekick list p99 /
hub API p99 ratio, the sidekick's RSS before/peak/after, and that no cluster is left.

    .venv/bin/python benchmarks/hub_load.py                      # 20 users, 60 s
    .venv/bin/python benchmarks/hub_load.py --duration 10 --users 5   # quick check
    .venv/bin/python benchmarks/hub_load.py --list-weight 10 --cycle-prob 0.02 --hold 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import requests

from cloudtik_emulators.hub import Hub, start_hub

PROVIDER = "local-pool"
GROUP = "physics"
DONE = ("succeeded", "failed", "cancelled")
KINDS = ("list (sidekick)", "hub api (baseline)", "create", "delete", "operation poll")


class Stats:
    """Latencies and errors of all user threads (one lock; appends are cheap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.count: Counter[str] = Counter()
        self.conflicts: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.cycles = 0
        self.failed_ops: list[str] = []
        self.op_seconds: dict[str, list[float]] = defaultdict(list)   # 202 -> op done

    def record(self, kind: str, t0: float, resp: requests.Response | None,
               exc: Exception | None = None, expect: tuple[int, ...] = (200,)) -> bool:
        ms = (time.perf_counter() - t0) * 1000
        with self.lock:
            self.count[kind] += 1
            if exc is not None:
                self.errors[(kind, f"{type(exc).__name__}: {str(exc)[:160]}")] += 1
                return False
            assert resp is not None
            self.lat[kind].append(ms)
            if resp.status_code in expect:
                return True
            if resp.status_code == 409:
                self.conflicts[kind] += 1
                return False
            self.errors[(kind, f"HTTP {resp.status_code}: {resp.text[:200]}")] += 1
            return False


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def call(stats: Stats, kind: str, session: requests.Session, method: str, url: str,
         expect: tuple[int, ...] = (200,), **kw) -> requests.Response | None:
    t0 = time.perf_counter()
    try:
        resp = session.request(method, url, timeout=60, **kw)
    except requests.RequestException as exc:
        stats.record(kind, t0, None, exc)
        return None
    return resp if stats.record(kind, t0, resp, expect=expect) else None


def user_loop(hub: Hub, user: str, session: requests.Session, stats: Stats,
              args: argparse.Namespace, stop_at: float, rng: random.Random) -> None:
    """One simulated user: lists and baseline calls in turn, a cluster cycle now and then."""
    api = hub.sidekick_api
    cluster: str | None = None       # the user's cluster, while one exists
    op_id: str | None = None         # the operation being waited for
    phase = "idle"                   # idle -> creating -> holding -> deleting -> idle
    hold_until = op_started = 0.0
    seq = 0
    while time.monotonic() < stop_at:
        if phase == "idle" and rng.random() < args.cycle_prob:
            seq += 1
            cluster = f"{user}-c{seq}"
            r = call(stats, "create", session, "POST", api + "clusters", expect=(202,),
                     json={"name": cluster, "provider": PROVIDER, "workers": 0})
            if r is not None:
                op_id, phase = r.json()["operation"]["id"], "creating"
                op_started = time.monotonic()
            else:
                cluster = None
        elif phase in ("creating", "deleting") and rng.random() < 0.5:
            r = call(stats, "operation poll", session, "GET", api + f"operations/{op_id}")
            state = r.json().get("state") if r is not None else None
            if state in DONE:
                with stats.lock:
                    stats.op_seconds[phase].append(time.monotonic() - op_started)
                if state != "succeeded":
                    with stats.lock:
                        stats.failed_ops.append(f"{phase} {cluster}: {r.json()}"[:300])
                if phase == "creating":
                    phase, hold_until = "holding", time.monotonic() + args.hold
                else:
                    with stats.lock:
                        stats.cycles += 1
                    phase, cluster, op_id = "idle", None, None
        elif phase == "holding" and time.monotonic() >= hold_until:
            r = call(stats, "delete", session, "DELETE", api + f"clusters/{cluster}",
                     expect=(202,))
            if r is not None:
                op_id, phase = r.json()["operation"]["id"], "deleting"
                op_started = time.monotonic()
        elif rng.random() * (args.list_weight + 1) < args.list_weight:
            call(stats, "list (sidekick)", session, "GET", api + "clusters")
        else:
            call(stats, "hub api (baseline)", session, "GET", hub.api + "user")
        if args.think > 0:
            time.sleep(rng.expovariate(1 / args.think))


def sidekick_process(base: Path) -> psutil.Process | None:
    """This run's sidekick (other hubs, e.g. of tests, may run one too)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "hub-service" in cmd and str(base) in cmd:
            return p
    return None


def rss_mib(proc: psutil.Process | None) -> float:
    try:
        return proc.memory_info().rss / 2**20 if proc else float("nan")
    except psutil.NoSuchProcess:
        return float("nan")


def clean_up(hub: Hub, sessions: dict[str, requests.Session],
             timeout: float) -> tuple[int, list[str]]:
    """Delete every cluster still listed for any user; wait until none is listed.

    Returns how many were found at the end of the run and those still listed at timeout.
    """
    api = hub.sidekick_api
    deadline = time.monotonic() + timeout
    left: list[str] = []
    found = -1
    while time.monotonic() < deadline:
        left = []
        for user, s in sessions.items():
            listed = s.get(api + "clusters", timeout=60).json().get("clusters", [])
            for c in listed:
                left.append(f"{user}/{c['name']} ({c.get('status')})")
                s.delete(api + f"clusters/{c['name']}", timeout=60)  # 409 while busy: retry
        if found < 0:
            found = len(left)
        if not left:
            return found, []
        time.sleep(1)
    return found, left


def note_children(sk: psutil.Process | None, seen: dict[int, tuple[float, str]]) -> None:
    """Remember the sidekick's descendants (launcher, cluster nodes): nodes rename themselves
    (``cloudtik node ...``, ``dask scheduler [...]``), so after the run they are found by pid."""
    if sk is None:
        return
    try:
        children = sk.children(recursive=True)
    except psutil.Error:
        return
    for c in children:
        if c.pid in seen:
            continue
        try:
            seen[c.pid] = (c.create_time(), " ".join(c.cmdline())[:80].strip())
        except psutil.Error:
            pass


def stray_processes(base: Path, seen: dict[int, tuple[float, str]]) -> list[str]:
    """Processes of the run still alive: seen descendants, or any mentioning the run's
    folder (command line or environment)."""
    found = []
    for pid, (created, cmd) in seen.items():
        try:
            if psutil.Process(pid).create_time() == created:
                found.append(f"{pid} {cmd}")
        except psutil.Error:
            pass
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] in seen or p.info["pid"] == me:
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = " ".join(p.environ().values()) if str(base) not in cmd else ""
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if str(base) in cmd or str(base) in env:
            found.append(f"{p.info['pid']} {cmd[:120]}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=60, help="seconds of load")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--think", type=float, default=0.1,
                        help="mean pause between a user's requests, s (exponential)")
    parser.add_argument("--list-weight", type=float, default=1.0,
                        help="sidekick lists per hub-API baseline call (1 = even)")
    parser.add_argument("--cycle-prob", type=float, default=0.01,
                        help="chance per step that an idle user starts a create/delete cycle")
    parser.add_argument("--hold", type=float, default=5.0,
                        help="seconds a created cluster lives before its delete")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the run folder (logs)")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cloudtik-hubload-"))
    t_start = time.monotonic()
    hub = start_hub(base)
    sessions: dict[str, requests.Session] = {}
    seen: dict[int, tuple[float, str]] = {}
    status = 0
    try:
        print(f"hub + sidekick up in {time.monotonic() - t_start:.1f} s ({base})")
        names = [f"load{i:02d}" for i in range(args.users)]
        r = hub.admin_request("POST", "users", json={"usernames": names})
        assert r.status_code in (201, 409), r.text
        r = hub.admin_request("POST", f"groups/{GROUP}/users", json={"users": names})
        assert r.ok, r.text
        r = hub.session("admin").put(
            hub.sidekick_api + f"hub/catalog/provider/{PROVIDER}", timeout=30,
            json={"spec": {"type": "local"}, "secrets": {"token": "x"}, "groups": [GROUP]})
        assert r.ok, f"provider: HTTP {r.status_code} {r.text[:300]}"
        sessions = {u: hub.session(u) for u in names}
        for s in sessions.values():   # warm up (connections, hub auth caches)
            for url in (hub.sidekick_api + "clusters", hub.api + "user"):
                s.get(url, timeout=30).raise_for_status()
        sk = sidekick_process(base)
        rss_before = rss_mib(sk)

        stats = Stats()
        peak = [rss_before]
        stop_at = time.monotonic() + args.duration

        def sample() -> None:
            while time.monotonic() < stop_at:
                peak[0] = max(peak[0], rss_mib(sk))
                note_children(sk, seen)
                time.sleep(0.5)

        threads = [threading.Thread(target=sample, daemon=True)]
        threads += [threading.Thread(target=user_loop, daemon=True,
                                     args=(hub, u, sessions[u], stats, args, stop_at,
                                           random.Random(args.seed * 1000 + i)))
                    for i, u in enumerate(names)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0

        note_children(sk, seen)
        t_clean = time.monotonic()
        found, left = clean_up(hub, sessions, timeout=120)
        clean_s = time.monotonic() - t_clean
        time.sleep(2)   # let the sidekick settle before the last memory reading
        rss_after = rss_mib(sk)
        peak[0] = max(peak[0], rss_after)

        total = sum(stats.count.values())
        n_err = sum(stats.errors.values())
        print(f"\n{args.users} users, {wall:.1f} s, think {args.think} s, list weight "
              f"{args.list_weight}, cycle prob {args.cycle_prob}, hold {args.hold} s, "
              f"{os.cpu_count()} CPUs (shared)\n")
        print(f"{'kind':20} {'requests':>9} {'req/s':>7} {'errors':>7} {'409':>5} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
        for kind in KINDS:
            lat = stats.lat.get(kind, [])
            errs = sum(n for (k, _), n in stats.errors.items() if k == kind)
            print(f"{kind:20} {stats.count[kind]:9d} {stats.count[kind] / wall:7.1f} "
                  f"{errs:7d} {stats.conflicts[kind]:5d} {pct(lat, 50):8.1f} "
                  f"{pct(lat, 95):8.1f} {pct(lat, 99):8.1f}")
        print(f"{'all':20} {total:9d} {total / wall:7.1f} {n_err:7d}")
        ours, theirs = stats.lat["list (sidekick)"], stats.lat["hub api (baseline)"]
        print(f"\nerror rate: {n_err}/{total} = {100 * n_err / max(total, 1):.2f} %")
        print(f"create/delete cycles completed: {stats.cycles}")
        for phase, secs in stats.op_seconds.items():
            print(f"  {phase} operation, 202 -> done (seen by polling): median "
                  f"{statistics.median(secs):.2f} s, max {max(secs):.2f} s, n={len(secs)}")
        print(f"ratio sidekick list / hub api: p50 {pct(ours, 50) / pct(theirs, 50):.2f}, "
              f"p99 {pct(ours, 99) / pct(theirs, 99):.2f}")
        print(f"sidekick RSS: before {rss_before:.1f} MiB, peak {peak[0]:.1f} MiB, "
              f"after {rss_after:.1f} MiB (pid {sk.pid if sk else '?'})")
        nodes = [cmd for _, cmd in seen.values() if "launcher" not in cmd and "egress" not in cmd]
        kinds = [" ".join(c.split()[:2]) for c in nodes]   # "cloudtik head", "dask scheduler"
        print(f"cluster node processes seen (sampled every 0.5 s): {len(nodes)} "
              f"({', '.join(f'{n} {t}' for t, n in Counter(kinds).items()) or '-'})")
        print(f"clean-up: {found} cluster(s) listed at the end of the load, deleted; "
              f"{'none left' if not left else 'LEFT: ' + ', '.join(left)} ({clean_s:.1f} s)")
        if stats.errors:
            print("\nerrors:")
            for (kind, what), n in stats.errors.most_common():
                print(f"  {n:5d} x {kind}: {what}")
        if stats.failed_ops:
            print("\noperations that did not succeed:")
            for line in stats.failed_ops[:20]:
                print("  " + line)
        status = 1 if (n_err or left or stats.failed_ops) else 0
    finally:
        for s in sessions.values():
            s.close()
        hub.stop()
        # the launcher and the egress proxy run in their own sessions and leave by themselves
        # once the sidekick is gone (the launcher after its idle time): give them a while
        deadline = time.monotonic() + 20
        strays = stray_processes(base, seen)
        while strays and time.monotonic() < deadline:
            time.sleep(0.5)
            strays = stray_processes(base, seen)
        print(f"processes of the run after hub stop: {len(strays) or 'none left'}")
        for line in strays:
            print("STRAY PROCESS (killed): " + line)
            try:
                psutil.Process(int(line.split()[0])).kill()
            except psutil.Error:
                pass
        if strays:
            status = 1
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
