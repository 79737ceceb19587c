"""Run every fuzz target (or those named) for a while each; new inputs go to a scratch
folder, the committed seeds in fuzz/corpus/NAME are only read.

    python fuzz/run.py                       # each target 60 s
    python fuzz/run.py --seconds 3600 slurm  # one target for an hour
    python fuzz/run.py --keep corpus-dir     # keep what was found (one folder per target)
    python fuzz/run.py --parallel 4 --seconds 600   # four targets at a time

A failing input is written as ``crash-*`` into the artifacts folder (``--artifacts``,
default the current folder) and the target's traceback is printed; rerun it with
``python fuzz/fuzz_NAME.py crash-...``.  Exit status 1 when any target failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = sorted(p.stem[len("fuzz_"):] for p in HERE.glob("fuzz_*.py"))


def run_target(name: str, seconds: float, corpus: Path, artifacts: Path,
               runs: int | None = None) -> tuple[int, str, float]:
    """(exit status, libFuzzer's output, seconds taken) of one bounded run."""
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = HERE / "corpus" / name
    argv = [sys.executable, str(HERE / f"fuzz_{name}.py"),
            f"-max_total_time={int(seconds)}", "-timeout=10", "-rss_limit_mb=2048",
            "-print_final_stats=1", f"-artifact_prefix={artifacts}{os.sep}",
            str(corpus)]
    if runs is not None:
        argv.insert(2, f"-runs={runs}")
    if seeds.is_dir():
        argv.append(str(seeds))
    started = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=artifacts,
                       timeout=seconds + 120)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - started


def executions(log: str) -> int:
    """The number of inputs tried, from libFuzzer's final stats."""
    for line in log.splitlines():
        if line.startswith("stat::number_of_executed_units:"):
            return int(line.split(":")[-1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", choices=[[], *TARGETS], default=[],
                    help=f"targets (default: all): {', '.join(TARGETS)}")
    ap.add_argument("--seconds", type=float, default=60.0, help="per target")
    ap.add_argument("--parallel", type=int, default=1, help="targets run at a time "
                    "(libFuzzer's -fork/-jobs re-run the interpreter without the script)")
    ap.add_argument("--keep", type=Path, help="keep new corpus entries here (per target)")
    ap.add_argument("--artifacts", type=Path, default=Path.cwd())
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as scratch:
        def one(name: str) -> tuple[str, tuple[int, str, float]]:
            corpus = (args.keep or Path(scratch)) / name
            return name, run_target(name, args.seconds, corpus, args.artifacts.resolve())

        with ThreadPoolExecutor(max(args.parallel, 1)) as pool:
            for name, (rc, log, took) in pool.map(one, args.targets or TARGETS):
                print(f"{name:12} {'ok' if rc == 0 else 'FAILED':7} {executions(log):>9} "
                      f"runs in {took:.0f}s", flush=True)
                if rc != 0:
                    failed += 1
                    start = log.find("=== Uncaught Python exception")
                    print(log[start:start + 3000] if start >= 0 else log[-3000:])
                    print("\n".join(ln for ln in log.splitlines()
                                    if "Test unit written to" in ln))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
