"""The session's environment on a system that never saw it: first job, reuse, by hand.

Ours: a notebook job on a backend whose jobs get the session's environment built on the
system (``environment: {packages: [toolz]}``: toolz, papermill and ipykernel with what
they require, at the session's exact versions; hpc/environment.py).  Measured from
submit to ``succeeded``:

* first: a fresh work folder — wheels made and staged, the venv built by the job;
* reuse: the next jobs, which find the environment built (median of ``--repeat``);
* by hand: the same job with ``environment.python`` naming a venv prepared by hand on the
  system beforehand (``python3 -m venv`` + ``pip install`` of the same wheels), the
  baseline a user who prepares the system himself gets (median, interleaved with reuse).

Target: reuse <= 1.1 x by hand.

    python benchmarks/hpc_env.py [--repeat 3]

Runs on the local backend with the system's /usr/bin/python3 building the venv (the same
code path as Slurm over SSH, minus the SSH transport); the folders are temporary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "cells": [{"cell_type": "code", "id": "c0", "metadata": {}, "execution_count": None,
               "outputs": [], "source": "import sys, toolz\nprint(sys.executable, "
                                        "toolz.__version__)"}],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--base-python", default="/usr/bin/python3",
                   help="the system's Python the venvs are made with")
    args = p.parse_args(argv)

    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.commands import build_spec
    from jupyter_cloudtik.hpc.settings import HPC

    with tempfile.TemporaryDirectory(prefix="hpc-env-bench-") as tmp:
        d = Path(tmp)
        (d / "state").mkdir()
        nb = d / "env.ipynb"
        nb.write_text(json.dumps(NOTEBOOK))
        built = {"type": "local", "workdir": str(d / "jobs"),
                 "environment": {"packages": ["toolz"], "base_python": args.base_python}}
        client = JobsClient(settings=CloudTik(state_dir=str(d / "state")),
                            hpc=HPC(backends={"built": built}, poll_interval=0.1,
                                    poll_interval_max=0.2))

        def run(backend: str) -> float:
            t0 = time.perf_counter()
            info = client.wait(client.submit(build_spec(str(nb)), backend).id, 600)
            took = time.perf_counter() - t0
            if info.state != "succeeded":
                raise SystemExit(f"{backend} job failed: {info.reason}\n"
                                 f"{client.logs(info.id).text[-2000:]}")
            return took

        try:
            first = run("built")
            root = d / "jobs" / ".cloudtik-envs"
            (lock,) = root.glob("*.txt")
            pip = next((root / "wheels").glob("pip-*.whl"))
            # by hand, as a user prepares a system: a venv and the same wheels, offline
            hand = d / "hand-venv"
            t0 = time.perf_counter()
            subprocess.run([args.base_python, "-m", "venv", "--without-pip", str(hand)],
                           check=True)
            subprocess.run([str(hand / "bin" / "python"), f"{pip}/pip", "install", "-q",
                            "--no-index", "--no-deps", "--disable-pip-version-check",
                            "-r", str(lock)], check=True)
            by_hand_prep = time.perf_counter() - t0
            client.close()
            backends = {"built": built,
                        "hand": {"type": "local", "workdir": str(d / "jobs-hand"),
                                 "environment": {"python": str(hand / "bin" / "python")}}}
            client = JobsClient(settings=CloudTik(state_dir=str(d / "state")),
                                hpc=HPC(backends=backends, poll_interval=0.1,
                                        poll_interval_max=0.2))
            run("hand")  # its first run compiles its bytecode, as ours did in "first"
            reuse, by_hand = [], []
            for _ in range(max(1, args.repeat)):
                reuse.append(run("built"))
                by_hand.append(run("hand"))
        finally:
            client.close()
    r, h = statistics.median(reuse), statistics.median(by_hand)
    print(f"first job (fresh environment): {first:.1f} s; venv prepared by hand: "
          f"{by_hand_prep:.1f} s")
    print(f"reuse: {', '.join(f'{x:.1f}' for x in reuse)} s; by hand: "
          f"{', '.join(f'{x:.1f}' for x in by_hand)} s")
    print(f"hpc env first {first:.1f} s, reuse ratio {r / h:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
