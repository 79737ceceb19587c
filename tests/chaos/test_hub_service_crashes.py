"""The hub's sidekick service (``jupyter-cloudtik hub-service`` under a real JupyterHub)
SIGKILLed at random moments while a user's clusters go up and down through it: JupyterHub
starts the service again (it restarts managed services that exit), the user's next request
finishes the work, and at the end nothing is left — no node process, no active operation,
a state that reads back.

JupyterHub polls its services every 30 s, so a kill costs up to that long: one round (a kill
during an `up`, one during a `down`) by default; ``CLOUDTIK_CHAOS_ROUNDS`` runs more.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cloudtik_emulators.hub import service_pid, start_hub

from .conftest import describe, rounds, seeded, state_corruption, wait_no_processes

ROUNDS = rounds(1)
pytestmark = [pytest.mark.chaos, pytest.mark.slow,
              pytest.mark.timeout(180 + 120 * ROUNDS)]
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hubchaos"),
                  sidekick_config="c.CloudTik.start_reaper = False\n")
    try:
        admin = h.browser("admin")
        r = admin.put(h.sidekick_api + "hub/catalog/provider/pool",
                      json={"spec": {"type": "local"}, "groups": ["physics"]})
        assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop()


def _request(session, method: str, url: str, **kw):
    """A request that a restarting service may refuse for a while (the hub's 503, a reset
    connection): None until the service answers."""
    import requests

    try:
        r = session.request(method, url, timeout=30, **kw)
    except requests.RequestException:
        return None
    return None if r.status_code in (502, 503, 504) else r


def _finish(hub, session, method: str, path: str, body=None, timeout: float = 150) -> dict:
    """Send the request until an operation for it ends succeeded (a kill may have lost the
    answer, the operation, or both); the operation's final record."""
    api = hub.sidekick_api
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        r = _request(session, method, api + path, json=body)
        if r is None:
            time.sleep(0.5)
            continue
        last = r
        if r.status_code == 404 and method == "DELETE":
            return {"state": "succeeded", "gone": True}
        if r.status_code == 409:  # busy: another operation on it still runs
            time.sleep(0.5)
            continue
        assert r.status_code in (200, 202), r.text
        op = r.json().get("operation")
        if op is None:
            return {"state": "succeeded"}
        while time.monotonic() < deadline:
            got = _request(session, "GET", api + f"operations/{op['id']}")
            if got is not None and got.status_code == 200:
                op = got.json()
                if op["state"] in FINAL:
                    break
            elif got is not None and got.status_code == 404:
                break  # the operation's answer was lost with its service: ask again
            time.sleep(0.3)
        if op.get("state") == "succeeded":
            return op
        time.sleep(0.3)  # interrupted by a kill: send it again
    raise AssertionError(f"{method} {path} did not finish in {timeout}s: {last and last.text}")


def _kill_later(base: Path, delay: float) -> int:
    time.sleep(delay)
    pid = service_pid(base)
    assert pid, "no hub-service process to kill"
    os.kill(pid, signal.SIGKILL)
    return pid


def _wait_back(hub, old: int, timeout: float = 90) -> None:
    alice = hub.session("alice")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = service_pid(hub.base)
        if pid and pid != old:
            r = _request(alice, "GET", hub.sidekick_api + "hub/whoami")
            if r is not None and r.status_code == 200:
                return
        time.sleep(0.3)
    raise AssertionError(f"JupyterHub did not start the service again in {timeout}s:\n"
                         f"{hub.log_tail()}")


def test_hub_service_sigkilled_during_ups_and_downs(hub):
    import threading

    seed, rng = seeded("hub-service chaos")
    alice = hub.session("alice")
    kills = 0
    for n in range(ROUNDS):
        name = f"hc{n}"
        for verb in ("up", "down"):
            killer_out: list[int] = []
            delay = rng.uniform(0.0, 1.5)
            killer = threading.Thread(target=lambda d=delay, out=killer_out: out.append(
                _kill_later(hub.base, d)))
            killer.start()
            if verb == "up":
                body = {"name": name, "provider": "pool", "workers": 1}
                first = _request(alice, "POST", hub.sidekick_api + "clusters", json=body)
                assert first is None or first.status_code in (202, 409), first.text
            else:
                _request(alice, "DELETE", hub.sidekick_api + f"clusters/{name}")
            killer.join(10)
            assert killer_out, "the kill did not happen"
            kills += 1
            _wait_back(hub, killer_out[0])
            if verb == "up":
                _finish(hub, alice, "POST", "clusters", body)
                info = alice.get(hub.sidekick_api + f"clusters/{name}", timeout=30).json()
                kinds = sorted(n["kind"] for n in info["nodes"] if n["status"] == "running")
                assert info["state"] == "running" and kinds == ["head", "worker"], (seed, info)
            else:
                _finish(hub, alice, "DELETE", f"clusters/{name}")

    # the user sees none left, nothing is active, nothing runs, the state reads back
    clusters = alice.get(hub.sidekick_api + "clusters", timeout=30).json()["clusters"]
    running = [c["name"] for c in clusters if c.get("state") not in ("stopped", "terminated")]
    state = hub.state_dir
    import sqlite3

    conn = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True)
    try:
        active = conn.execute("SELECT id, kind, state FROM operations WHERE state IN "
                              "('pending', 'running')").fetchall()
    finally:
        conn.close()
    # the running service and what it runs for its own sake (its egress proxy) stay;
    # anything else — a killed service's children included — is an orphan
    import psutil

    live = service_pid(hub.base)
    keep = {live, *(c.pid for c in psutil.Process(live).children(recursive=True))}
    left = wait_no_processes(state, keep, timeout=20)
    counts = {"kills": kills, "clusters left": len(running), "active operations": len(active),
              "orphaned processes": len(left), "corrupted state": len(state_corruption(state))}
    print(f"hub-service chaos (seed {seed}): {counts}")
    assert counts == {"kills": 2 * ROUNDS, "clusters left": 0, "active operations": 0,
                      "orphaned processes": 0, "corrupted state": 0}, (
        f"seed {seed}: {counts}; {running} {active}\n{describe(left)}")
