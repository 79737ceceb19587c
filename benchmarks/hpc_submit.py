"""Submit → running latency of a trivial job on a real single-node Slurm.

Ours: ``JobsClient.submit`` of a command job on the ``slurm`` backend (records the job,
renders and writes the batch script, ``sbatch``), then the job manager's own poller
noticing it runs (the time until the recorded state says ``running``).
Baseline: raw ``sbatch --parsable --wrap`` plus ``scontrol show job`` polled every 50 ms,
measured in the same run on the same Slurm, interleaved with ours.

Target: ours - baseline <= +0.5 s (median).

    python benchmarks/hpc_submit.py [--repeat 5]

Needs Debian's slurm-wlm and munge (scripts/install-system-deps.sh); the cluster runs in a
temporary folder and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def raw_latency(env: dict[str, str], workdir: str) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={workdir}",
                          f"--output={workdir}/raw-%j.out", "--wrap", "sleep 20"],
                         capture_output=True, text=True, env=env, check=True)
    job = out.stdout.strip().split(";")[0]
    while True:
        r = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                           env=env)
        if "JobState=RUNNING" in r.stdout:
            took = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > 60:
            raise RuntimeError(f"raw job {job} did not start: {r.stdout}")
        time.sleep(0.05)
    subprocess.run(["scancel", job], env=env, check=False)
    return took


def ours_latency(client) -> float:
    from jupyter_cloudtik.hpc.commands import build_spec

    t0 = time.perf_counter()
    info = client.submit(build_spec(command="sleep 20"), "slurm")
    while client.get(info.id).state != "running":
        if time.perf_counter() - t0 > 60:
            raise RuntimeError(f"job {info.id} did not start: {client.get(info.id)}")
        time.sleep(0.005)
    took = time.perf_counter() - t0
    client.cancel(info.id)
    return took


def wait_idle(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h", "--me"], capture_output=True, text=True, env=env)
        if not r.stdout.strip():
            return
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    base = tempfile.mkdtemp(prefix="cloudtik-bench-hpc-")
    os.environ["CLOUDTIK_STATE_DIR"] = os.path.join(base, "state")
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.settings import HPC

    if missing_programs():
        sys.exit(f"Slurm is not installed ({', '.join(missing_programs())}); run "
                 "scripts/install-system-deps.sh")
    cluster = SlurmCluster(os.path.join(base, "slurm"), cpus=2).start()
    env = {**os.environ, **cluster.env}
    raw_dir = os.path.join(base, "raw")
    os.makedirs(raw_dir)
    client = JobsClient(settings=CloudTik(state_dir=os.environ["CLOUDTIK_STATE_DIR"]),
                        hpc=HPC(backends={"slurm": {"type": "slurm", "env": cluster.env,
                                                    "workdir": os.path.join(base, "jobs")}}))
    try:
        # warm both paths once (imports, the first scontrol, slurmd's first launch)
        raw_latency(env, raw_dir)
        ours_latency(client)
        wait_idle(env)
        raw, ours = [], []
        for _ in range(args.repeat):
            raw.append(raw_latency(env, raw_dir))
            wait_idle(env)
            ours.append(ours_latency(client))
            wait_idle(env)
    finally:
        client.close()
        cluster.stop()
    r, o = statistics.median(raw), statistics.median(ours)
    print(f"submit -> running, median of {args.repeat} (Slurm 22.05, one node, "
          "batch_sched_delay=0)")
    print(f"  baseline  sbatch + scontrol polling : {r:.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in raw)})")
    print(f"  ours      JobsClient.submit + poller : {o:.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in ours)})")
    print(f"  difference                           : {o - r:+.3f} s  (target <= +0.5 s)")
    if o - r > 0.5:
        print("  OVER TARGET")


if __name__ == "__main__":
    main()
