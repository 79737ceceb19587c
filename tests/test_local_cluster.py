"""Real local clusters: dask scheduler and worker processes, real computations."""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from jupyter_cloudtik import Cluster
from jupyter_cloudtik.core.config import build_config, with_worker_size
from jupyter_cloudtik.core.errors import (
    CapacityError,
    ConflictError,
    NotFoundError,
)
from jupyter_cloudtik.core.operations import started_info
from jupyter_cloudtik.providers.local.capacity import (
    NODE_MEMORY_FLOOR,
    machine_cpus,
    machine_memory,
)
from jupyter_cloudtik.providers.local.processes import find_marked_processes, is_alive
from jupyter_cloudtik.providers.local.provider import LocalNodeProvider


def node_pids(state_dir, cluster="default") -> dict[int, str]:
    return find_marked_processes(state_dir, cluster=cluster)


def test_up_compute_scale_down(backend, state_dir):
    c = Cluster.up(workers=2, name="calc", progress=False, backend=backend)
    info = c.refresh()
    assert info.state == "running"
    assert info.running_workers == 2
    assert info.dashboard_link.startswith("http://127.0.0.1:")
    pids = node_pids(state_dir, "calc")
    assert len(pids) == 3  # scheduler + 2 workers

    client = c.client()
    try:
        futures = client.map(lambda x: x * x, range(100))
        assert client.submit(sum, futures).result() == sum(x * x for x in range(100))
        workers = client.scheduler_info()["workers"]
        assert {w["name"] for w in workers.values()} == {n.node_id for n in info.workers}
        # threads as LocalCluster(n_workers=2) gives them: ceil(cores / 2)
        assert all(w["nthreads"] == max(1, math.ceil(machine_cpus() / 2))
                   for w in workers.values())
    finally:
        client.close()

    c.scale(1, progress=False)
    assert c.refresh().running_workers == 1
    c.scale(3, progress=False)
    assert c.refresh().running_workers == 3
    assert len(node_pids(state_dir, "calc")) == 4

    before = node_pids(state_dir, "calc")
    c.down(progress=False)
    assert c.refresh().state == "stopped"
    for pid in before:
        assert not is_alive(pid), f"process {pid} survived down"


def test_up_again_replaces_a_dead_worker(backend, state_dir):
    c = Cluster.up(workers=2, progress=False, backend=backend)
    worker_pid = next(p for p, n in node_pids(state_dir).items() if "-worker-" in n)
    os.killpg(worker_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and c.refresh().state != "degraded":
        time.sleep(0.1)
    info = c.refresh()
    assert info.state == "degraded", info
    assert "1 of 2 workers" in info.reason

    again = Cluster.up(workers=2, progress=False, backend=backend)  # same config: reconcile
    assert again.name == c.name
    info = c.refresh()
    assert info.state == "running" and info.running_workers == 2
    assert worker_pid not in node_pids(state_dir)


def test_up_of_a_running_cluster_is_idempotent(backend, state_dir):
    Cluster.up(workers=1, progress=False, backend=backend)
    pids = node_pids(state_dir)
    Cluster.up(workers=1, progress=False, backend=backend)
    assert node_pids(state_dir) == pids  # nothing restarted


def test_refusals_change_nothing(backend, state_dir, settings):
    # more worker processes than this machine's memory can hold at all
    too_many = machine_memory() // NODE_MEMORY_FLOOR + 1
    with pytest.raises(CapacityError) as e:
        Cluster.up(workers=too_many, progress=False, backend=backend,
                   config={"available_node_types": {"worker": {
                       "resources": {"CPU": 1}, "max_workers": too_many}}})
    assert e.value.field == "workers"
    assert "not enough capacity" in e.value.message and "nothing was started" in e.value.message
    assert f"{too_many + 1} more node(s) needed" in e.value.message  # the need...
    assert f"room for at most {too_many - 1} local nodes" in e.value.message  # ...and the room
    assert backend.list(include_stopped=True) == []  # no record, no process
    assert node_pids(state_dir) == {}

    # one node bigger than the machine; GPUs it does not have
    with pytest.raises(CapacityError) as e:
        Cluster.up(workers=1, progress=False, backend=backend, memory="100TiB")
    assert e.value.field == "available_node_types.worker.resources.memory"
    assert ("a worker node asks 100.0 TiB of memory, more than one node can have "
            f"({machine_memory() / 2**30:.1f} GiB)") in e.value.message
    with pytest.raises(CapacityError, match="1 GPUs needed, 0 available") as e:
        Cluster.up(workers=1, progress=False, backend=backend,
                   config={"available_node_types": {"worker": {"resources": {"GPU": 1}}}})
    assert e.value.field == "workers"
    assert backend.list(include_stopped=True) == [] and node_pids(state_dir) == {}

    Cluster.up(workers=1, progress=False, backend=backend)
    with pytest.raises(ConflictError) as clash:
        Cluster.up(workers=2, progress=False, backend=backend)
    # the fix first, in one line; sizes as people write them, not raw bytes
    said = str(clash.value)
    assert said.startswith("a local cluster 'default' exists with another config: pass "
                           "another name (--name / name=)"), said
    assert "\n" not in said and not re.search(r"\d{7,}", said), said
    with pytest.raises(NotFoundError, match="no cluster named 'nope'; clusters: default"):
        Cluster.get("nope", backend=backend)
    with pytest.raises(Exception, match="more than max_workers"):
        Cluster("default", backend).scale(1000, progress=False)
    assert backend.get("default").target_workers == {"worker": 1}

    Cluster("default", backend).down(progress=False)
    with pytest.raises(ConflictError, match="is stopped; start it with `up`"):
        Cluster("default", backend).scale(2, progress=False)


def test_default_worker_size_shares_the_machine_like_local_cluster(settings):
    cores, memory = machine_cpus(), machine_memory()
    for n in (1, 2, cores, 4, 4 * cores):
        cfg = build_config(None, workers=n, settings=settings)
        res = cfg["available_node_types"]["worker"]["resources"]
        threads = max(1, math.ceil(cores / n))  # LocalCluster(n_workers=n)'s threads
        assert res["CPU"] == threads, (n, res)
        assert res["memory"] == int(memory * threads / max(cores, n * threads)), (n, res)
        assert n * res["memory"] <= memory  # the workers never claim more than the machine
        assert cfg["available_node_types"]["head"]["resources"]["CPU"] == 0
    # --cores / --memory are honoured exactly; memory then follows the declared cores
    defaults = LocalNodeProvider.default_node_types({"type": "local"})
    sized = build_config(with_worker_size(None, defaults, cores=3, memory="1.5GiB"),
                         workers=4, settings=settings)
    assert sized["available_node_types"]["worker"]["resources"] == {
        "CPU": 3, "memory": int(1.5 * 2**30), "GPU": 0}
    cores_only = build_config(with_worker_size(None, defaults, cores=2 * cores),
                              workers=1, settings=settings)
    assert cores_only["available_node_types"]["worker"]["resources"]["CPU"] == 2 * cores
    assert cores_only["available_node_types"]["worker"]["resources"]["memory"] == memory


def test_several_clusters_oversubscribe_with_a_warning(backend, state_dir, capsys):
    cores = machine_cpus()
    first = Cluster.up(workers=4, name="first", progress=False, backend=backend)
    assert "WARNING" not in capsys.readouterr().err  # 4 workers alone: no warning
    # 3x the machine's cores in one worker on top: allowed, and said loudly
    op_id = backend.start_up(with_worker_size(None, {"head": {"resources": {"CPU": 0}},
                                                     "worker": {"resources": {}}},
                                              cores=3 * cores),
                             name="second", workers=1)
    warnings = started_info(backend, op_id).warnings
    assert len(warnings) == 1 and warnings[0].startswith(
        f"oversubscribed: with 1 x worker ({3 * cores} CPU, ")
    assert "c.LocalProvider.oversubscription_warning" in warnings[0]
    assert backend.operation(op_id).to_dict()["warnings"] == warnings  # REST's view
    backend.wait(op_id)
    events = list(backend.events(op_id))
    assert [e.message for e in events if e.level == "warning"] == warnings
    assert backend.get("second").last_operation["warnings"] == warnings  # the panel row's
    assert backend.get("second").state == "running" and first.refresh().state == "running"
    # the API (and so the magics) print it, once per cluster: first's scale says it for
    # first, its next scale does not repeat it
    first.scale(5, progress=False)
    err = capsys.readouterr().err
    assert "WARNING: cluster 'first': oversubscribed: with 1 x worker" in err
    assert len(err.strip().splitlines()) == 1, err  # one line
    assert first.refresh().running_workers == 5
    first.scale(6, progress=False)
    assert "oversubscribed" not in capsys.readouterr().err
    # a cluster that went down and comes up again is a new one: said again
    first.down(progress=False)
    Cluster.up(workers=6, name="first", progress=False, backend=backend)
    assert "WARNING: cluster 'first': oversubscribed" in capsys.readouterr().err


def test_capacity_counts_other_clusters(backend, settings):
    settings.config.LocalProvider.cpu_overcommit = 1.0  # an explicit hard limit is kept
    total = machine_cpus()
    Cluster.up(workers=total, name="first", progress=False, backend=backend)
    with pytest.raises(CapacityError) as e:
        Cluster.up(workers=1, name="second", progress=False, backend=backend)
    assert "in use by other clusters: first:" in e.value.message


def test_cluster_outlives_its_creator_and_is_found_by_others(state_dir, venv_bin, backend):
    # started by a CLI process that exits; found and used from here
    out = subprocess.run(
        [str(venv_bin / "jupyter-cloudtik"), "up", "--workers", "1", "--name", "shared",
         "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    c = Cluster.get("shared", backend=backend)
    with c.client() as client:
        assert client.submit(lambda: 40 + 2).result() == 42
    assert c.refresh().state == "running"


CRASHER = textwrap.dedent("""
    import sys
    from jupyter_cloudtik import Cluster
    Cluster.up(workers=2, name="crash", progress="text")
""")


@pytest.mark.parametrize("kill_when", ["head_started", "workers_started"])
def test_kill_during_up_then_up_finishes(state_dir, backend, kill_when):
    proc = subprocess.Popen([sys.executable, "-c", CRASHER], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    marker = "scheduler is up" if kill_when == "head_started" else "starting 2 worker"
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            proc.kill()
            break
    proc.wait(timeout=30)
    assert any(marker in line for line in lines), "".join(lines)
    # the killed process left a running operation and some processes behind (a new
    # head's workers are forked right after it, before its scheduler is up: they may be
    # a few milliseconds from marking themselves as the node's)
    deadline = time.monotonic() + 10
    while not node_pids(state_dir, "crash"):
        assert time.monotonic() < deadline, "the killed up left no node process"
        time.sleep(0.05)
    info = backend.get("crash")
    assert info.state == "starting"

    c = Cluster.up(workers=2, name="crash", progress=False, backend=backend)
    info = c.refresh()
    assert info.state == "running" and info.running_workers == 2
    ops = backend.operations("crash")
    assert ops[-1].state == "failed" and "interrupted" in ops[-1].reason
    # every process that exists belongs to a recorded node; down removes all of them
    recorded = {n.node_id for n in info.nodes}
    assert set(node_pids(state_dir, "crash").values()) == recorded
    c.down(progress=False)
    assert node_pids(state_dir, "crash") == {}


def test_kill_during_up_then_down_cleans_up(state_dir, backend):
    proc = subprocess.Popen([sys.executable, "-c", CRASHER], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "starting 2 worker" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    Cluster("crash", backend).down(progress=False)
    assert node_pids(state_dir, "crash") == {}
    assert backend.get("crash").state == "stopped"


def test_cancel_an_up_in_progress(state_dir, manager):
    async def scenario():
        handle = await manager.start_up({"available_node_types": {"worker": {
            "min_workers": 2, "resources": {"CPU": 1},
        }}, "setup_commands": ["sleep 30"]})
        async for ev in handle.events():
            if ev.step == "head":
                break
        await handle.cancel()
        return handle.info

    op = asyncio.run(scenario())
    assert op.state == "cancelled"
    info = manager.get("default")
    assert info.state == "failed" and "cancelled" in info.reason
    asyncio.run(manager.down("default"))
    assert node_pids(state_dir) == {}


def test_a_failing_node_reports_its_log(manager, state_dir):
    cfg = {"setup_commands": ["echo setting up; exit 7"]}
    with pytest.raises(Exception) as e:
        asyncio.run(manager.up(cfg))
    assert "exited with code 3" in str(e.value)  # setup failure exit code
    assert "setup command 1 failed with exit code 7" in str(e.value)
    info = manager.get("default")
    assert info.state == "failed"
    logs = manager.logs("default")
    assert any("setting up" in text for text in logs.values())


def test_memory_limit_is_enforced(backend, state_dir):
    c = Cluster.up(progress=False, backend=backend, config={
        "available_node_types": {"worker": {"min_workers": 1,
                                             "resources": {"CPU": 1, "memory": "400MiB"}}}})
    pid = next(p for p, n in node_pids(state_dir).items() if "-worker-" in n)
    with c.client() as client:
        def hog():  # touch every page (calloc'ed zeros would not count) and hold them
            block = b"x" * (600 * 2**20)
            time.sleep(30)
            return len(block)

        fut = client.submit(hog, pure=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and is_alive(pid):
            time.sleep(0.2)
        fut.cancel()
    assert not is_alive(pid), "the worker over its memory limit kept running"
    logs = c.logs()
    assert any("over 95% of its memory limit" in t for t in logs.values())


def test_exec_launch_method(backend, settings, state_dir):
    c = Cluster.up(workers=1, progress=False, backend=backend,
                   config={"provider": {"type": "local", "launch_method": "exec"}})
    with c.client() as client:
        assert client.submit(lambda: "hi").result() == "hi"
    pids = node_pids(state_dir)
    assert all("python" in " ".join(psutil.Process(p).cmdline()) or
               "dask" in " ".join(psutil.Process(p).cmdline()) for p in pids)
    c.down(progress=False)
    assert node_pids(state_dir) == {}


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_terminate_while_the_launch_is_in_flight_leaves_no_process(state_dir, settings,
                                                                   method):
    """A recovering `up` may terminate a pending node whose launch (by the killed `up`,
    through the launcher) has not forked yet; the node must then never start."""
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.providers.base import ProviderContext
    from jupyter_cloudtik.providers.local.provider import LocalNodeProvider

    store = Store(state_dir)
    prov = LocalNodeProvider({"type": "local", "launch_method": method}, "race",
                             ProviderContext(state_dir, store, settings))
    real_launch = prov._launch

    def launch_after_a_terminate(specs):
        # the other `up` terminates the pending records first, then the launch lands
        prov.terminate_nodes([s["node_id"] for s in specs])
        return real_launch(specs)

    prov._launch = launch_after_a_terminate
    head = {"runtime": {"role": "head"}}
    created = prov.create_node(head, {"cloudtik-node-kind": "head"}, 1)
    node_id, launched = next(iter(created.items()))
    deadline = time.monotonic() + 30  # the process that was launched ends by itself
    while time.monotonic() < deadline and is_alive(launched["pid"]):
        time.sleep(0.1)
    assert not is_alive(launched["pid"])
    assert find_marked_processes(state_dir, cluster="race") == {}
    assert prov.non_terminated_nodes({}) == []
    assert "terminated before it started" in prov.node_logs(node_id)
    store.close()


def test_up_after_a_scale_down_ends_at_the_requested_size(backend, state_dir):
    """Issue 20: ``up --workers 2`` after the cluster was scaled to 1 must end with 2
    workers (or say why not), not report success at the scaled size."""
    c = Cluster.up(workers=2, progress=False, backend=backend)
    c.scale(1, progress=False)
    assert c.refresh().running_workers == 1
    again = Cluster.up(workers=2, progress=False, backend=backend)
    assert again.name == c.name
    info = c.refresh()
    assert (info.state, info.running_workers) == ("running", 2), info
    assert len(node_pids(state_dir)) == 3  # scheduler + 2 workers, really running
    client = c.client()
    try:
        assert len(client.scheduler_info()["workers"]) == 2
    finally:
        client.close()
    # and down to the named size too
    c.scale(3, progress=False)
    assert c.refresh().running_workers == 3
    Cluster.up(workers=2, progress=False, backend=backend)
    info = c.refresh()
    assert (info.state, info.running_workers) == ("running", 2), info
    assert len(node_pids(state_dir)) == 3
