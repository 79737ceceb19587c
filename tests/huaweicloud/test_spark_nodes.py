"""The Spark runtime on Huawei Cloud nodes, end to end on the emulator (fast mode: the
servers run their user data as local processes, with this machine's Java and pyspark).

One cluster (a head and a worker, runtime spark) for the module: a JVM starts slowly on
two cores.  The user data starts the master on the head and a worker on the worker node,
checked against the client's pyspark at boot; ``c.spark()`` is a classic driver here that
reaches the master at the head's private address (the emulator's loopback addressing);
``down`` leaves no JVM (by pid) and nothing in the emulator.
"""

from __future__ import annotations

import time

import psutil
import pytest
from hwc_helpers import cluster_config, created_sg_rules, leftovers, workspace_config

pytestmark = [pytest.mark.slow, pytest.mark.spark]
pyspark = pytest.importorskip("pyspark")


def node_jvms(root) -> dict[int, str]:
    """{pid: main class} of live Spark JVMs of the emulated servers under ``root``."""
    out = {}
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or not cmd or "java" not in cmd[0]:
            continue
        line = " ".join(cmd)
        if str(root) in line and "org.apache.spark" in line:
            out[p.pid] = next(c for c in cmd if c.startswith("org.apache.spark"))
    return out


def test_spark_cluster_on_huaweicloud_nodes(hwc, env):
    from jupyter_cloudtik import Cluster, Workspace
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.providers.huaweicloud.userdata import render

    # the user data of a Spark node checks the client's pyspark and installs Java if absent
    script = render("worker", {"types": ["spark"], "cluster_name": "x",
                               "spark": {"version": "9.9.9",
                                         "master_url": "spark://10.0.0.1:7077"}},
                    storage={"bucket": "b"})
    assert '"pyspark": "9.9.9"' in script and "apt-get" in script
    assert "org.apache.spark.deploy.worker.Worker" in script and "8786" not in script
    both = render("head", {"types": ["dask", "spark"], "cluster_name": "x",
                           "spark": {"version": "9.9.9"}}, storage={"bucket": "b"})
    assert "distributed.cli.dask_scheduler" in both and "deploy.master.Master" in both
    # the master UI: the head's loopback only (NODE_LOOPBACK: 127.0.0.1 on a real server)
    assert 'SPARK_LOCAL_IP="${NODE_LOOPBACK:-127.0.0.1}"' in both

    backend = CoreBackend(settings=CloudTik(state_dir=str(env), start_reaper=False,
                                            operation_timeout=300))
    ws = "sparkws"
    try:
        first = hwc.ctl.last_request()
        Workspace.create(ws, config=workspace_config(hwc), progress=False, backend=backend)
        # the master port is opened to the VPC's own block only, never to 0.0.0.0/0
        rules = created_sg_rules(hwc, first)
        assert [r.get("remote_ip_prefix") for r in rules
                if r.get("port_range_min") == 7077] == ["192.168.0.0/16"]
        assert not [r for r in rules if r.get("remote_ip_prefix") == "0.0.0.0/0"]
        t0 = time.monotonic()
        c = Cluster.up(cluster_config("sparkhw", ws, workers=1), runtime="spark",
                       backend=backend, progress=False)
        up_s = time.monotonic() - t0
        jvms = node_jvms(hwc.dir)
        assert sorted(jvms.values()) == ["org.apache.spark.deploy.master.Master",
                                         "org.apache.spark.deploy.worker.Worker"], jvms
        facts = c.info.connect_info["extra"]["spark"]
        head = next(n for n in c.info.nodes if n.kind == "head")
        assert facts["master_url"] == f"spark://{head.internal_ip}:7077"
        assert facts["ui"] == "http://127.0.0.1:8080"  # the head's loopback, not its IPs
        # ...reached from outside only through the head's mutual-TLS relay (Dask's port,
        # Spark's UI by ALPN), which a Spark-only head starts too, watching the master
        assert facts["ui_tls_address"] == f"https://{head.external_ip}:8788"
        relay = [p for p in psutil.process_iter(["cmdline", "environ"])
                 if "dashboard-relay" in (p.info["cmdline"] or [])
                 and (p.info["environ"] or {}).get("CLOUDTIK_EMULATED_SERVER")
                 == head.node_id]
        assert [r.cmdline()[4:6] for r in relay] == [["8788", "spark:8080"]], relay
        assert jvms.get(int(relay[0].cmdline()[-1])) == "org.apache.spark.deploy.master.Master"
        spark = c.spark()
        try:
            t1 = time.monotonic()
            assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
            job_s = time.monotonic() - t1
            # status: Spark's own view (the master's JSON)
            view = next(n for n in c.refresh().nodes
                        if n.kind == "head").info["runtime"]["spark"]
            assert view["alive_workers"] == 1 and view["cores"] == 1, view
            assert [a["name"] for a in view["running_applications"]] == ["cloudtik-sparkhw"]
        finally:
            spark.stop()
        print(f"spark on huaweicloud: up {up_s:.1f}s, first job {job_s:.1f}s")
        c.down(progress=False)
        assert not [p for p in jvms if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert node_jvms(hwc.dir) == {}
        assert "servers" not in leftovers(hwc, ws)
        # another pyspark on the nodes than the client's: refused at boot, both named (no
        # JVM starts: the check comes first)
        bad = cluster_config("sparkbad", ws, workers=0)
        bad["runtime"] = {"types": ["spark"], "spark": {"version": "9.9.9"}}
        with pytest.raises(Exception) as refused:
            Cluster.up(bad, backend=backend, progress=False)
        assert (f"this node has pyspark {pyspark.__version__}, the client has pyspark 9.9.9"
                in str(refused.value)), refused.value
        assert node_jvms(hwc.dir) == {}
        if backend.get("sparkbad").state != "stopped":
            Cluster("sparkbad", backend).down(progress=False)
        assert "servers" not in leftovers(hwc, ws)
        Workspace.get(ws, backend=backend).delete(progress=False)
        assert leftovers(hwc, ws) == {}
    finally:
        try:  # a failure above leaves nothing running behind either
            if backend.get("sparkhw").state != "stopped":
                Cluster("sparkhw", backend).down(progress=False)
        except Exception:  # never there, or already down
            pass
        backend.runner.stop()
