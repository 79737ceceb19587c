"""`%cluster up --provider slurm` vs dask-jobqueue's SLURMCluster, on the same Slurm.

Both sides get 2 workers as Slurm jobs (1 core, 300 MiB each, dask-jobqueue's job script)
on the same real single-node Slurm (``cloudtik_emulators.slurm``,
``batch_sched_delay=0``) and run one task; the time is from the first call until that
task's result:

  jobqueue: SLURMCluster(...); cluster.scale(2); Client(cluster); wait_for_workers(2); result
  ours:     Cluster.up({provider: {type: slurm, ...}}, workers=2); cluster.client(); result

Prints the median of each and ``slurm ratio X.XX`` (ours / dask-jobqueue, target <= 1.1).
Rounds alternate so machine noise hits both sides alike; every round ends with no job in
squeue.  Usage: python benchmarks/slurm_up.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKERS = 2
LOGS = Path(tempfile.gettempdir()) / "slurm-bench-logs"  # dask-jobqueue job output


def _queue_empty(timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "--me", "-h"], capture_output=True, text=True)
        if not r.stdout.strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"jobs left in squeue: {r.stdout}")


def jobqueue_round(partition: str) -> float:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    t0 = time.perf_counter()
    cluster = SLURMCluster(cores=1, memory="300MiB", processes=1, queue=partition,
                           walltime="00:20:00", interface="lo", python=sys.executable,
                           scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
                           log_directory=str(LOGS))
    cluster.scale(WORKERS)
    client = Client(cluster)
    client.wait_for_workers(WORKERS)
    assert client.submit(sum, [1, 2]).result() == 3
    took = time.perf_counter() - t0
    client.close()
    cluster.close()
    _queue_empty()
    return took


def ours_round(partition: str, env: dict[str, str], workdir: str, i: int) -> float:
    from jupyter_cloudtik.clusters.api import Cluster

    cfg = {"cluster_name": f"bench{i}",
           "provider": {"type": "slurm", "partition": partition, "env": env,
                        "workdir": workdir, "cores": 1, "memory": "300MiB",
                        "walltime": "00:20:00"}}
    t0 = time.perf_counter()
    cluster = Cluster.up(cfg, workers=WORKERS, progress=False)
    client = cluster.client(set_as_default=False)
    assert client.submit(sum, [1, 2]).result() == 3
    took = time.perf_counter() - t0
    client.close()
    cluster.down(progress=False)
    _queue_empty()
    return took


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    root = Path(tempfile.mkdtemp(prefix="slurm-bench-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(root / "state")
    os.environ.setdefault("CLOUDTIK_LAUNCHER_IDLE", "30")
    from cloudtik_emulators.slurm import SlurmCluster

    slurm = SlurmCluster(root / "slurm", cpus=2, memory_mb=2000, accounting=False).start()
    os.environ.update(slurm.env)  # dask-jobqueue calls sbatch with this environment
    raw, ours = [], []
    try:
        jobqueue_round(slurm.partition)  # warm both paths once (imports, caches)
        ours_round(slurm.partition, slurm.env, str(root / "jobs"), 0)
        for i in range(rounds):
            raw.append(jobqueue_round(slurm.partition))
            ours.append(ours_round(slurm.partition, slurm.env, str(root / "jobs"), i + 1))
            print(f"round {i + 1}: dask-jobqueue {raw[-1]:.2f}s  ours {ours[-1]:.2f}s",
                  flush=True)
    finally:
        slurm.stop()
    r, o = statistics.median(raw), statistics.median(ours)
    print(f"\n{'':28}{'median':>10}")
    print(f"{'dask-jobqueue SLURMCluster':28}{r:>9.2f}s")
    print(f"{'%cluster up slurm':28}{o:>9.2f}s")
    print(f"slurm ratio {o / r:.2f} (ours / dask-jobqueue, target <= 1.10)")


if __name__ == "__main__":
    main()
