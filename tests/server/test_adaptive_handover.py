"""One driver of adaptive scaling at a time, handed between real processes: a Jupyter
server holds the store's adaptive lease while it runs; stopped, it hands the lease to the
reaper daemon, which goes on scaling; a server that starts again takes it back and
resumes every recorded cluster at once, with no request made to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from jupyter_cloudtik.clusters import adaptive
from jupyter_cloudtik.clusters.reaper import reaper_running
from jupyter_cloudtik.core.store import Store

from .conftest import BIN, _start_server, _stop

pytestmark = pytest.mark.slow

ARGS = ["--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"]


def cli(state_dir, *args):
    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(state_dir)}
    for var in ("CLOUDTIK_API_URL", "CLOUDTIK_API_TOKEN"):
        env.pop(var, None)
    return subprocess.run([str(BIN / "jupyter-cloudtik"), *args], capture_output=True,
                          text=True, timeout=180, env=env)


def wait_for(store: Store, name: str, workers: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        row = store.query_one("SELECT state, target_workers FROM clusters WHERE name = ?",
                              (name,))
        seen = (sum(json.loads(row["target_workers"]).values()), row["state"])
        if seen == (workers, "running"):
            return
        time.sleep(0.3)
    raise AssertionError(f"cluster {name} did not reach {workers} workers: {seen}")


def wait_holder(store: Store, kind: str, pid: int | None = None, timeout: float = 30):
    deadline = time.monotonic() + timeout
    holder = None
    while time.monotonic() < deadline:
        holder = adaptive.lease_holder(store)
        if holder and holder["kind"] == kind and (pid is None or holder["pid"] == pid):
            return holder
        time.sleep(0.2)
    raise AssertionError(f"adaptive lease not held by a {kind} {pid or ''}: {holder}")


def scalers(store: Store, name: str, since: float) -> set[str]:
    return {r["user"] for r in store.query(
        "SELECT user FROM operations WHERE kind = 'cluster.scale' AND target = ?"
        " AND created_at >= ?", (f"cluster:{name}", since))}


def slow_load(client, n: int = 40):
    return client.map(lambda i: (time.sleep(1.5), i * i)[1], range(n), pure=False)


def stop_server_only(server) -> None:
    """SIGTERM: an orderly stop (its shutdown hooks run), clusters left running."""
    os.killpg(server.proc.pid, signal.SIGTERM)
    server.proc.wait(30)


def test_server_hands_over_to_the_reaper_and_takes_back(tmp_path):
    from distributed import Client

    first = _start_server(tmp_path, "server", ARGS, {})
    store = Store(first.state_dir)
    second = None
    try:
        wait_holder(store, "server", first.proc.pid)  # held from startup, no request
        up = cli(first.state_dir, "up", "--name", "ho", "--workers", "1", "--json")
        assert up.returncode == 0, up.stderr
        address = json.loads(up.stdout)["scheduler_address"]
        t0 = time.time()
        r = cli(first.state_dir, "adapt", "ho", "--min", "1", "--max", "3",
                "--wait-count", "2")
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 20  # started, but it waits: a server holds the lease
        while not reaper_running(first.state_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reaper_running(first.state_dir)
        with Client(address, timeout=30) as c:
            futures = slow_load(c)
            wait_for(store, "ho", 3)  # driven by the server
            assert wait_holder(store, "server", first.proc.pid)
            assert "reaper" not in scalers(store, "ho", t0)

            stop_server_only(first)  # hands the lease back: the reaper goes on
            t1 = time.time()
            wait_holder(store, "reaper")
            assert c.gather(futures) == [i * i for i in range(40)]
            wait_for(store, "ho", 1)  # idle: the reaper shrinks it
            assert scalers(store, "ho", t1) == {"reaper"}

            # a server that starts takes the lease back and resumes the recorded
            # bounds at once: no request is made to it (only its /api/status probe)
            second = _start_server(tmp_path / "again", "server", ARGS,
                                   {"CLOUDTIK_STATE_DIR": str(first.state_dir)})
            wait_holder(store, "server", second.proc.pid)
            t2 = time.time()
            futures = slow_load(c)
            wait_for(store, "ho", 3)
            assert c.gather(futures) == [i * i for i in range(40)]
            users = scalers(store, "ho", t2)
            assert users and "reaper" not in users, users
    finally:
        problems = []
        if second is not None:
            problems += _stop(second)
        if first.proc.poll() is None:
            problems += _stop(first)
        cli(first.state_dir, "down", "ho")
        from .conftest import stop_state_processes

        problems += stop_state_processes(first.state_dir)
        store.close()
    assert not problems, problems
