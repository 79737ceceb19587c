"""Time from "start a 2-worker cluster" to the first completed task.

Ours: ``Cluster.up(workers=2)`` on the local provider, then ``client()`` and one task.
Baseline: ``distributed.LocalCluster(n_workers=2, processes=True)`` + ``Client`` + one task,
measured in the same run, interleaved with ours so both see the same machine load.

Figures for ours:

* "warm": the local launcher daemon is already running and has loaded the dashboard's
  modules (every ``up`` after the first; the benchmark waits for that, untimed);
* "cold": no launcher yet and nothing started it: ``Cluster.up`` from Python with the
  package already imported (e.g. a script's or the CLI's first ``up``), which pays for
  starting the launcher and importing Dask there;
* "newcomer": a new user's first cell in a fresh kernel, ``%load_ext jupyter_cloudtik``
  then ``c = %cluster up --workers 2``, then a client and one task, timed together with no
  pause between the two commands (the worst case for the launcher pre-start that
  ``%load_ext`` begins in the background), against the same fresh-kernel cell with
  ``LocalCluster``.  Each run is a new interpreter with IPython's shell made before the
  clock starts (the kernel runs before the user types); no launcher runs before it.
  In JupyterLab the server extension's start pre-starts the launcher instead (the
  kernel's clusters are the server's), long before a first cell can run.

Targets: warm / base <= 1.3; newcomer / fresh base <= 1.0.

    python benchmarks/cluster_up.py [--repeat 5] [--no-fresh]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def inc(x: int) -> int:
    return x + 1


def settle(state: str) -> None:
    """Untimed: wait until a running launcher has loaded everything it loads in the
    background (the dashboard's modules, once launches pause), so that neither side's
    figure includes or competes with that work."""
    from jupyter_cloudtik.providers.local import launcher

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if not launcher.request(state, {"op": "hello"}, timeout=5)["preloading"]:
                return
        except launcher.LauncherUnavailable:
            return  # none runs
        time.sleep(0.05)


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


FRESH_CELL = r"""
import sys, time
from IPython.core.interactiveshell import InteractiveShell


def inc(x):
    return x + 1


if __name__ == "__main__":
    ip = InteractiveShell.instance()  # the running kernel, before the user's first cell
    t0 = time.perf_counter()
    if sys.argv[1] == "ours":
        ip.run_line_magic("load_ext", "jupyter_cloudtik")
        c = ip.run_line_magic("cluster", "up --workers 2 --name fresh")
        client = c.client()
        assert client.submit(inc, 1).result() == 2
        took = time.perf_counter() - t0
        client.close()
        c.down(progress=False)
    else:
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address="127.0.0.1:0") as lc, Client(lc) as client:
            assert client.submit(inc, 1).result() == 2
            took = time.perf_counter() - t0
    print("TOOK", took, flush=True)
"""


def time_fresh(script: str, which: str) -> float:
    out = subprocess.run([sys.executable, script, which], capture_output=True, text=True,
                         env={**os.environ, "CLOUDTIK_PROGRESS": "text"}, timeout=300)
    lines = [x for x in out.stdout.splitlines() if x.startswith("TOOK ")]
    if out.returncode or not lines:
        raise SystemExit(f"fresh {which} run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-fresh", action="store_true", help="skip the fresh-kernel pair")
    args = parser.parse_args()

    state = tempfile.mkdtemp(prefix="cloudtik-bench-")
    os.environ["CLOUDTIK_STATE_DIR"] = state
    os.environ["CLOUDTIK_LAUNCHER_IDLE"] = "60"
    for var in ("CLOUDTIK_API_URL", "CLOUDTIK_API_TOKEN"):  # a kernel of a server: not here
        os.environ.pop(var, None)
    script = os.path.join(state, "fresh_cell.py")
    with open(script, "w") as f:
        f.write(FRESH_CELL)
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)

    from cloudtik_emulators.processes import stop_launcher
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik

    backend = CoreBackend(settings=CloudTik(state_dir=state))
    time_localcluster()  # warm both sides' imports and page cache once, untimed
    time_ours(backend)

    warm, cold, base, fresh, fresh_base = [], [], [], [], []
    for _ in range(args.repeat):
        settle(state)
        warm.append(time_ours(backend))
        settle(state)
        base.append(time_localcluster())
        stop_launcher(state)
        cold.append(time_ours(backend))
        if not args.no_fresh:
            stop_launcher(state)
            fresh_base.append(time_fresh(script, "base"))
            fresh.append(time_fresh(script, "ours"))  # its launcher serves the next warm

    mw, mc, mb = (statistics.median(x) for x in (warm, cold, base))
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"{'':38} {'median':>8}  {'runs (s)'}")
    print(f"{'LocalCluster(n_workers=2) [base]':38} {mb:8.3f}  "
          + " ".join(f"{x:.3f}" for x in base))
    print(f"{'Cluster.up(workers=2), warm':38} {mw:8.3f}  " + " ".join(f"{x:.3f}" for x in warm))
    print(f"{'Cluster.up(workers=2), cold':38} {mc:8.3f}  " + " ".join(f"{x:.3f}" for x in cold))
    print(f"ratio warm/base: {mw / mb:.2f} (target <= 1.3)   ratio cold/base: {mc / mb:.2f}")
    if fresh:
        mf, mfb = statistics.median(fresh), statistics.median(fresh_base)
        print(f"{'fresh kernel: LocalCluster cell':38} {mfb:8.3f}  "
              + " ".join(f"{x:.3f}" for x in fresh_base))
        print(f"{'fresh kernel: %load_ext + %cluster up':38} {mf:8.3f}  "
              + " ".join(f"{x:.3f}" for x in fresh))
        print(f"ratio newcomer/fresh base: {mf / mfb:.2f} (target <= 1.0; the first up, launcher "
              "pre-started by %load_ext just before)")


if __name__ == "__main__":
    main()
