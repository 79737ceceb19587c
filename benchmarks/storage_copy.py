"""Copy 1 GiB between a local folder and `rclone serve s3` on loopback: our API vs rclone.

Data: many files (1024 x 512 KiB) and one large file (512 MiB), 1 GiB in all.  For each
data set and direction the same copy runs through ``StorageManager.copy`` (a recorded
operation with progress events) and as a plain ``rclone copy`` with the same binary and an
equivalent config (the baseline), in the same process.  Each pair runs in A-B-B-A order and
the faster run of each method counts, so drift in the load of the (shared) cores cancels
out.  Prints throughput both ways and the ratio ours/rclone; target >= 0.95.

    .venv/bin/python benchmarks/storage_copy.py [--scale 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traitlets.config import Config

from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.storage.manager import StorageManager
from jupyter_cloudtik.storage.rclone import clean_environment, config_file
from jupyter_cloudtik.storage.servers import start_server

MiB = 2**20


def make_data(root: Path, scale: float) -> dict[str, Path]:
    many, large = root / "many", root / "large"
    many.mkdir(parents=True)
    large.mkdir()
    block = os.urandom(512 * 1024)
    for i in range(int(1024 * scale)):
        (many / f"part-{i:05d}.bin").write_bytes(block[i % 7:] + block[:i % 7])
    with open(large / "big.bin", "wb") as f:
        chunk = os.urandom(8 * MiB)
        for _ in range(int(64 * scale)):
            f.write(chunk)
    return {"many files": many, "one large file": large}


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def direct_copy(manager: StorageManager, src: str, dst: str, name: str) -> float:
    """The baseline: `rclone copy` as a user would type it (config from a file)."""
    remote = manager.catalog.remote(name)
    info = manager.catalog.get(name)

    def fix(p: str) -> str:
        if p.startswith(f"{name}:"):
            return f"cts0:{info.source}/{p.split(':', 1)[1]}"
        return p

    with config_file(manager.run_dir, {"cts0": remote}) as conf:
        t = time.perf_counter()
        subprocess.run([manager.binary, "--config", str(conf), "copy", fix(src), fix(dst)],
                       check=True, env=clean_environment(), stdin=subprocess.DEVNULL)
        return time.perf_counter() - t


def api_copy(manager: StorageManager, src: str, dst: str) -> float:
    async def go() -> float:
        t = time.perf_counter()
        await manager.copy(src, dst)
        return time.perf_counter() - t

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="1.0 = 1 GiB in all")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cloudtik-bench-"))
    server = None
    try:
        data = make_data(work / "data", args.scale)
        server = start_server("s3", work / "s3root", workdir=work / "srv", dir_cache_time="5m")
        (work / "s3root" / "bench").mkdir()
        c = Config()
        c.Storage.working_dir = str(work)
        manager = StorageManager(settings=CloudTik(config=c, state_dir=str(work / "state")),
                                 supervise=False)
        manager.add("bench", "s3", server.storage_options(), source="bench", read_only=False)
        # the data was just written: let writeback finish and warm both ends up, untimed, so
        # the first measured copy does not pay for it
        os.sync()
        for src in data.values():
            direct_copy(manager, str(src), f"bench:warmup-{src.name}", "bench")
        os.sync()
        rows = []
        for label, src in data.items():
            nbytes = size_of(src)
            for direction in ("upload", "download"):
                times: dict[str, list[float]] = {"ours": [], "rclone": []}
                for i, who in enumerate(("ours", "rclone", "rclone", "ours")):
                    key = f"{direction}-{who}-{i}-{src.name}"
                    if direction == "upload":
                        s, d = str(src), f"bench:{key}"
                    else:
                        s, d = f"bench:upload-ours-0-{src.name}", str(work / "down" / key)
                    if who == "ours":
                        times[who].append(api_copy(manager, s, d))
                    else:
                        times[who].append(direct_copy(manager, s, d, "bench"))
                    if direction == "download":
                        assert size_of(work / "down" / key) == nbytes, key
                        shutil.rmtree(work / "down" / key)
                    elif i:
                        shutil.rmtree(work / "s3root" / "bench" / key)
                rows.append((label, direction, nbytes, min(times["ours"]),
                             min(times["rclone"])))
        print(f"\nrclone serve s3 on 127.0.0.1, {sum(size_of(p) for p in data.values()) / MiB:.0f}"
              f" MiB in all, {os.cpu_count()} cores (shared)\n")
        print(f"{'data':16} {'direction':9} {'MiB':>6} {'ours MB/s':>10} {'rclone MB/s':>12} "
              f"{'ratio':>6}")
        ratios = []
        for label, direction, nbytes, ours, base in rows:
            ratio = base / ours
            ratios.append(ratio)
            print(f"{label:16} {direction:9} {nbytes / MiB:6.0f} {nbytes / ours / 1e6:10.1f} "
                  f"{nbytes / base / 1e6:12.1f} {ratio:6.2f}")
        total_ours = sum(r[3] for r in rows)
        total_base = sum(r[4] for r in rows)
        overall = total_base / total_ours
        print(f"\noverall ratio (ours / rclone throughput): {overall:.3f}  "
              f"(min {min(ratios):.2f}; target >= 0.95: {'met' if overall >= 0.95 else 'NOT met'})")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
