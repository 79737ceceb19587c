"""The ``slurm`` cluster provider against the real single-node Slurm of the HPC tests
(slurmctld + slurmd + slurmdbd, ``batch_sched_delay=0``), locally and over a loopback sshd.

Nodes are Slurm jobs: every check asks Slurm itself (squeue/scontrol/sacct), never our
records, and every test ends with no job of ours in squeue and no process left.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import doc_examples
import psutil
import pytest

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.errors import CapacityError, ConfigError

from .conftest import wait_for
from .test_hpc_slurm_ssh import sshd as sshd_server

pytest.importorskip("dask_jobqueue")

sshd = sshd_server  # the loopback sshd of the slurm-over-SSH tests (module fixture)


def run(coro):
    return asyncio.run(coro)


def squeue(slurm) -> list[dict]:
    r = slurm.run("squeue", "--me", "-h", "-o", "%i|%T|%j|%k|%l")
    out = []
    for line in r.stdout.splitlines():
        jid, state, name, comment, limit = line.split("|", 4)
        out.append({"id": jid, "state": state, "name": name, "comment": comment,
                    "limit": limit})
    return out


def ours(slurm, cluster: str) -> list[dict]:
    return [j for j in squeue(slurm) if f"cluster={cluster}" in j["comment"]]


def workers_of(slurm, cluster: str) -> list[dict]:
    return [j for j in ours(slurm, cluster) if "kind=worker" in j["comment"]]


def dask_processes(state_dir) -> list[str]:
    """Dask processes started for this test (their command lines name its folders)."""
    found = []
    base = str(state_dir.parent)
    for p in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            # "dask scheduler [tcp://...]" is how Dask titles its processes; the
            # dashboard relay of a TLS scheduler job runs dashboard_relay.py
            if ("distributed" in cmd or cmd.startswith("dask ")
                    or "dashboard_relay" in cmd) and (
                    base in cmd or (p.info["cwd"] or "").startswith(base)):
                found.append(f"{p.pid}: {cmd[:150]}")
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture
def slurm_cfg(slurm, tmp_path):
    """A provider section for the test Slurm: its SLURM_CONF, a job folder of this test."""
    return {"type": "slurm", "env": slurm.env, "workdir": str(tmp_path / "slurm-jobs"),
            "walltime": "00:20:00", "cores": 1, "memory": "300MiB"}


def _config(name: str, provider: dict, workers: int) -> dict:
    return {"cluster_name": name, "provider": provider,
            "available_node_types": {
                "worker": {"min_workers": workers, "max_workers": 4, "resources": {}}}}


def _in_another_process(state_dir, cluster: str, body: str) -> dict:
    """Run ``body`` in a fresh interpreter, as another process of the user: it has ``m``
    (a ClusterManager on the same state folder) and ``st`` (the cluster's status) and
    prints JSON on its last line, which is returned."""
    code = (
        "import asyncio, json\n"
        "from jupyter_cloudtik.clusters.manager import ClusterManager\n"
        "from jupyter_cloudtik.core.settings import CloudTik\n"
        f"m = ClusterManager(settings=CloudTik(state_dir={str(state_dir)!r}))\n"
        f"st = asyncio.run(m.status({cluster!r}))\n" + body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_up_compute_scale_replace_down(slurm, slurm_cfg, manager, state_dir):
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider

    t0 = time.monotonic()
    info = run(manager.up(_config("sl", slurm_cfg, 2)))
    assert info.state == "running", info.reason
    jobs = workers_of(slurm, "sl")
    assert len(jobs) == 2 and all(j["state"] == "RUNNING" for j in jobs), jobs
    assert all(j["limit"] == "20:00" for j in jobs)  # walltime reached sbatch
    assert all(j["name"] == "cloudtik-sl-worker" for j in jobs)
    # the nodes are the jobs: ids and states in the status
    st = run(manager.status("sl"))
    wnodes = sorted(n.node_id for n in st.nodes if n.kind == "worker")
    assert wnodes == sorted(j["id"] for j in jobs)
    assert all(n.info["slurm_state"] == "RUNNING" for n in st.nodes if n.kind == "worker")
    print("up in", round(time.monotonic() - t0, 2), "s")

    # a computation on the Slurm workers
    from distributed import Client

    with Client(info.scheduler_address, timeout=10) as c:
        who = c.run(lambda: os.environ.get("SLURM_JOB_ID"))
        assert sorted(who.values()) == wnodes
        assert c.submit(sum, range(10)).result(timeout=30) == 45
    # logs are the jobs' output files
    logs = manager.logs("sl", wnodes[0])
    assert "Starting Worker" in logs[wnodes[0]] or "Start worker" in logs[wnodes[0]], logs

    # scale down then up: the job count in squeue follows
    run(manager.scale("sl", 1))
    assert len(workers_of(slurm, "sl")) == 1
    run(manager.scale("sl", 2))
    assert len(workers_of(slurm, "sl")) == 2

    # a worker job killed outside: seen as gone (degraded), replaced by `up`
    victim = workers_of(slurm, "sl")[0]["id"]
    slurm.run("scancel", victim)
    wait_for(lambda: victim not in {j["id"] for j in squeue(slurm)}, 20, what="scancel")
    st = run(manager.status("sl"))
    assert st.state == "degraded", (st.state, st.reason)
    info = run(manager.up(_config("sl", slurm_cfg, 2)))
    now = {j["id"] for j in workers_of(slurm, "sl")}
    assert len(now) == 2 and victim not in now
    # sacct knows why the gone one ended
    prov = SlurmNodeProvider(slurm_cfg, "sl", manager.context)
    assert prov.node_info(victim)["slurm_state"].startswith("CANCELLED")

    # down: no job in squeue, no Dask process left
    run(manager.down("sl"))
    assert ours(slurm, "sl") == []
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")


def test_scheduler_as_job_rediscovered_and_reaped(slurm, slurm_cfg, manager, state_dir):
    """scheduler: job — the head is a Slurm job too; a new process (a restarted kernel)
    finds the cluster from Slurm alone and computes on it; the reaper stops it when idle."""
    cfg = _config("slj", {**slurm_cfg, "scheduler": "job"}, 1)
    cfg["idle_timeout_minutes"] = 0.05
    info = run(manager.up(cfg))
    assert info.state == "running", info.reason
    jobs = ours(slurm, "slj")
    heads = [j for j in jobs if "kind=head" in j["comment"]]
    assert len(heads) == 1 and len(jobs) == 2, jobs
    st = run(manager.status("slj"))
    head = next(n for n in st.nodes if n.kind == "head")
    assert head.node_id == heads[0]["id"] and head.info["slurm_state"] == "RUNNING"

    # a fresh interpreter with the same state folder: status and a computation
    seen = _in_another_process(state_dir, "slj", (
        "from distributed import Client\n"
        "with Client(st.scheduler_address, timeout=10) as c:\n"
        "    r = c.submit(lambda x: x * 7, 6).result(timeout=30)\n"
        "print(json.dumps({'state': st.state, 'nodes': sorted(n.node_id for n in st.nodes),"
        " 'result': r}))\n"))
    assert seen == {"state": "running", "nodes": sorted(j["id"] for j in jobs), "result": 42}

    # idle: the reaper runs the ordinary down; nothing stays queued
    from jupyter_cloudtik.clusters.reaper import Reaper

    time.sleep(3.5)
    stopped = run(Reaper(manager).tick())
    assert stopped == ["slj"]
    assert manager.get("slj").state == "stopped"
    assert ours(slurm, "slj") == []
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")


def _scheduler_files(slurm_cfg, cluster: str) -> list[str]:
    from pathlib import Path

    return sorted(p.name for p in Path(slurm_cfg["workdir"]).glob(f"*-{cluster}/scheduler-*"))


def test_worker_jobs_queue_before_the_scheduler_is_up(slurm, slurm_cfg, manager):
    """`up` queues a new head's worker jobs right after the head job: Slurm holds them
    while the scheduler starts (seen in squeue before any scheduler file exists), they
    wait for its file, and join."""
    name = "slq"
    cfg = _config(name, {**slurm_cfg, "scheduler": "job"}, 1)

    async def go():
        handle = await manager.start_up(cfg)
        seen = None
        while seen is None and not handle.info.state.endswith("ed"):
            jobs = await asyncio.to_thread(ours, slurm, name)
            if any("kind=worker" in j["comment"] for j in jobs):
                seen = (jobs, _scheduler_files(slurm_cfg, name))
            await asyncio.sleep(0.02)
        await handle.wait()
        return handle.op_id, seen

    op_id, seen = run(go())
    assert seen is not None, "no worker job was ever seen in squeue"
    jobs, files = seen
    assert files == [], f"the scheduler was up before its worker job was queued: {files}"
    assert {j["comment"].split("kind=")[1].split("&")[0] for j in jobs} == {"head", "worker"}
    steps = [f"{e.step}: {e.message}" for e in manager.ops.events(op_id)]
    starting = next(i for i, m in enumerate(steps) if m.startswith("workers: starting 1"))
    up = next(i for i, m in enumerate(steps) if m.startswith("head: scheduler is up"))
    assert starting < up, steps
    info = manager.get(name)
    assert info.state == "running", info.reason  # the worker found the scheduler and joined
    run(manager.down(name))
    assert ours(slurm, name) == []
    assert _scheduler_files(slurm_cfg, name) == []  # a reused job id finds no old file


def test_a_failing_head_job_takes_its_queued_workers_along(slurm, slurm_cfg, manager):
    """The scheduler job fails (a bad scheduler option): the worker job queued with it is
    cancelled, and the error says why and which jobs went."""
    from jupyter_cloudtik.core.errors import NodeLaunchError
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider

    name = "slf"
    cfg = _config(name, {**slurm_cfg, "scheduler": "job"}, 1)
    cfg["runtime"] = {"dask": {"scheduler_options": ["--no-such-option"]}}
    with pytest.raises(NodeLaunchError) as e:
        run(manager.up(cfg))
    msg = e.value.message
    assert "the head node" in msg and "stopped while starting" in msg, msg
    assert "no-such-option" in msg, msg  # the scheduler's own complaint, from its log
    assert "1 worker node(s) started with it" in msg and "were stopped" in msg, msg
    worker = msg.split("started with it (")[1].split(")")[0]
    assert worker.isdigit(), msg
    assert ours(slurm, name) == []  # nothing waits in the queue
    prov = SlurmNodeProvider(slurm_cfg, name, manager.context)
    assert prov.node_info(worker)["slurm_state"].startswith("CANCELLED")  # sacct
    run(manager.down(name))


def test_down_during_up_cancels_the_queued_workers(slurm, slurm_cfg, manager):
    """`down` while `up` waits for a scheduler job: the worker job queued with it goes
    too, and `up` ends cancelled."""
    from jupyter_cloudtik.core.errors import OperationCancelled

    name = "sld"
    cfg = _config(name, {**slurm_cfg, "scheduler": "job"}, 1)

    async def go():
        handle = await manager.start_up(cfg)
        while not any("kind=worker" in j["comment"]
                      for j in await asyncio.to_thread(ours, slurm, name)):
            assert not handle.info.state.endswith("ed"), handle.info
            await asyncio.sleep(0.02)
        assert _scheduler_files(slurm_cfg, name) == []  # the head is not up yet
        await manager.down(name)
        with pytest.raises(OperationCancelled):
            await handle.wait()

    run(go())
    assert ours(slurm, name) == []
    assert manager.get(name).state == "stopped"


@pytest.mark.slow
def test_walltime_expiry_is_seen_and_replaced(slurm, slurm_cfg, manager):
    """A worker job that reaches its time limit ends (Slurm: TIMEOUT); status says so and
    `up` replaces it.  The limit is shortened on the running job so the test waits seconds,
    not the minute that is Slurm's smallest --time."""
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider

    run(manager.up(_config("slw", slurm_cfg, 1)))
    (victim,) = [j["id"] for j in workers_of(slurm, "slw")]
    slurm.run("scontrol", "update", f"JobId={victim}", "TimeLimit=0:01")
    wait_for(lambda: victim not in {j["id"] for j in squeue(slurm)}, 90, interval=0.5,
             what="the time limit to end the job")
    st = run(manager.status("slw"))
    assert st.state == "degraded"
    prov = SlurmNodeProvider(slurm_cfg, "slw", manager.context)
    assert prov.node_info(victim)["slurm_state"] == "TIMEOUT"
    run(manager.up(_config("slw", slurm_cfg, 1)))
    (new,) = [j["id"] for j in workers_of(slurm, "slw")]
    assert new != victim
    run(manager.down("slw"))
    assert ours(slurm, "slw") == []


@pytest.mark.parametrize("change, field, says", [
    ({"partition": "nosuch"}, "provider.partition", "not a partition Slurm"),
    ({"account": "nosuch"}, "provider.account", "sacctmgr show account: root"),
    ({"qos": "nosuch"}, "provider.qos", "sacctmgr show qos: normal"),
    ({"walltime": "02:00:00"}, "provider.walltime", "TIMELIMIT 1:00:00"),
    ({"cores": 8}, "provider.cores", "has 2 (scontrol show node CPUTot)"),
    ({"memory": "64GiB"}, "provider.memory", "has 2000 MB (scontrol show node RealMemory)"),
    ({"job_extra_directives": ["--gres=gpu:9"]}, "provider.gpus", "Invalid generic resource"),
    ({"job_extra_directives": ["--no-such-option=1"]}, "provider.job_extra_directives",
     "unrecognized option"),
])
def test_bad_input_names_the_field_and_queues_nothing(slurm, slurm_cfg, manager, change,
                                                      field, says):
    name = "bad"
    with pytest.raises(ConfigError) as e:
        run(manager.up(_config(name, {**slurm_cfg, **change}, 1)))
    assert e.value.field == field, e.value.message
    assert says in e.value.message, e.value.message
    assert ours(slurm, name) == []
    assert manager.list() == []  # refused before anything was recorded


def test_more_workers_than_the_partition_holds(slurm, slurm_cfg, manager):
    with pytest.raises(CapacityError) as e:
        run(manager.up(_config("big", slurm_cfg, 4)))
    assert e.value.field == "workers"
    assert "partition 'debug'" in e.value.message and "idle of 2 CPU cores" in \
        e.value.message, e.value.message
    assert ours(slurm, "big") == [] and manager.list() == []


def test_unreachable_login_node(slurm, slurm_cfg, manager):

    port = ports.free_port()  # nothing listens there
    cfg = {**slurm_cfg, "host": "127.0.0.1", "port": port, "connect_timeout": 3}
    with pytest.raises(ConfigError) as e:
        run(manager.up(_config("far", cfg, 1)))
    assert e.value.field == "provider.host"
    assert "cannot reach Slurm on 127.0.0.1" in e.value.message and str(port) in \
        e.value.message, e.value.message
    assert manager.list() == []


def test_magic_refusal_is_a_usage_error(slurm, slurm_cfg, monkeypatch):
    """`%cluster up --provider slurm` with a bad partition: one UsageError line, exit 2 in
    the CLI, nothing queued."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    ip = InteractiveShell.instance()  # the one shell of the test process (as other tests)
    ip.run_line_magic("load_ext", "jupyter_cloudtik")
    cfg_file = os.path.abspath("bad.yaml")
    with open(cfg_file, "w") as f:
        json.dump({"cluster_name": "mag", "provider": {**slurm_cfg, "partition": "gpu"}}, f)
    with pytest.raises(UsageError, match=r"provider\.partition: 'gpu' is not a partition"):
        ip.run_line_magic("cluster", f"up {cfg_file} --workers 1")
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "up", cfg_file],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "provider.partition" in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert ours(slurm, "mag") == []


def test_over_ssh_with_a_configured_hpc_backend(slurm, slurm_cfg, manager, sshd, tmp_path,
                                               monkeypatch, state_dir):
    """`backend:` names the HPC backend of the login node (its host, user, known_hosts,
    SLURM_CONF and its key in the secret store): the scheduler and the worker are jobs
    submitted over that SSH connection; the client reaches the scheduler through the
    provider's SSH tunnel (test_scheduler_job_through_the_ssh_tunnel looks closer)."""
    _ssh_backend(slurm, sshd, manager, tmp_path, monkeypatch)
    prov_cfg = {k: v for k, v in slurm_cfg.items() if k != "env"}
    prov_cfg.update(backend="login", python=sys.executable)
    info = run(manager.up(_config("ssh", prov_cfg, 1)))
    assert info.state == "running", info.reason
    # a loopback login node and localhost nodes: all on this loopback, plain TCP
    assert info.scheduler_address.startswith("tcp://127.0.0.1:")
    jobs = ours(slurm, "ssh")
    assert sorted(j["comment"].split("kind=")[1].split("&")[0] for j in jobs) == [
        "head", "worker"]
    from distributed import Client

    with Client(info.scheduler_address, timeout=10) as c:
        assert c.submit(pow, 2, 10).result(timeout=30) == 1024
    wid = next(j["id"] for j in jobs if "kind=worker" in j["comment"])
    assert "Starting Worker" in manager.logs("ssh", wid)[wid]  # read over SFTP
    run(manager.down("ssh"))
    assert ours(slurm, "ssh") == []
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")
    needle = sshd.private_key.splitlines()[1]
    for p in (tmp_path / "slurm-jobs").rglob("*"):
        if p.is_file():
            assert needle not in p.read_text(errors="ignore"), p


def _doc_blocks(doc: str, heading: str) -> list[str]:
    """The python blocks under a heading of docs/DOC."""
    return [b.text for b in doc_examples.blocks(f"docs/{doc}", heading, lang="python")]


def test_readme_example_notebook_then_cli(slurm, state_dir, tmp_path, monkeypatch):
    """The README's slurm example as a user runs it: the magics in a real kernel with
    SLURM_CONF set (Slurm on this machine), the kernel restarted (the notebook closed),
    a new kernel finds the cluster, then the CLI lines of the README; nothing stays queued."""
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    heading = "The `slurm` provider"
    python = doc_examples.block("README.md", heading, lang="python").text
    bash = doc_examples.block("README.md", heading, lang="bash").text
    yaml_cfg = doc_examples.block("README.md", heading, lang="yaml").text
    # docs/slurm-provider.md opens with the same example: this runs it too
    same = doc_examples.block("docs/slurm-provider.md", "The `slurm` cluster provider")
    assert doc_examples.code(same.text) == doc_examples.code(python), same.id
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("HOME", str(tmp_path))  # the default job folder ~/cloudtik-slurm

    client = NotebookClient(new_notebook(), kernel_name="python3", timeout=180)

    def cell(source: str) -> str:
        c = new_code_cell(source)
        client.nb.cells.append(c)
        client.execute_cell(c, len(client.nb.cells) - 1)
        return "\n".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
                         for o in c.outputs)

    with client.setup_kernel():
        out = cell(python)
        assert out.strip().endswith("6"), out
        jobs = workers_of(slurm, "default")
        assert len(jobs) == 2 and all(j["state"] == "RUNNING" for j in jobs)
        run_sync(client.km.restart_kernel)(now=True)
        run_sync(client.kc.wait_for_ready)(timeout=60)
        out = cell("%load_ext jupyter_cloudtik\n"
                   "c = %cluster status\n"
                   "print(sorted(n.node_id for n in c.info.nodes if n.kind == 'worker'))\n"
                   "print(c.client().submit(max, [4, 2]).result())")
        assert str(sorted(j["id"] for j in jobs)) in out and out.strip().endswith("4"), out
    for line in bash.splitlines():
        argv = line.split("#", 1)[0].split()
        if not argv:
            continue
        assert argv[:2] == ["jupyter", "cloudtik"]
        r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", *argv[2:]],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (line, r.stdout, r.stderr)
        if argv[2] == "status":
            assert all(j["id"] in r.stdout for j in jobs), r.stdout
    assert ours(slurm, "default") == []
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")
    # the YAML example is a valid provider section (the schema the panel's form is made of)
    import yaml

    from jupyter_cloudtik.core.config import build_config

    cfg = build_config({"provider": yaml.safe_load(yaml_cfg)["provider"]})
    assert cfg["available_node_types"]["worker"]["resources"]["CPU"] == 8


def test_several_dask_processes_per_job(slurm, slurm_cfg, manager, state_dir):
    """processes: 2 — one Slurm job (one node) runs two Dask workers named <job>-0/-1."""
    cfg = _config("slp", {**slurm_cfg, "cores": 2, "processes": 2}, 1)
    info = run(manager.up(cfg))
    (job,) = workers_of(slurm, "slp")
    from distributed import Client

    with Client(info.scheduler_address, timeout=10) as c:
        c.wait_for_workers(2, timeout=60)  # the node counts as joined with its first one
        names = sorted(w["name"] for w in c.scheduler_info()["workers"].values())
        assert names == [f"{job['id']}-0", f"{job['id']}-1"]
        assert c.submit(abs, -3).result(timeout=30) == 3
    st = run(manager.status("slp"))
    assert st.state == "running" and [n.status for n in st.nodes if n.kind == "worker"] == [
        "running"]
    run(manager.down("slp"))
    assert ours(slurm, "slp") == []


def test_the_panel_form_comes_from_the_schema(manager):
    """The New-cluster form of the panel is built from the provider list's schema."""
    (slurm_p,) = [p for p in manager.providers() if p["name"] == "slurm"]
    assert slurm_p["available"] and slurm_p["title"] == "Slurm"
    props = slurm_p["config_schema"]["properties"]
    for key in ("partition", "account", "qos", "walltime", "cores", "memory", "processes",
                "gpus", "job_script_prologue", "job_extra_directives", "backend", "host",
                "scheduler"):
        assert key in props, key
    assert props["scheduler"]["enum"] == ["job", "login"]
    with pytest.raises(ConfigError) as e:
        from jupyter_cloudtik.core.config import build_config

        build_config({"provider": {"type": "slurm", "walltme": "1:00:00"}})
    assert e.value.field == "provider" and "'walltme'" in e.value.message


def _secret_lines(state_dir, cluster: str) -> list[str]:
    """A line from the middle of each private key of the cluster (what must not leak)."""
    from jupyter_cloudtik.runtime.tls import load_cluster_tls

    tls = load_cluster_tls(state_dir, cluster)
    assert tls is not None
    return [tls.node_key.splitlines()[2], tls.client_key.splitlines()[2]]


@pytest.mark.parametrize("mode", ["job", "login"])
def test_tls_and_storages_reach_the_workers(slurm, slurm_cfg, manager, state_dir, tmp_path,
                                           mode):
    """tls: true (what a multi-node Slurm gets by default): scheduler and workers speak
    tls:// only, with the cluster's certificates staged as 0600 files; a plain client and
    a TLS client without the cluster's certificate are refused; no key is in a job script,
    `scontrol show job -d`, a command line or an environment.  A storage of the notebook
    (a password-protected WebDAV served by rclone) reaches the workers over that TLS
    connection and a task reads a file from it."""
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider
    from jupyter_cloudtik.storage.manager import StorageManager
    from jupyter_cloudtik.storage.servers import start_server

    name = f"tls{mode}"
    (tmp_path / "data" / "in").mkdir(parents=True)
    (tmp_path / "data" / "in" / "hello.txt").write_text("read on a Slurm worker")
    with start_server("webdav", tmp_path / "data", workdir=tmp_path / "dav") as dav:
        storage = StorageManager(settings=manager.settings, store=manager.store,
                                 supervise=False)
        storage.add("data", "webdav", dav.storage_options(), source="in")
        # 2 cores in the test Slurm: a scheduler job takes one of them
        cfg = _config(name, {**slurm_cfg, "tls": True, "scheduler": mode},
                      2 if mode == "login" else 1)
        cfg["storage"] = {"remotes": ["data"]}
        info = run(manager.up(cfg))
        assert info.state == "running", info.reason
        assert info.scheduler_address.startswith("tls://"), info.scheduler_address
        _, connect = manager.connect_info(name)
        assert connect.extra["tls"] and connect.credentials

        def read_storage():
            import os
            import stat
            import subprocess

            conf = os.environ["RCLONE_CONFIG"]
            r = subprocess.run([os.environ["CLOUDTIK_RCLONE"], "cat", "data:hello.txt"],
                               capture_output=True, text=True, timeout=60)
            return {"out": r.stdout, "err": r.stderr[-500:], "conf": conf,
                    "mode": oct(stat.S_IMODE(os.stat(conf).st_mode)),
                    "job": os.environ.get("SLURM_JOB_ID")}

        with SlurmNodeProvider.make_client(connect, timeout=10) as c:
            assert c.submit(sum, range(10)).result(timeout=30) == 45
            seen = c.run(read_storage)
            # the docs' example, as written
            (example,) = _doc_blocks("slurm-provider.md", "Storages on the workers")
            *lines, last = example.strip().splitlines()
            scope = {}
            exec("\n".join(lines), scope)
            assert last == 'client.submit(head, "hello.txt").result()'
            assert c.submit(scope["head"], "hello.txt").result(timeout=60) == \
                "read on a Slurm worker"
            assert all(a.startswith("tls://") for a in c.scheduler_info()["workers"])
        jobs = ours(slurm, name)
        assert sorted(s["job"] for s in seen.values()) == sorted(
            j["id"] for j in jobs if "kind=worker" in j["comment"])
        for s in seen.values():
            assert s["out"] == "read on a Slurm worker", s
            assert s["mode"] == "0o600" and s["conf"].startswith("/dev/shm/"), s

        # knocked on as an attacker would: plain tcp://, TLS without a client
        # certificate, a Dask client with a certificate of another CA
        from cloudtik_emulators.tlsprobe import attempts
        from jupyter_cloudtik.runtime.tls import make_cluster_tls, node_files

        other = make_cluster_tls("other")
        got = attempts(info.scheduler_address, node_files(state_dir, name)["ca"],
                       other.client_cert, other.client_key)
        print("knocks:", got)
        assert set(got) == {"plain", "tls-no-cert", "tls-other-ca"}
        assert all(v.startswith("refused") for v in got.values()), got
        relays = _relay_processes(tmp_path)
        if mode == "job":
            # the dashboard's relay beside the scheduler job: the same three knocks
            # refused during the handshake, the cluster's client certificate let in
            relay = connect.extra["dashboard_tls_address"]
            assert connect.dashboard_link == relay + "/status" and not connect.http_address
            rhost, rport = relay.split("://")[1].rsplit(":", 1)
            assert _relay_knocks(rhost, int(rport), connect.credentials, other) == {
                "tls-no-cert": "refused", "tls-other-ca": "refused",
                "plain": "refused", "ours": "200"}
            assert len(relays) == 1, relays
        else:  # a login scheduler's dashboard is on this machine's loopback (the server's)
            assert connect.dashboard_link.startswith("http://127.0.0.1:") and not relays
        _dashboard_through_the_server(manager, tmp_path, connect, name)

        # the certificates: 0600 files in a 0700 folder next to the job logs
        (tls_dir,) = (tmp_path / "slurm-jobs").glob(f"*-{name}/tls")
        assert oct(tls_dir.stat().st_mode & 0o777) == "0o700"
        assert sorted(p.name for p in tls_dir.iterdir()) == ["ca.pem", "node-key.pem",
                                                              "node.pem"]
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in tls_dir.iterdir())

        # ... and no private key (nor the storage password) anywhere Slurm or ps shows
        needles = [*_secret_lines(state_dir, name), dav.password]
        shown = []
        for j in jobs:
            shown.append(slurm.run("scontrol", "show", "job", "-d", j["id"]).stdout)
            script = slurm.run("scontrol", "write", "batch_script", j["id"], "-")
            assert "#!/usr/bin/env bash" in script.stdout, script.stderr
            assert "--tls-key" in script.stdout and "--protocol tls" in script.stdout
            shown.append(script.stdout)
        shown.append(json.dumps([j["comment"] for j in jobs]))
        for p in psutil.process_iter(["cmdline"]):
            try:
                shown.append(" ".join(p.info["cmdline"] or []))
                if ("distributed" in shown[-1] or "dashboard_relay" in shown[-1]) and \
                        str(tmp_path) in shown[-1]:
                    shown.append(json.dumps(p.environ()))
            except (psutil.Error, OSError):
                continue
        if mode == "job":  # the relay: its command line names the folder, its code no key
            assert str(tls_dir) in " ".join(relays[0].cmdline())
            shown.append((tls_dir.parent / "dashboard_relay.py").read_text())
        text = "\n".join(shown)
        assert str(tls_dir) in text  # the scripts name the files...
        for needle in needles:  # ...never their content
            assert needle not in text
        run(manager.down(name))
    assert ours(slurm, name) == []
    assert not tls_dir.exists()  # down removed the staged certificates
    assert not (state_dir / "tls" / name).exists()
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")


def _relay_processes(tmp_path) -> list[psutil.Process]:
    """The dashboard relays of this test's scheduler jobs."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(a.endswith("/dashboard_relay.py") and str(tmp_path) in a for a in cmd):
            out.append(p)
    return out


def _relay_knocks(host: str, port: int, creds: dict, other) -> dict[str, str]:
    """How the dashboard relay at host:port answers a GET /status: over plain TCP, TLS
    without a client certificate, with a certificate of another CA, with ours."""
    import socket
    import ssl

    from jupyter_cloudtik.runtime.tls import client_ssl_context

    no_cert = ssl.create_default_context(cadata=creds["ca"])
    no_cert.check_hostname = False
    foreign = client_ssl_context({"ca": creds["ca"], "cert": other.client_cert,
                                  "key": other.client_key})
    out = {}
    for what, ctx in (("plain", None), ("tls-no-cert", no_cert), ("tls-other-ca", foreign),
                      ("ours", client_ssl_context(creds))):
        try:
            with socket.create_connection((host, port), timeout=5) as raw:
                s = ctx.wrap_socket(raw) if ctx else raw
                s.settimeout(10)
                s.sendall(f"GET /status HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
        except (ssl.SSLError, OSError):
            # under TLS 1.3 the refusal of a client certificate arrives at the first read
            answer = b""
        out[what] = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") \
            else "refused"
    return out


def _ssh_backend(slurm, sshd, manager, tmp_path, monkeypatch) -> None:
    from jupyter_cloudtik.core.secrets import SecretStore

    hpc_file = tmp_path / "hpc.yaml"
    hpc_file.write_text(json.dumps({"backends": {"login": {
        "type": "slurm", "host": "127.0.0.1", "port": sshd.port, "user": "root",
        "known_hosts": str(sshd.folder / "known_hosts"), "env": slurm.env}}}))
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(hpc_file))
    SecretStore(manager.store).put("hpc:login", "ssh_key", sshd.private_key)


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.Process().net_connections("tcp"))


def test_scheduler_job_through_the_ssh_tunnel(slurm, slurm_cfg, manager, sshd, tmp_path,
                                              monkeypatch, state_dir):
    """scheduler: job over SSH: the client reaches the scheduler job through a port this
    process forwards over the provider's SSH connection (with TLS inside it); the tunnel is
    opened again when the SSH connection drops and by a new process (a restarted kernel),
    and `down` closes it."""
    from jupyter_cloudtik.providers import slurm_tunnel
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider

    _ssh_backend(slurm, sshd, manager, tmp_path, monkeypatch)
    prov_cfg = {k: v for k, v in slurm_cfg.items() if k != "env"}
    prov_cfg.update(backend="login", python=sys.executable, tls=True)
    info = run(manager.up(_config("tun", prov_cfg, 1)))
    assert info.state == "running", info.reason
    _, connect = manager.connect_info("tun")
    remote = connect.extra["remote_scheduler_address"]
    assert remote.startswith("tls://") and connect.extra["tunnel"]["to"] == remote.split(
        "://")[1]
    local = int(connect.scheduler_address.rsplit(":", 1)[1])
    assert connect.scheduler_address == f"tls://127.0.0.1:{local}"
    assert local != int(remote.rsplit(":", 1)[1]) and _listening(local)
    # the dashboard stays on the node's loopback; its relay is forwarded too
    relay_to = connect.extra["tunnel"]["relay_to"]
    relay = connect.extra["dashboard_tls_address"]
    relay_port = int(relay.rsplit(":", 1)[1])
    assert relay == f"https://127.0.0.1:{relay_port}" and _listening(relay_port)
    assert connect.dashboard_link == relay + "/status" and not connect.http_address
    assert relay_port != int(relay_to.rsplit(":", 1)[1])
    # whoever else on this machine connects to the forwarded port meets mutual TLS
    from jupyter_cloudtik.runtime.tls import make_cluster_tls

    assert _relay_knocks("127.0.0.1", relay_port, connect.credentials,
                         make_cluster_tls("tun")) == {
        "plain": "refused", "tls-no-cert": "refused", "tls-other-ca": "refused",
        "ours": "200"}
    # the worker jobs dial the scheduler job itself, not this process's end of the tunnel:
    # they read the address from the scheduler job's own file (Dask's, beside the relay's)
    (worker,) = workers_of(slurm, "tun")
    script = slurm.run("scontrol", "write", "batch_script", worker["id"], "-").stdout
    sched_file = script.split("dask_worker --scheduler-file ", 1)[1].split(" ", 1)[0]
    assert sched_file.endswith(f"/scheduler-{connect.extra['slurm_job_id']}.dask.json"), \
        script
    with open(sched_file) as f:
        assert json.load(f)["address"] == remote

    def through_sshd(port: int) -> bool:
        """Does an sshd process hold a connection to the scheduler's own port?"""
        for p in psutil.process_iter(["name"]):
            if p.info["name"] != "sshd":
                continue
            try:
                if any(c.raddr and c.raddr.port == port for c in p.net_connections("tcp")):
                    return True
            except psutil.Error:
                continue
        return False

    with SlurmNodeProvider.make_client(connect, timeout=10) as c:
        assert c.submit(pow, 3, 4).result(timeout=30) == 81
        assert through_sshd(int(remote.rsplit(":", 1)[1]))

    # the SSH connection drops: the next connect info forwards a new port
    (tunnel,) = [t for k, t in slurm_tunnel._TUNNELS.items()
                 if k[2] == "tun" and k[3] == remote.split("://")[1]]
    tunnel.shell._drop()
    wait_for(lambda: not tunnel.alive(), 5, what="the dropped connection")
    _, again = manager.connect_info("tun")
    new_local = int(again.scheduler_address.rsplit(":", 1)[1])
    assert new_local != local and _listening(new_local)
    with SlurmNodeProvider.make_client(again, timeout=10) as c:
        assert c.submit(pow, 2, 5).result(timeout=30) == 32
    assert run(manager.status("tun")).state == "running"  # the manager asks through it too

    # a new process (a restarted kernel) finds the cluster and opens its own tunnel
    seen = _in_another_process(state_dir, "tun", (
        "from jupyter_cloudtik.providers.slurm import SlurmNodeProvider\n"
        "_, info = m.connect_info('tun')\n"
        "with SlurmNodeProvider.make_client(info, timeout=10) as c:\n"
        "    r = c.submit(lambda x: x * 7, 6).result(timeout=30)\n"
        "print(json.dumps({'state': st.state, 'address': info.scheduler_address,"
        " 'result': r}))\n"))
    assert seen["state"] == "running" and seen["result"] == 42
    assert seen["address"].startswith("tls://127.0.0.1:") and seen["address"] not in (
        connect.scheduler_address, again.scheduler_address)

    _dashboard_through_the_server(manager, tmp_path, connect, "tun")

    run(manager.down("tun"))
    assert ours(slurm, "tun") == []
    assert not [k for k in slurm_tunnel._TUNNELS if k[2] == "tun"]
    assert not _listening(new_local)
    wait_for(lambda: not dask_processes(state_dir), 15, what="no dask process")


def _dashboard_through_the_server(manager, tmp_path, connect, name: str) -> None:
    """A real Jupyter server on the test's state folder (another process: through an SSH
    tunnel it opens its own) serves cluster ``name``'s dashboard — through the relay with
    the cluster's client certificate, or a login scheduler's on this loopback; hostile
    names are 404, and so is another hub user's view."""
    import requests

    from jupyter_cloudtik.api.dashboard import verified_target
    from jupyter_cloudtik.core.errors import NotFoundError
    from jupyter_cloudtik.hub.catalog import Caller
    from jupyter_cloudtik.hub.views import ClustersView
    from tests.server.conftest import _start_server

    relay = connect.extra.get("dashboard_tls_address")
    dash_port = int((relay or connect.http_address).rsplit(":", 1)[1])
    tunnelled = bool(connect.extra.get("tunnel"))
    server = _start_server(tmp_path, "server", [
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"], {})
    try:
        base = f"{server.url}cloudtik/dashboard/{name}/"
        # the panel's link is the server's route
        assert server.get(f"clusters/{name}").json()["dashboard_link"] == \
            f"/cloudtik/dashboard/{name}/status"
        page = requests.get(base + "status", headers=server.headers(), timeout=60)
        assert page.status_code == 200, (page.text[:500], server.log_text()[-3000:])
        assert "bokeh" in page.text.lower() and "Dask" in page.text
        ident = requests.get(base + "json/identity.json", headers=server.headers(),
                             timeout=60).json()
        assert ident["type"] == "Scheduler"
        assert ident["address"] == connect.extra.get("remote_scheduler_address",
                                                     connect.scheduler_address)
        assert "Traceback" not in server.log_text()
        if tunnelled:  # through a port the server forwarded over its own SSH connection
            server_port = int(server.url.rsplit(":", 1)[1].strip("/"))
            forwarded = {c.laddr.port for c in psutil.Process(server.proc.pid)
                         .net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            forwarded -= {server_port}
            assert forwarded and dash_port not in forwarded, forwarded
        for path in ("nope/status", "127.0.0.1:22/status", "..%2F..%2Fapi/status",
                     f"{name}%2F..%2F..%2Fapi/status", f"127.0.0.1:{dash_port}/status"):
            r = requests.get(f"{server.url}cloudtik/dashboard/{path}",
                             headers=server.headers(), timeout=30)
            assert r.status_code == 404, (path, r.status_code, r.text[:200])
            assert "bokeh" not in r.text.lower()
        anon = requests.get(base + "status", allow_redirects=False, timeout=30)
        assert anon.status_code in (302, 403) and "bokeh" not in anon.text.lower()
    finally:  # the cluster stays for the test's own `down`
        import signal

        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(30)

    # under the hub sidekick, another user's view: a 404 before any connection
    class Hub:
        pass

    hub = Hub()
    hub.manager = manager
    owner = manager.get(name).owner
    with pytest.raises(NotFoundError):
        run(verified_target(ClustersView(hub, Caller(name=f"{owner}-other")), name))
    target = run(verified_target(ClustersView(hub, Caller(name=owner)), name))
    assert target[0] == "127.0.0.1" and (target.ssl is not None) == bool(relay)


def test_tls_unless_everything_is_on_this_loopback(slurm, slurm_cfg, manager):
    """The default: plain TCP only when the login node and every node are this machine's
    loopback (the test Slurm); a login node elsewhere, or a login scheduler bound to all
    addresses (workers on compute nodes dial it), means TLS; ``tls:`` overrides."""
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider

    def tls(**change) -> bool:
        return SlurmNodeProvider({**slurm_cfg, **change}, "rule", manager.context).tls

    assert tls() is False
    assert tls(scheduler="job") is False
    assert tls(scheduler_host="0.0.0.0") is True
    assert tls(interface="eth0", scheduler="job") is True
    assert tls(host="login.hpc.example.org") is True  # decided before any connection
    assert tls(tls=True) is True and tls(scheduler_host="0.0.0.0", tls=False) is False
    # a TLS cluster's job script names the certificate files, never their content
    prov = SlurmNodeProvider({**slurm_cfg, "tls": True}, "rule", manager.context)
    script = prov.job_script("worker", {"CPU": 1}, {"scheduler_address": "tls://h:1"})
    assert "--protocol tls" in script and f"{prov.workdir}/tls/node-key.pem" in script
    assert "PRIVATE KEY" not in script


def test_ssh_keepalive_notices_a_silent_login_node(sshd, slurm, slurm_cfg, manager):
    """A login node that stops answering without closing the connection (no FIN: here
    its sshd processes of the connection are suspended) is noticed by the SSH keepalive:
    the connection closes after interval x (count + 1) seconds of silence, its tunnels
    count as gone, and the next command connects again.  The same silence on a connection
    without keepalive goes unnoticed (the control)."""
    from jupyter_cloudtik.providers.slurm import SlurmNodeProvider
    from jupyter_cloudtik.transport.shell import KEEPALIVE_COUNT_MAX, KEEPALIVE_INTERVAL, SSHShell

    # the provider's fields reach the shell; the defaults are on
    prov = SlurmNodeProvider({**slurm_cfg, "host": "127.0.0.1", "port": sshd.port,
                              "user": "root", "keepalive_interval": 0.5,
                              "keepalive_count_max": 2}, "ka", manager.context)
    assert (prov.login.shell.keepalive_interval, prov.login.shell.keepalive_count_max) \
        == (0.5, 2)
    assert (KEEPALIVE_INTERVAL, KEEPALIVE_COUNT_MAX) == (15.0, 3)

    def shell(interval: float) -> SSHShell:
        return SSHShell("127.0.0.1", user="root", port=sshd.port,
                        private_key=sshd.private_key,
                        known_hosts=str(sshd.folder / "known_hosts"),
                        keepalive_interval=interval, keepalive_count_max=2)

    kept, plain = shell(0.5), shell(0)
    try:
        assert kept.run(["true"]).rc == 0 and plain.run(["true"]).rc == 0
        conns = [kept._conn, plain._conn]
        assert conns[0]._keepalive_interval == 0.5 and not conns[1]._keepalive_interval
        tunnel = kept.forward_local_port("127.0.0.1", sshd.port)
        ports = {c.get_extra_info("sockname")[1] for c in conns}
        procs = []
        for p in psutil.process_iter(["name"]):
            try:
                if p.info["name"] == "sshd" and any(
                        c.raddr and c.raddr.port in ports for c in p.net_connections("tcp")):
                    procs.append(p)
            except psutil.Error:
                continue
        assert procs
        t0 = time.monotonic()
        for p in procs:
            p.suspend()
        try:
            wait_for(conns[0].is_closed, 10, interval=0.05, what="the keepalive to give up")
            took = time.monotonic() - t0
            assert took < 4, took  # at most 0.5 s x (2 + 1) after the last answer
            assert not tunnel.alive()
            time.sleep(max(0.0, 3.0 - took))
            assert not conns[1].is_closed()  # without keepalive: still "open" after 3 s
        finally:
            for p in procs:
                try:
                    p.resume()
                except psutil.Error:
                    pass
        print(f"keepalive noticed the silent login node after {took:.2f} s")
        assert kept.run(["echo", "back"]).stdout.strip() == "back"  # a new connection
        assert kept._conn is not conns[0]
    finally:
        kept.close()
        plain.close()


def test_a_scheduler_file_pointing_off_the_jobs_node_is_never_dialled(slurm, slurm_cfg,
                                                                     manager, tmp_path):
    """The head job writes its scheduler file itself (the user's code, in the user's job):
    an address there that is not a node Slurm gave that job — another loopback address
    standing in for a metadata service or the hub's API — is refused with a message, and
    nothing in this process connects there (a real listener counts the knocks)."""
    import http.server
    import threading
    from pathlib import Path

    from jupyter_cloudtik.providers.slurm_hosts import UntrustedAddress

    knocks: list[str] = []

    class Knock(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            knocks.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    victim = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Knock)
    threading.Thread(target=victim.serve_forever, daemon=True).start()
    vport = victim.server_address[1]
    try:
        cfg = _config("ssrf", {**slurm_cfg, "scheduler": "job"}, 0)
        info = run(manager.up(cfg))
        assert info.state == "running", info.reason
        head = next(j["id"] for j in ours(slurm, "ssrf") if "kind=head" in j["comment"])
        prov = manager.provider_for(manager.get("ssrf").config)
        good = prov.connect_info(head)  # the job's own address passes
        assert good is not None and good.scheduler_address.startswith("tcp://127.0.0.1:")
        sched = next(Path(slurm_cfg["workdir"]).glob(f"*-ssrf/scheduler-{head}.json"))
        data = json.loads(sched.read_text())
        for address, dash in ((f"tcp://127.0.0.2:{vport}", vport),
                              (f"tcp://[::ffff:127.0.0.2]:{vport}", vport),
                              (f"tcp://169.254.169.254:{vport}", None),
                              (f"tcp://metadata.invalid:{vport}", None),
                              (good.scheduler_address, "80; rm -rf /")):
            sched.write_text(json.dumps({**data, "address": address,
                                         "services": {"dashboard": dash}}))
            with pytest.raises(UntrustedAddress) as e:
                prov.connect_info(head)
            assert f"Slurm job {head}" in str(e.value)
            with pytest.raises(UntrustedAddress):
                run(manager.status("ssrf"))
        sched.write_text("[]")  # not even an object: refused, not a crash
        with pytest.raises(UntrustedAddress, match="no scheduler address"):
            prov.connect_info(head)
        sched.write_text(json.dumps(data))
        assert run(manager.status("ssrf")).state == "running"
        assert knocks == []  # nothing here knocked on the address the job named
        run(manager.down("ssrf"))
        # a job that runs nowhere now: its left-over file names nothing to connect to
        sched.parent.mkdir(parents=True, exist_ok=True)
        sched.write_text(json.dumps({**data, "address": f"tcp://127.0.0.2:{vport}"}))
        assert prov.connect_info(head) is None
        assert knocks == []
    finally:
        victim.shutdown()
