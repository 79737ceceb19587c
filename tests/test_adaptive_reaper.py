"""Adaptive scaling with no Jupyter server at all: `jupyter cloudtik adapt` records the
bounds and the reaper daemon runs the loop, holding the store's adaptive lease.  A plain
Python client's slow tasks grow the cluster to its maximum; idle, it shrinks back."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import doc_examples
import pytest

from jupyter_cloudtik.clusters import adaptive
from jupyter_cloudtik.clusters.reaper import reaper_running
from jupyter_cloudtik.core.store import Store

pytestmark = pytest.mark.slow


def cli(venv_bin, *args, timeout=180):
    return subprocess.run([str(venv_bin / "jupyter-cloudtik"), *args], capture_output=True,
                          text=True, timeout=timeout)


def wanted_workers(store: Store, name: str) -> tuple[int, str]:
    row = store.query_one("SELECT state, target_workers FROM clusters WHERE name = ?",
                          (name,))
    return sum(json.loads(row["target_workers"]).values()), row["state"]


def wait_for(store: Store, name: str, workers: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = wanted_workers(store, name)
        if seen == (workers, "running"):
            return
        time.sleep(0.3)
    raise AssertionError(f"cluster {name} did not reach {workers} workers: {seen}")


def docs_example() -> list[list[str]]:
    """The shell example of docs/dashboards.md's "Where the loop runs" (comments dropped)."""
    block = doc_examples.block("docs/dashboards.md", "Where the loop runs: the server, the "
                               "sidekick or the reaper daemon", lang="bash")
    return [shlex.split(line.split("#")[0])[2:] for line in block.text.splitlines()]


def test_cli_adapt_with_no_server_runs_in_the_reaper(venv_bin, state_dir):
    from distributed import Client

    (up_args, adapt_args) = docs_example()
    assert up_args[0] == "up" and adapt_args[:2] == ["adapt", "work"]
    up = cli(venv_bin, *up_args, "--json")
    assert up.returncode == 0, up.stderr
    address = json.loads(up.stdout)["scheduler_address"]
    assert not reaper_running(state_dir)  # no idle timeout: nothing needed it yet
    r = cli(venv_bin, *adapt_args, "--wait-count", "2")
    assert r.returncode == 0, r.stderr
    assert "adapts between 1 and 3 workers" in r.stdout
    # the CLI has exited; the reaper daemon it started holds the lease
    store = Store(state_dir)
    deadline = time.monotonic() + 30
    holder = None
    while time.monotonic() < deadline and holder is None:
        holder = adaptive.lease_holder(store)
        time.sleep(0.2)
    assert holder and holder["kind"] == "reaper", holder
    assert reaper_running(state_dir)

    with Client(address, timeout=30) as c:  # a plain Python client, no kernel, no server
        futures = c.map(lambda i: (time.sleep(1.5), i * i)[1], range(40), pure=False)
        wait_for(store, "work", 3, timeout=90)  # the load grows it to its maximum
        assert c.gather(futures) == [i * i for i in range(40)]
        wait_for(store, "work", 1, timeout=90)  # idle: back to the minimum
        assert c.submit(lambda: 7).result(timeout=60) == 7
    ops = store.query("SELECT user FROM operations WHERE kind = 'cluster.scale'"
                      " AND target = 'cluster:work'")
    assert ops and {o["user"] for o in ops} == {"reaper"}  # the daemon scaled it
    # the usage the daemon recorded meanwhile shows the growth
    peak = store.query_one("SELECT MAX(workers) FROM cluster_usage WHERE cluster = 'work'")[0]
    assert peak == 3

    bad = cli(venv_bin, "adapt", "work", "--min", "3", "--max", "1")
    assert bad.returncode == 2 and "3 is more than maximum (1)" in bad.stderr
    assert adaptive.adaptive_of(_manager(state_dir), "work").maximum == 3  # nothing changed

    assert cli(venv_bin, "down", "work").returncode == 0
    deadline = time.monotonic() + 20  # nothing left to watch: the daemon exits
    while time.monotonic() < deadline and reaper_running(state_dir):
        time.sleep(0.3)
    assert not reaper_running(state_dir)
    store.close()


def _manager(state_dir):
    from jupyter_cloudtik.clusters.manager import ClusterManager
    from jupyter_cloudtik.core.settings import CloudTik

    return ClusterManager(settings=CloudTik(state_dir=str(state_dir)))


def test_lease_one_holder_server_takes_over_reaper_waits(tmp_path):
    store = Store(tmp_path / "s")
    adaptive._ensure_table(store)
    reaper = adaptive.Lease(store, "reaper")
    server = adaptive.Lease(store, "server")
    other = adaptive.Lease(store, "server")
    assert reaper.acquire() and reaper.held()
    assert server.acquire()  # a server that starts takes over from the reaper
    assert not reaper.acquire() and not reaper.held()
    assert not other.acquire()  # a second server waits for the first
    server.release()  # a server that stops hands back
    assert reaper.acquire()
    # a holder that died without handing back: its lease expires (or its pid is gone)
    with store.transaction() as conn:
        conn.execute("UPDATE adaptive_lease SET expires = ?", (time.time() - 1,))
    assert other.acquire() and adaptive.lease_holder(store)["holder"] == other.holder
    store.close()
