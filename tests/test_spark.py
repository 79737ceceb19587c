"""The Spark runtime on the local provider, with real Spark processes (the JVMs of the
pyspark distribution, Debian's Java): one Spark cluster for the module (a JVM starts slowly
on 2 shared cores), its tests in the order a user meets them, the idle reaper last.

Cheap refusals (no Java, an unknown runtime, another pyspark on the nodes) start no JVM.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import doc_examples
import psutil
import pytest

from jupyter_cloudtik.core.errors import ConfigError, NodeLaunchError
from jupyter_cloudtik.core.settings import CloudTik, load_user_config

pytestmark = [pytest.mark.slow, pytest.mark.spark]
pyspark = pytest.importorskip("pyspark")
ROOT = Path(__file__).resolve().parents[1]
SUM = 10**6 * (10**6 - 1) // 2


def spark_jvms(state_dir: Path) -> dict[int, str]:
    """{pid: main class} of live Spark JVMs whose command line names ``state_dir``."""
    out = {}
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or not cmd or "java" not in cmd[0]:
            continue
        line = " ".join(cmd)
        if str(state_dir) in line and "org.apache.spark" in line:
            cls = next((c for c in cmd if c.startswith("org.apache.spark")), "?")
            out[p.pid] = cls
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(pred, timeout: float = 120.0, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """A head and two workers running Spark, in a state folder of its own."""
    from jupyter_cloudtik import Cluster
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.storage.manager import StorageManager

    state = tmp_path_factory.mktemp("spark-state")
    old = os.environ.get("CLOUDTIK_STATE_DIR")
    os.environ["CLOUDTIK_STATE_DIR"] = str(state)
    user_config = load_user_config()
    user_config.Storage.allowed_wrapping_backends = ["local"]  # a folder as a storage
    settings = CloudTik(config=user_config, state_dir=str(state))
    backend = CoreBackend(settings=settings)
    # a storage the nodes mount: a local rclone remote on a folder with one file
    data = tmp_path_factory.mktemp("spark-data")
    (data / "words.txt").write_text("".join(f"word{i % 7}\n" for i in range(700)))
    StorageManager(settings=settings, supervise=False).add(
        "sparkdata", "local", {}, source=str(data))
    config = {"cluster_name": "sparky", "idle_timeout_minutes": 60,
              "storage": {"remotes": ["sparkdata"]},
              "available_node_types": {
                  "head": {"resources": {"CPU": 0, "memory": "1GiB"}},
                  "worker": {"resources": {"CPU": 1, "memory": "2GiB"},
                             "min_workers": 2, "max_workers": 2}}}
    c = Cluster.up(config, runtime="spark", backend=backend, progress=False)
    yield c, backend, state
    from cloudtik_emulators.processes import stop_launcher

    try:
        if c.backend.get(c.name).state != "stopped":
            c.down(progress=False)
    finally:
        backend.runner.stop()
        stop_launcher(state)
        if old is None:
            os.environ.pop("CLOUDTIK_STATE_DIR", None)
        else:
            os.environ["CLOUDTIK_STATE_DIR"] = old
    assert spark_jvms(state) == {}
    # the nodes' storage mounts went with them: rclone unmounts on the SIGTERM of the
    # node's group, which a loaded machine may take some seconds to act on (a SIGKILLed
    # rclone would leave the mount for good, and this would fail)
    assert wait_for(lambda: str(state) not in Path("/proc/mounts").read_text(), 30), \
        [m for m in Path("/proc/mounts").read_text().splitlines() if str(state) in m]


def test_master_and_two_workers_with_declared_cores_and_memory(spark_cluster):
    c, _backend, state = spark_cluster
    jvms = spark_jvms(state)
    assert sorted(jvms.values()) == ["org.apache.spark.deploy.master.Master",
                                     "org.apache.spark.deploy.worker.Worker",
                                     "org.apache.spark.deploy.worker.Worker"]
    info = c.refresh()
    assert info.state == "running" and info.running_workers == 2
    head = next(n for n in info.nodes if n.kind == "head")
    view = head.info["runtime"]["spark"]  # Spark's own view: the master's JSON
    assert view["status"] == "ALIVE" and view["alive_workers"] == 2
    assert view["cores"] == 2 and view["memory_mb"] == 2 * 2048
    assert view["running_applications"] == []
    assert c.runtimes == ["spark"]
    assert c.dashboard_link == view["ui"]


def test_spark_session_computes_on_the_cluster(spark_cluster):
    c, _backend, _state = spark_cluster
    spark = c.spark()
    assert spark.sparkContext.master == c.info.connect_info["extra"]["spark"]["master_url"]
    assert spark.range(10**6).selectExpr("sum(id)").collect()[0][0] == SUM
    view = next(n for n in c.refresh().nodes if n.kind == "head").info["runtime"]["spark"]
    apps = view["running_applications"]
    assert [a["name"] for a in apps] == ["cloudtik-sparky"] and apps[0]["cores"] == 2
    assert c.client() is spark  # %cluster client: the runtime's client
    spark.stop()


def test_a_spark_job_reads_a_storage_mount_as_a_local_path(spark_cluster):
    """storage: {remotes: [sparkdata]}: the nodes mount it; executors read the file."""
    c, _backend, state = spark_cluster
    path = c.storage_path("sparkdata")
    assert path.startswith(str(state)) and os.path.ismount(path)
    mount = next(line for line in Path("/proc/mounts").read_text().splitlines()
                 if f" {path} " in line)
    assert "fuse.rclone" in mount and " ro," in mount
    spark = c.spark()
    words = spark.read.text(path + "/words.txt")
    counts = {r["value"]: r["count"] for r in words.groupBy("value").count().collect()}
    assert counts == {f"word{i}": 100 for i in range(7)}
    spark.stop()  # an application holds every free core: let the next one have them
    with pytest.raises(Exception, match="mounts no storage 'nope'"):
        c.storage_path("nope")


def test_another_process_finds_the_cluster_and_gets_a_session(spark_cluster):
    """A restarted kernel: a new process, nothing but the cluster's name."""
    _c, _backend, state = spark_cluster
    code = ("from jupyter_cloudtik import Cluster\n"
            "s = Cluster.get('sparky').spark()\n"
            "print('RESULT', s.range(1000).selectExpr('sum(id)').collect()[0][0])\n"
            "s.stop()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "CLOUDTIK_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT 499500" in r.stdout


def test_scale_to_one_worker_leaves_the_master(spark_cluster):
    c, _backend, state = spark_cluster
    c.scale(1, progress=False)
    info = c.refresh()
    assert info.running_workers == 1
    view = next(n for n in info.nodes if n.kind == "head").info["runtime"]["spark"]
    assert view["alive_workers"] == 1 and view["cores"] == 1
    assert sorted(spark_jvms(state).values()).count(
        "org.apache.spark.deploy.worker.Worker") == 1


def test_a_worker_that_dies_is_replaced_by_up(spark_cluster):
    from jupyter_cloudtik import Cluster

    c, backend, state = spark_cluster
    wanted = c.refresh().running_workers  # 1 after the scale test
    worker = next(p for p, cls in spark_jvms(state).items() if cls.endswith("Worker"))
    jvm = psutil.Process(worker)
    node = jvm.parent()  # the node's process, which ends when its JVM ends...
    assert node.cmdline()[0].startswith("cloudtik worker "), node.cmdline()
    node.suspend()  # ...but on a loaded machine not at once: `up` must not wait for it
    try:
        jvm.kill()
        assert wait_for(lambda: c.refresh().state == "degraded", 60), c.info.reason
        Cluster.up(c.info.config, backend=backend, progress=False)  # the recorded config
    finally:
        if alive(node.pid):
            node.resume()
    info = c.refresh()
    assert info.state == "running" and info.running_workers == wanted
    workers = [p for p, cls in spark_jvms(state).items() if cls.endswith("Worker")]
    assert len(workers) == wanted and worker not in workers
    assert wait_for(lambda: not alive(node.pid), 20)  # the dead worker's node is gone


def test_idle_spark_cluster_is_reaped_and_leaves_no_jvm(spark_cluster):
    """No running application for the timeout: the reaper daemon runs `down`."""
    c, backend, state = spark_cluster
    spark = c.spark()
    try:
        assert spark.range(10).count() == 10
    except BaseException:  # a timeout too: the next tests must not inherit this driver
        spark.stop()
        raise
    # the same cluster with a short idle timeout (as if configured so)
    store = backend.manager.store
    row = store.query_one("SELECT config FROM clusters WHERE name = 'sparky'")
    cfg = json.loads(row[0])
    cfg["idle_timeout_minutes"] = 0.03
    with store.transaction() as conn:
        conn.execute("UPDATE clusters SET config = ? WHERE name = 'sparky'",
                     (json.dumps(cfg),))
    time.sleep(4)  # longer than the timeout: an application runs, so it is not idle
    assert c.refresh().state == "running"
    jvms = spark_jvms(state)  # the master, the worker and the application's executor
    assert sorted(c.rsplit(".", 1)[1] for c in jvms.values()) == [
        "CoarseGrainedExecutorBackend", "Master", "Worker"]
    spark.stop()
    assert wait_for(lambda: backend.get("sparky").state == "stopped", 120)
    assert backend.get("sparky").reason.startswith("idle for ")
    assert wait_for(lambda: not any(alive(p) for p in jvms), 20)
    assert spark_jvms(state) == {}


# refusals that start no JVM ---------------------------------------------------------------
def test_unknown_runtime_lists_the_installed_ones(backend):
    from jupyter_cloudtik import Cluster

    with pytest.raises(ConfigError) as e:
        Cluster.up(runtime="ray", backend=backend, progress=False)
    assert e.value.message == ("runtime.types.0: 'ray' is not an installed runtime; "
                               "installed: dask, spark")


def test_no_java_gives_one_line_saying_what_to_install(venv_bin, state_dir):
    env = {**os.environ, "PATH": str(venv_bin)}
    env.pop("JAVA_HOME", None)
    r = subprocess.run([str(venv_bin / "jupyter-cloudtik"), "up", "--runtime", "spark"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "apt-get install openjdk-17-jre-headless" in lines[0]
    assert "Traceback" not in r.stderr


def test_other_pyspark_on_the_nodes_is_refused_at_boot(backend, state_dir):
    from jupyter_cloudtik import Cluster

    cfg = {"cluster_name": "old", "runtime": {"types": ["spark"],
                                              "spark": {"version": "3.5.1"}}}
    with pytest.raises(NodeLaunchError) as e:
        Cluster.up(cfg, workers=1, backend=backend, progress=False)
    here = pyspark.__version__
    assert re.search(rf"this node has pyspark {re.escape(here)}, the client uses pyspark "
                     r"3\.5\.1", e.value.message), e.value.message
    assert spark_jvms(state_dir) == {}


def test_readme_spark_example_runs_quietly_in_a_kernel_and_leaves_no_jvm(state_dir):
    """The README's Spark example, statement by statement, in a real IPython kernel as a
    notebook runs it: the result, and nothing of the JVMs in the notebook (their warnings,
    progress bars, executor errors at `down`: the driver's output is in the state
    folder's spark/driver-PID.log), and no Spark JVM left (issue 28.5)."""
    import ast

    from ast_parse import parse
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    example = doc_examples.block("README.md", "Spark").text
    same = doc_examples.block("docs/spark.md", "Spark clusters")  # the same example
    assert doc_examples.code(same.text) == doc_examples.code(example), same.id
    statements = [ast.get_source_segment(example, s) for s in parse(example).body]
    client = NotebookClient(new_notebook(), kernel_name="python3", timeout=300)
    jvms: dict[int, str] = {}
    shown = []
    with client.setup_kernel():
        for code in statements:
            if code.startswith("c.down()"):
                jvms = spark_jvms(state_dir)
            cell = new_code_cell(code)
            client.nb.cells.append(cell)
            client.execute_cell(cell, len(client.nb.cells) - 1)
            for out in cell.outputs:
                shown.append(out.get("text") or str((out.get("data") or {}).get(
                    "text/plain", "")))
    assert any(f"sum(id)={SUM}" in text for text in shown), shown
    noise = [t for t in shown if re.search(r"WARN|ERROR|Exception|log4j|NativeCodeLoader|"
                                           r"Setting default log level|\[Stage ", t)]
    assert not noise, noise
    logs = list((state_dir / "spark").glob("driver-*.log"))
    assert logs and any(p.stat().st_size > 0 for p in logs), logs
    assert len(jvms) >= 3  # master, two workers (and the application's executors)
    assert wait_for(lambda: not any(alive(p) for p in jvms), 20)
    assert spark_jvms(state_dir) == {}


def test_dask_and_spark_on_the_same_nodes(backend, state_dir):
    """runtime: {types: [dask, spark]}: both runtimes' workers on each node; each client."""
    from jupyter_cloudtik import Cluster

    c = Cluster.up({"cluster_name": "both"}, workers=1, runtime="dask,spark",
                   backend=backend, progress=False)
    assert c.runtimes == ["dask", "spark"]
    client = c.client()  # two runtimes: client() is Dask's, spark() is Spark's
    assert client.submit(sum, [1, 2, 3]).result() == 6
    spark = c.spark()
    assert spark.range(100).selectExpr("sum(id)").collect()[0][0] == 4950
    assert sorted(cls.rsplit(".", 1)[1] for cls in spark_jvms(state_dir).values())[:2] == [
        "CoarseGrainedExecutorBackend", "Master"]
    spark.stop()
    client.close()
    jvms = spark_jvms(state_dir)
    c.down(progress=False)
    assert wait_for(lambda: not any(alive(p) for p in jvms), 20)
    assert spark_jvms(state_dir) == {}


def test_spark_connect_server_beside_the_master(backend, state_dir):
    """runtime.spark.connect: a Spark Connect server on the head; c.spark() is a Connect
    session (its driver is the server on the head, not this process); idle while the
    server runs no job, busy while it does, and reaped when idle.

    Run after the magics tests made an IPython shell (as ``make test`` does), this also
    checks that the Connect client imports under IPython's ``__main__`` (no ``__spec__``)."""
    from jupyter_cloudtik import Cluster
    from jupyter_cloudtik.core.models import ConnectInfo
    from jupyter_cloudtik.runtime.spark import SparkRuntime

    cfg = {"cluster_name": "conn", "idle_timeout_minutes": 60,
           "runtime": {"types": ["spark"], "spark": {"connect": True}}}
    c = Cluster.up(cfg, workers=1, backend=backend, progress=False)
    jvms: dict[int, str] = {}
    try:
        spark = c.spark()
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        assert isinstance(spark, ConnectSession)
        assert spark.range(10**6).selectExpr("sum(id)").collect()[0][0] == SUM
        # idle: the server's application always runs; its jobs say whether it is busy
        info = ConnectInfo.from_dict(c.info.connect_info)
        started = c.info.connect_info["extra"]["spark"]["started_at"]
        assert asyncio.run(SparkRuntime().idle_since(info)) >= started
        slow = threading.Thread(target=lambda: spark.range(1).selectExpr(
            "reflect('java.lang.Thread', 'sleep', cast(8000 as bigint))").collect())
        slow.start()
        assert wait_for(lambda: asyncio.run(SparkRuntime().idle_since(info)) is None, 8,
                        interval=0.2)
        slow.join(60)
        assert asyncio.run(SparkRuntime().idle_since(info)) > started
        head = next(n for n in c.refresh().nodes if n.kind == "head")
        view = head.info["runtime"]["spark"]
        assert view["connect"] == c.info.connect_info["extra"]["spark"]["connect_url"]
        assert view["connect"].startswith("sc://127.0.0.1:")
        assert [a["name"] for a in view["running_applications"]] == ["Spark Connect server"]
        # the server is a JVM of the head node's: SparkSubmit beside the master
        assert sorted(cls.rsplit(".", 1)[1] for cls in spark_jvms(state_dir).values())[:2] \
            == ["CoarseGrainedExecutorBackend", "Master"]
        assert "org.apache.spark.deploy.SparkSubmit" in spark_jvms(state_dir).values()
        spark.stop()
        # the idle reaper stops it: a short timeout, as if configured so
        jvms = spark_jvms(state_dir)
        store = backend.manager.store
        row = store.query_one("SELECT config FROM clusters WHERE name = 'conn'")
        short = {**json.loads(row[0]), "idle_timeout_minutes": 0.03}
        with store.transaction() as conn:
            conn.execute("UPDATE clusters SET config = ? WHERE name = 'conn'",
                         (json.dumps(short),))
        assert wait_for(lambda: backend.get("conn").state == "stopped", 120)
        assert backend.get("conn").reason.startswith("idle for ")
    finally:
        jvms = {**spark_jvms(state_dir), **jvms}
        if backend.get("conn").state != "stopped":
            c.down(progress=False)
    assert wait_for(lambda: not any(alive(p) for p in jvms), 30)
    assert spark_jvms(state_dir) == {}

