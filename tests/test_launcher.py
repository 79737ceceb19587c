"""The local launcher daemon's start: one per state folder however many ask at once, and a
start right after a stop (the old one may still hold its lock) gets a new one."""

from __future__ import annotations

import os
import threading
import time

import psutil

from cloudtik_emulators.processes import stop_launcher
from jupyter_cloudtik.providers.local import launcher


def test_concurrent_starts_share_one_launcher_and_a_restart_after_stop_works(state_dir):
    env = dict(os.environ)
    hellos: list[dict] = []

    def start() -> None:
        hellos.append(launcher.ensure_running(state_dir, 3, env=env))

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(hellos) == 3 and len({h["pid"] for h in hellos}) == 1, hellos
    first = hellos[0]["pid"]
    # a worker launch (here of no node) waits for the whole preload; the daemon goes on after
    assert launcher.request(state_dir, {"op": "launch", "specs": []}) == []
    hello = launcher.request(state_dir, {"op": "hello"})
    assert hello["pid"] == first
    time.sleep(0.5)  # a few turns of its loop
    assert launcher.request(state_dir, {"op": "hello"})["pid"] == first
    log = (launcher.local_dir(state_dir) / "launcher.log").read_text()
    assert "Traceback" not in log, log
    # ask it to stop and start again at once: the exiting one still holds the lock a moment
    launcher.request(state_dir, {"op": "stop"}, timeout=5)
    again = launcher.ensure_running(state_dir, 3, env=env, timeout=30)
    assert again["pid"] != first
    assert psutil.pid_exists(again["pid"])
    stop_launcher(state_dir)
