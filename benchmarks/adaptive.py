"""Adaptive scaling on a bursty workload: ours against ``LocalCluster.adapt`` in one run.

Workload: ``--bursts`` bursts of ``--tasks`` tasks of ``--task-seconds`` each, separated by
``--gap`` idle seconds.  Ours: a local cluster (``Cluster.up``) adapted between 1 and N by
the same ``AdaptiveRunner`` the Jupyter server runs (here in this process, which owns the
clusters of its state folder, as the server does).  Baseline:
``distributed.LocalCluster(n_workers=1).adapt(minimum=1, maximum=N)``.  Both are measured
the same way: wall time of the workload, and worker-seconds = connected workers sampled
every 0.1 s, integrated over the workload.  Target: both ratios (ours / LocalCluster) <= 1.1.

    python benchmarks/adaptive.py [--max 2] [--bursts 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time


def work(i: int, seconds: float) -> int:
    import time as t

    t.sleep(seconds)
    return i * i


def run_workload(client, args) -> tuple[float, float]:
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(len(client.scheduler_info(n_workers=-1)["workers"]))
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    t.start()
    for b in range(args.bursts):
        futs = client.map(work, range(args.tasks), seconds=args.task_seconds, pure=False,
                          key=[f"b{b}-{i}" for i in range(args.tasks)])
        assert client.gather(futs) == [i * i for i in range(args.tasks)]
        if b < args.bursts - 1:
            time.sleep(args.gap)
    took = time.perf_counter() - t0
    stop.set()
    t.join()
    return took, sum(samples) * 0.1 * took / max(len(samples) * 0.1, 1e-9)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max", type=int, default=2)
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--tasks", type=int, default=30)
    p.add_argument("--task-seconds", type=float, default=0.2)
    p.add_argument("--gap", type=float, default=6.0)
    args = p.parse_args()

    state = tempfile.mkdtemp(prefix="cloudtik-bench-")
    os.environ["CLOUDTIK_STATE_DIR"] = state
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)
    from distributed import Client, LocalCluster

    from cloudtik_emulators.processes import stop_launcher
    from jupyter_cloudtik import Cluster
    from jupyter_cloudtik.clusters import adaptive
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik

    # baseline
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as lc:
        lc.adapt(minimum=1, maximum=args.max)
        with Client(lc) as client:
            base_t, base_ws = run_workload(client, args)

    # ours
    backend = CoreBackend(settings=CloudTik(state_dir=state))
    c = Cluster.up(workers=args.max, name="bench-adapt", progress=False, backend=backend)
    try:
        adaptive.adapt(backend.manager, c.name, 1, args.max)
        runner = adaptive.AdaptiveRunner(backend.manager)

        async def start() -> None:
            runner.start()

        backend.runner.run(start())
        deadline = time.monotonic() + 60  # idle: down to the minimum before the workload
        while backend.manager.get(c.name).wanted_workers != 1 or \
                backend.manager.get(c.name).state != "running":
            assert time.monotonic() < deadline, "did not shrink to the minimum"
            time.sleep(0.2)
        time.sleep(2)
        with c.client() as client:
            ours_t, ours_ws = run_workload(client, args)
    finally:
        c.down(progress=False)
        stop_launcher(state)

    print(f"machine: {os.cpu_count()} cores; maximum={args.max}, {args.bursts} bursts of "
          f"{args.tasks} x {args.task_seconds}s tasks, {args.gap}s gaps")
    print(f"LocalCluster.adapt : time {base_t:.2f} s, worker-seconds {base_ws:.1f}")
    print(f"ours (server-side) : time {ours_t:.2f} s, worker-seconds {ours_ws:.1f}")
    print(f"adaptive ratio time {ours_t / base_t:.2f}, worker-seconds {ours_ws / base_ws:.2f}")


if __name__ == "__main__":
    main()
