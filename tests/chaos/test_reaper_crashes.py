"""The idle reaper daemon SIGKILLed at random moments (while it waits, while it checks the
clusters, in the middle of shutting one down): the next `up`, or the next cluster with an
idle timeout, starts it again, and every idle cluster still gets reaped — completely: no
node process left, no operation left active, the daemon exits once nothing is left to watch.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from jupyter_cloudtik.clusters.reaper import reaper_running
from jupyter_cloudtik.providers.local.processes import find_marked_processes

from .conftest import (
    ChaosServer,
    call,
    cli_list,
    describe,
    rounds,
    seeded,
    state_corruption,
    wait_no_processes,
    wait_operation,
)

ROUNDS = rounds(2)
pytestmark = [pytest.mark.chaos, pytest.mark.slow,
              pytest.mark.timeout(120 + 40 * ROUNDS)]  # more rounds, more time

IDLE_MINUTES = 0.04  # 2.4 s


def reaper_pids(state_dir) -> list[int]:
    state = str(state_dir)
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        # "cloudtik reaper STATE" once it has set its process title
        if p.info["status"] != psutil.STATUS_ZOMBIE and state in cmd and (
                "clusters.reaper" in cmd or cmd.startswith("cloudtik reaper")):
            out.append(p.pid)
    return out


def wait_for(what: str, cond, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout}s")


def up_idle(api, name: str) -> None:
    r = call(api, "POST", "clusters", json={
        "name": name, "workers": 1, "config": {"idle_timeout_minutes": IDLE_MINUTES}})
    assert r is not None and r.status_code == 202, r and r.text
    op = wait_operation(api, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op


def test_reaper_sigkilled_at_random_moments_still_reaps(tmp_path):
    seed, rng = seeded("reaper chaos")
    n = ROUNDS
    srv = ChaosServer(tmp_path / "srv")
    state = srv.state_dir
    api = srv.server
    history: list[str] = []
    problems: list[str] = []
    names: list[str] = []
    try:
        for i in range(1, n + 1):
            # the next up: a cluster already known (it may have been reaped) or a new one
            name = rng.choice(names) if names and rng.random() < 0.5 else f"idle{i}"
            if name not in names:
                names.append(name)
            up_idle(api, name)
            pids = wait_for("the reaper to start after an up with an idle timeout",
                            lambda: reaper_pids(state), 15)
            delay = rng.uniform(0.0, 4.0)
            history.append(f"round {i}: up {name}, SIGKILL reaper {pids} after {delay:.2f}s")
            time.sleep(delay)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_for("the killed reaper to be gone", lambda: not reaper_running(state), 10)
            # the next up (of any cluster with an idle timeout) brings the reaper back
            again = f"idle{i}b"
            names.append(again)
            up_idle(api, again)
            wait_for("the reaper to start again after the next up", lambda: reaper_pids(state),
                     15)

            def all_reaped():
                r = call(api, "GET", "clusters", params={"all": "true"})
                by_name = {c["name"]: c for c in r.json()["clusters"]}
                return all(by_name[x]["state"] == "stopped" for x in names) and by_name
            try:
                wait_for(f"round {i}: every idle cluster reaped", all_reaped, 45)
            except AssertionError as e:
                r = call(api, "GET", "clusters", params={"all": "true"})
                problems.append(f"{e}: " + ", ".join(
                    f"{c['name']} {c['state']} ({c.get('reason')})"
                    for c in r.json()["clusters"]))
                break
        # the reaper exits by itself once nothing is left to watch
        try:
            wait_for("the reaper to exit with nothing to watch", lambda: not reaper_running(
                state), 15)
        except AssertionError as e:
            problems.append(str(e))
        nodes = find_marked_processes(state)
        if nodes:
            problems.append(f"node processes left: {sorted(set(nodes.values()))}")
        r = call(api, "GET", "operations", params={"active": "true", "limit": 1000})
        problems += [f"operation left active: {op['kind']} {op['target']} {op['state']}"
                     for op in r.json()["operations"]]
        r = call(api, "GET", "clusters", params={"all": "true"})
        problems += [f"{c['name']} not reaped for idleness: {c['state']} {c.get('reason')!r}"
                     for c in r.json()["clusters"]
                     if c["state"] != "stopped" or "idle for" not in (c.get("reason") or "")]
        srv.server.proc.terminate()
        srv.server.proc.wait(30)
        problems += state_corruption(state)
        code, _listed, err = cli_list(state)
        if code != 0:
            problems.append(f"`jupyter cloudtik list --all`: {code} {err}")
        left = wait_no_processes(srv.base, set(), timeout=15)
        if left:
            problems.append(f"orphaned processes:\n{describe(left)}")
    finally:
        if srv.server.proc.poll() is None:
            srv.stop()
        from tests.server.conftest import stop_state_processes

        stop_state_processes(state)
    print(f"reaper chaos, seed {seed}, {n} rounds: problems = {len(problems)}")
    assert not problems, (
        f"seed {seed} (replay: CLOUDTIK_CHAOS_SEED={seed} CLOUDTIK_CHAOS_ROUNDS={n}); "
        f"problems = {len(problems)}:\n  " + "\n  ".join(problems)
        + "\nrounds:\n  " + "\n  ".join(history)
        + "\nreaper log:\n" + ((state / "reaper.log").read_text()[-4000:]
                               if (state / "reaper.log").exists() else ""))
