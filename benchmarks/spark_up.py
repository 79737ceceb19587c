"""Time from "start a 2-worker Spark cluster" to the first result of a small Spark job.

Ours: ``Cluster.up(runtime="spark", workers=2)`` on the local provider, ``c.spark()`` and
``range(1000).selectExpr("sum(id)")``.  By hand: the same Spark of the pyspark
distribution started as its scripts do (``start-master.sh`` / ``start-worker.sh`` run
``spark-class org.apache.spark.deploy.master.Master|worker.Worker`` through
``spark-daemon.sh``; the pyspark wheel ships ``spark-class`` but not those two scripts), then
``SparkSession.builder.master(...)`` and the same job.  Both sides: 2 workers of 1 core and
2 GiB, measured in the same run, alternating, so both see the same machine load.

    python benchmarks/spark_up.py [--repeat 1]

Prints ``spark ratio X.XX`` (ours / by hand, medians).  Target <= 1.1.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from jupyter_cloudtik.core import ports

CONFIG = {"cluster_name": "bench-spark",
          "available_node_types": {
              "head": {"resources": {"CPU": 0, "memory": "1GiB"}},
              "worker": {"resources": {"CPU": 1, "memory": "2GiB"},
                         "min_workers": 2, "max_workers": 2}}}


def job(spark) -> None:
    assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500


def time_ours(backend) -> float:
    from jupyter_cloudtik import Cluster

    t0 = time.perf_counter()
    c = Cluster.up(CONFIG, runtime="spark", progress=False, backend=backend)
    spark = c.spark()
    job(spark)
    took = time.perf_counter() - t0
    spark.stop()
    c.down(progress=False)
    return took


def _port() -> int:
    return ports.free_port()


def time_by_hand(work: Path) -> float:
    from pyspark.sql import SparkSession

    from jupyter_cloudtik.runtime.spark import spark_home

    home = spark_home()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    cls = str(home / "bin" / "spark-class")
    port = _port()
    master = f"spark://127.0.0.1:{port}"
    logs = open(work / "by-hand.log", "ab")  # noqa: SIM115
    t0 = time.perf_counter()
    procs = [subprocess.Popen(
        [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
         str(port), "--webui-port", str(_port())], env=env, stdout=logs, stderr=logs,
        start_new_session=True)]
    for i in range(2):
        procs.append(subprocess.Popen(
            [cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--webui-port", str(_port()), "--cores", "1", "--memory", "2g",
             "--work-dir", str(work / f"w{i}"), master],
            env=env, stdout=logs, stderr=logs, start_new_session=True))
    try:
        spark = (SparkSession.builder.master(master).appName("by-hand")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        job(spark)
        took = time.perf_counter() - t0
        spark.stop()
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
        logs.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="cloudtik-bench-spark-")
    os.environ["CLOUDTIK_STATE_DIR"] = state
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik

    settings = CloudTik(state_dir=state)
    settings.start_reaper = False
    backend = CoreBackend(settings=settings)
    ours, hand = [], []
    for i in range(args.repeat):
        if i % 2 == 0:
            hand.append(time_by_hand(Path(state)))
            ours.append(time_ours(backend))
        else:
            ours.append(time_ours(backend))
            hand.append(time_by_hand(Path(state)))
        print(f"run {i + 1}: ours {ours[-1]:.2f} s, by hand {hand[-1]:.2f} s", flush=True)
    backend.runner.stop()
    o, h = statistics.median(ours), statistics.median(hand)
    print(f"ours (Cluster.up(runtime='spark') + c.spark() + job): median {o:.2f} s")
    print(f"by hand (spark-class Master/Worker + SparkSession.builder.master): "
          f"median {h:.2f} s")
    print(f"spark ratio {o / h:.2f}")


if __name__ == "__main__":
    main()
