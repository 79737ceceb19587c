"""A parameter sweep of a small notebook on a real single-node Slurm, submit → every
element finished, three ways in one run on the same Slurm:

* ours: ``Job.sweep(notebook, grid=...)`` — every element checked and recorded, one
  ``sbatch --array=0-N%LIMIT``, watched by the job manager's poller until the sweep is
  final (the time until the recorded state says so);
* by hand: the same notebook and parameters as ``sbatch --array=0-N%LIMIT`` of a script
  that runs ``python -m papermill`` for its task's parameters, polled with ``squeue -j``
  every 0.5 s until the array is gone;
* submitit: ``SlurmExecutor.map_array`` of a function running ``papermill`` on the same
  notebook, then ``job.result()`` for every element (submitit's own watching).

Also counts the scheduler calls (squeue, sacct, scontrol) our poller makes per poll tick
while the sweep runs (target: 1, whatever the number of elements).

    python benchmarks/hpc_sweep.py [--elements 100] [--max-concurrent 100] [--cpus 2]

Prints ``sweep N ratio vs sbatch X, vs submitit Y`` (target <= 1.1 each).  Needs Debian's
slurm-wlm and munge (scripts/install-system-deps.sh) and papermill; submitit is optional
(``vs submitit n/a (<reason>)`` without it).  Then the same sweep through the FirecREST
emulator and a real A-REX, one line each (``hpc_sweep_sites.py``; ``--no-sites`` skips
them); an A-REX that cannot run here prints ``arc sweep N: n/a (<why>)``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOK = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    },
    "cells": [
        {
            "cell_type": "code",
            "id": "p",
            "metadata": {"tags": ["parameters"]},
            "execution_count": None,
            "outputs": [],
            "source": "alpha = 1.0\nn = 1",
        },
        {
            "cell_type": "code",
            "id": "w",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": "result = sum(alpha * i for i in range(n))\nprint(result)",
        },
    ],
}
SCHEDULER = {"squeue", "sacct", "scontrol"}


def grid_for(n: int) -> tuple[dict[str, list], list[dict]]:
    """``n`` elements as a grid (alpha x n) and as the list of its elements."""
    alphas = list(range(1, max(1, n // 10) + 1))
    ns = list(range(1, (n + len(alphas) - 1) // len(alphas) + 1))
    elements = [{"alpha": a, "n": k} for a in alphas for k in ns][:n]
    if len(elements) != len(alphas) * len(ns):
        return {}, elements
    return {"alpha": alphas, "n": ns}, elements


def by_hand(
    env: dict[str, str], work: Path, nb: Path, elements: list[dict], limit: int
) -> tuple[float, str]:
    """sbatch --array of a papermill script plus squeue polling every 0.5 s."""
    work.mkdir(parents=True)
    (work / "params.json").write_text(json.dumps(elements))
    script = work / "array.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --output={work}/%a.log\n"
        f"cd {work}\n"
        f'P=$({sys.executable} -c "import json,sys; print(json.dumps(json.load(open('
        f"'params.json'))[int(sys.argv[1])]))\" $SLURM_ARRAY_TASK_ID)\n"
        f'echo "$P" > p$SLURM_ARRAY_TASK_ID.json\n'
        f"{sys.executable} -m papermill {nb} out$SLURM_ARRAY_TASK_ID.ipynb "
        f"-f p$SLURM_ARRAY_TASK_ID.json --no-progress-bar\n"
    )
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--array=0-{len(elements) - 1}%{limit}",
            f"--chdir={work}",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    array = r.stdout.strip().split(";")[0]
    while True:
        q = subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True, env=env)
        if q.returncode == 0 and not q.stdout.strip():
            break
        time.sleep(0.5)
    took = time.perf_counter() - t0
    done = sum((work / f"out{i}.ipynb").exists() for i in range(len(elements)))
    if done != len(elements):
        raise RuntimeError(f"by hand: {done} of {len(elements)} notebooks were executed")
    return took, array


def _run_notebook(nb: str, out: str, parameters: dict) -> str:
    import papermill

    papermill.execute_notebook(nb, out, parameters=parameters, progress_bar=False)
    return out


def with_submitit(
    work: Path, nb: Path, elements: list[dict], limit: int
) -> tuple[float, str] | str:
    try:
        import submitit
    except ImportError as e:
        return f"n/a (submitit is not installed: {e})"
    work.mkdir(parents=True)
    executor = submitit.SlurmExecutor(folder=str(work / "%j"))
    executor.update_parameters(array_parallelism=limit, time=10, cpus_per_task=1)
    t0 = time.perf_counter()
    jobs = executor.map_array(
        _run_notebook,
        [str(nb)] * len(elements),
        [str(work / f"out{i}.ipynb") for i in range(len(elements))],
        elements,
    )
    failed = []
    for i, j in enumerate(jobs):
        try:
            j.result()
        except Exception as e:  # an element failed: no figure (say which and why)
            lines = [ln for ln in str(e).splitlines() if ln.strip() and "Error" in ln]
            failed.append(f"element {i}: {lines[-1].strip() if lines else type(e).__name__}")
    if failed:
        return f"n/a ({len(failed)} of {len(jobs)} elements failed; {failed[0]})"
    return time.perf_counter() - t0, str(jobs[0].job_id).split("_")[0]


def ours(
    client,
    nb: Path,
    grid: dict,
    elements: list[dict],
    limit: int,
) -> tuple[float, str]:
    from jupyter_cloudtik.hpc.api import Job

    t0 = time.perf_counter()
    if grid:
        sweep = Job.sweep(
            str(nb), grid=grid, backend="slurm", client=client, max_concurrent=limit, time="10m"
        )
    else:
        sweep = Job.sweep(
            str(nb),
            elements=elements,
            backend="slurm",
            client=client,
            max_concurrent=limit,
            time="10m",
        )
    submitted = time.perf_counter() - t0
    info = sweep.wait()
    took = time.perf_counter() - t0
    if info.state != "succeeded":
        raise RuntimeError(f"our sweep ended {info.state}: {info.counts}")
    arrays = {e["native_id"].split("_")[0] for e in info.elements}
    print(
        f"  ours: {len(info.elements)} elements recorded and submitted as "
        f"{len(arrays)} array(s) in {submitted:.2f} s"
    )
    return took, sorted(arrays)[0]


def span(env: dict[str, str], array: str) -> str:
    """First start to last end of an array's tasks, as Slurm's accounting has them (whole
    seconds): the elements' own time, apart from submitting and watching."""
    from datetime import datetime

    r = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "Start,End", "-j", array],
        capture_output=True, text=True, env=env,
    )
    try:
        pairs = [line.split("|") for line in r.stdout.split()]
        starts = [datetime.fromisoformat(a).timestamp() for a, _ in pairs]
        ends = [datetime.fromisoformat(b).timestamp() for _, b in pairs]
        return f"{max(ends) - min(starts):.0f} s"
    except (ValueError, TypeError):
        return f"n/a (sacct answered {r.stdout[:80]!r} {r.stderr[:80]!r})"


def instrument(client, calls: collections.Counter, ticks: list[int]) -> None:
    """Count scheduler commands of the backend, and how many each poll made (counted in
    the poll's own thread, so a poll in flight while ``calls`` is cleared counts right)."""
    import threading

    be = client.manager.registry.get("slurm")
    shell = be.shell
    run, poll = shell.run, be.poll
    local = threading.local()

    def counted_run(argv, *a, **kw):
        if argv and argv[0] in SCHEDULER:
            calls[argv[0]] += 1
            if getattr(local, "n", None) is not None:
                local.n += 1
        return run(argv, *a, **kw)

    def counted_poll(jobs):
        local.n = 0
        try:
            return poll(jobs)
        finally:
            ticks.append(local.n)
            local.n = None

    shell.run = counted_run
    be.poll = counted_poll


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=100)
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=100,
        help="the array's %%LIMIT, the same for all three",
    )
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the Slurm node")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of each way, in alternating order (by hand, ours, submitit; then the "
        "reverse): the machine's load drifts, and the mean over both orders cancels a "
        "steady drift",
    )
    parser.add_argument(
        "--no-sites",
        dest="sites",
        action="store_false",
        help="skip the same sweep through FirecREST and a real A-REX (hpc_sweep_sites.py)",
    )
    args = parser.parse_args()
    grid, elements = grid_for(args.elements)

    base = Path(tempfile.mkdtemp(prefix="cloudtik-bench-sweep-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(base / "state")
    os.chdir(base)  # the jobs' provenance crates go to ./hpc-jobs/<job id>/
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.settings import HPC

    if missing_programs(accounting=True):
        sys.exit(
            f"Slurm is not installed ({', '.join(missing_programs(accounting=True))}); "
            "run scripts/install-system-deps.sh"
        )
    nb = base / "small.ipynb"
    nb.write_text(json.dumps(NOTEBOOK))
    cluster = SlurmCluster(base / "slurm", cpus=args.cpus, accounting=True).start()
    os.environ.update(cluster.env)  # submitit runs sbatch/sacct itself
    env = {**os.environ, **cluster.env}
    client = JobsClient(
        settings=CloudTik(state_dir=os.environ["CLOUDTIK_STATE_DIR"]),
        hpc=HPC(
            backends={
                "slurm": {"type": "slurm", "env": cluster.env, "workdir": str(base / "jobs")}
            },
            # the admin's ceiling: a sweep may not ask for more than this
            sweep_max_concurrent=max(1, args.max_concurrent),
        ),
    )
    calls: collections.Counter = collections.Counter()
    ticks: list[int] = []
    instrument(client, calls, ticks)
    try:
        n, limit = len(elements), args.max_concurrent
        print(
            f"sweep of {n} elements of a small notebook, %{limit}, on a {args.cpus}-CPU "
            "Slurm node (slurmctld + slurmd + slurmdbd on this machine)"
        )
        # warm the paths once (imports, slurmd's first launch, papermill's kernel)
        by_hand(env, base / "warm", nb, elements[:2], limit)
        ways = {
            "by hand": lambda r: by_hand(env, base / f"hand{r}", nb, elements, limit),
            "ours": lambda r: ours(client, nb, grid, elements, limit),
            "submitit": lambda r: with_submitit(base / f"submitit{r}", nb, elements, limit),
        }
        times: dict[str, list[float]] = {k: [] for k in ways}
        skipped: dict[str, str] = {}
        calls.clear()
        ticks.clear()
        for r in range(max(1, args.rounds)):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for way in order:
                if way in skipped:
                    continue
                got = ways[way](r)
                if isinstance(got, str):  # submitit missing or failed: said once
                    skipped[way] = got
                    print(f"  {way}: {got}", flush=True)
                    continue
                took, array = got
                times[way].append(took)
                print(f"  round {r + 1}, {way}: {took:.1f} s (the array's own span, first "
                      f"start to last end in sacct: {span(env, array)})", flush=True)
        mean = {k: sum(v) / len(v) for k, v in times.items() if v}
        per_tick = collections.Counter(ticks)
        print(
            "  mean of " + ", ".join(f"{k} {v:.1f} s" for k, v in mean.items())
            + f"; ours: {len(ticks)} poll ticks, scheduler calls per tick: "
            + ", ".join(f"{k} call(s) x{v}" for k, v in sorted(per_tick.items()))
            + f" ({dict(calls)})"
        )
    finally:
        client.close()
        cluster.stop()
    t_ours, t_hand = mean["ours"], mean["by hand"]
    vs_sub = f"{t_ours / mean['submitit']:.2f}" if "submitit" in mean else skipped["submitit"]
    avg = sum(ticks) / len(ticks) if ticks else 0.0
    print(f"sweep {n} ratio vs sbatch {t_ours / t_hand:.2f}, vs submitit {vs_sub}")
    print(
        f"scheduler calls per poll tick: {avg:.2f} on average, at most "
        f"{max(ticks, default=0)} (target 1)"
    )
    if args.sites:  # the same sweep through the FirecREST and real-ARC test set-ups
        from hpc_sweep_sites import arc_line, firecrest_line

        print(firecrest_line(base / "firecrest", nb, grid, elements, limit, args.cpus),
              flush=True)
        print(arc_line(base / "arc", nb, grid, elements, limit), flush=True)


if __name__ == "__main__":
    main()
