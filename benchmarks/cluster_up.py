"""Time from "start a 2-worker cluster" to the first completed task.

Ours: ``Cluster.up(workers=2)`` on the local provider, then ``client()`` and one task.
Baseline: ``distributed.LocalCluster(n_workers=2, processes=True)`` + ``Client`` + one task,
measured in the same run, interleaved with ours so both see the same machine load.

Two figures for ours: "warm" (the local launcher daemon is already running: every ``up``
after the first in a session) and "cold" (no launcher yet: the first ``up``, which also pays
for starting the launcher and importing Dask there).  Target: warm median / baseline <= 1.3.

    python benchmarks/cluster_up.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def inc(x: int) -> int:
    return x + 1


def time_ours(backend) -> float:
    from jupyter_cloudtik import Cluster

    t0 = time.perf_counter()
    c = Cluster.up(workers=2, name="bench", progress=False, backend=backend)
    client = c.client()
    assert client.submit(inc, 1).result() == 2
    took = time.perf_counter() - t0
    client.close()
    c.down(progress=False)
    return took


def time_localcluster() -> float:
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as lc, Client(lc) as client:
        assert client.submit(inc, 1).result() == 2
        took = time.perf_counter() - t0
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    state = tempfile.mkdtemp(prefix="cloudtik-bench-")
    os.environ["CLOUDTIK_STATE_DIR"] = state
    os.environ["CLOUDTIK_LAUNCHER_IDLE"] = "60"
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)

    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.session import CoreBackend
    from jupyter_cloudtik.testing.processes import stop_launcher

    backend = CoreBackend(settings=CloudTik(state_dir=state))
    time_localcluster()  # warm both sides' imports and page cache once, untimed
    time_ours(backend)

    warm, cold, base = [], [], []
    for _ in range(args.repeat):
        warm.append(time_ours(backend))
        base.append(time_localcluster())
        stop_launcher(state)
        cold.append(time_ours(backend))
    stop_launcher(state)

    mw, mc, mb = (statistics.median(x) for x in (warm, cold, base))
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"{'':34} {'median':>8}  {'runs (s)'}")
    print(f"{'LocalCluster(n_workers=2) [base]':34} {mb:8.3f}  "
          + " ".join(f"{x:.3f}" for x in base))
    print(f"{'Cluster.up(workers=2), warm':34} {mw:8.3f}  " + " ".join(f"{x:.3f}" for x in warm))
    print(f"{'Cluster.up(workers=2), cold':34} {mc:8.3f}  " + " ".join(f"{x:.3f}" for x in cold))
    print(f"ratio warm/base: {mw / mb:.2f} (target <= 1.3)   ratio cold/base: {mc / mb:.2f}")


if __name__ == "__main__":
    main()
