"""Latency of `GET /cloudtik/api/clusters` against jupyter_server's own `GET /api/status`.

A real Jupyter server with the extension, three real (local) clusters recorded, then
2,000 requests at concurrency 50 to each endpoint in the same run (interleaved in rounds,
so both see the same machine noise).  The cluster list reads the state store only (no
provider calls), so it should cost about what the server's cheapest route costs.

Besides latency and throughput it prints the server process's CPU time per request
(user + system, measured around each round): on a machine shared with other work the
latency tail swings with the neighbours' load, the CPU a request costs the server does not.

Targets: p99(clusters) / p99(status) <= 1.2 and throughput(clusters) / throughput(status)
>= 0.9 (requests per second over the same rounds).

    .venv/bin/python benchmarks/api_latency.py [--requests 2000] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import requests

from jupyter_cloudtik.core import ports

BIN = Path(sys.executable).parent
TARGET_P99_RATIO = 1.2
TARGET_THROUGHPUT_RATIO = 0.9


def free_port() -> int:
    return ports.free_port()


def start_server(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    token = secrets.token_hex(16)
    port = free_port()
    for sub in ("state", "config", "data", "runtime", "root"):
        (tmp / sub).mkdir()
    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(tmp / "state"), "CLOUDTIK_LAUNCHER_IDLE": "2",
           "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    env.pop("CLOUDTIK_API_URL", None)
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [str(BIN / "jupyter-server"), "--no-browser", "--allow-root", "--ip=127.0.0.1",
         f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp / 'root'}", "--ServerApp.log_level=WARN"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        try:
            if requests.get(url + "api/status", headers={"Authorization": f"token {token}"},
                            timeout=1).ok:
                return proc, url, token
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start; see " + str(tmp / "server.log"))


def wait_op(url: str, headers: dict, op_id: str) -> dict:
    while True:
        op = requests.get(f"{url}cloudtik/api/operations/{op_id}", headers=headers).json()
        if op["state"] in ("succeeded", "failed", "cancelled"):
            return op
        time.sleep(0.1)


async def load(url: str, headers: dict, n: int, concurrency: int) -> list[float]:
    """n GETs with `concurrency` in flight; latency of each, in milliseconds."""
    latencies: list[float] = []
    todo = iter(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker() -> None:
            for _ in todo:
                t0 = time.perf_counter()
                async with session.get(url) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"{url}: HTTP {resp.status}")
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per endpoint")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cloudtik-bench-"))
    proc, url, token = start_server(tmp)
    headers = {"Authorization": f"token {token}"}
    try:
        names = [f"bench-{i}" for i in range(3)]
        for name in names:
            r = requests.post(url + "cloudtik/api/clusters", headers=headers,
                              json={"name": name, "workers": 1})
            r.raise_for_status()
            op = wait_op(url, headers, r.json()["operation"]["id"])
            assert op["state"] == "succeeded", op
        listed = requests.get(url + "cloudtik/api/clusters", headers=headers).json()
        assert len(listed["clusters"]) == 3

        endpoints = {"GET /cloudtik/api/clusters": url + "cloudtik/api/clusters",
                     "GET /api/status (baseline)": url + "api/status"}
        results: dict[str, list[float]] = {k: [] for k in endpoints}
        per_round = args.requests // args.rounds
        walls: dict[str, float] = dict.fromkeys(endpoints, 0.0)
        cpu: dict[str, float] = dict.fromkeys(endpoints, 0.0)
        server = psutil.Process(proc.pid)
        for target in endpoints.values():  # warm both up
            asyncio.run(load(target, headers, 200, args.concurrency))
        for rnd in range(args.rounds):
            order = list(endpoints.items())
            if rnd % 2:
                order.reverse()
            for name, target in order:
                t0, c0 = time.perf_counter(), sum(server.cpu_times()[:2])
                results[name] += asyncio.run(load(target, headers, per_round,
                                                  args.concurrency))
                walls[name] += time.perf_counter() - t0
                cpu[name] += sum(server.cpu_times()[:2]) - c0

        print(f"{args.requests} requests per endpoint, concurrency {args.concurrency}, "
              f"3 clusters recorded, {os.cpu_count()} CPUs (shared)\n")
        print(f"{'endpoint':32} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
              f"{'server CPU ms/req':>18}")
        for name, lat in results.items():
            print(f"{name:32} {pct(lat, 50):8.1f} {pct(lat, 99):8.1f} "
                  f"{len(lat) / walls[name]:8.0f} {1000 * cpu[name] / len(lat):18.2f}")
        ours, base = results.values()
        ratio99 = pct(ours, 99) / pct(base, 99)
        ratio50 = pct(ours, 50) / pct(base, 50)
        rps_ours, rps_base = (len(lat) / walls[name] for name, lat in results.items())
        ratio_rps = rps_ours / rps_base
        ok = ratio99 <= TARGET_P99_RATIO and ratio_rps >= TARGET_THROUGHPUT_RATIO
        ratio_cpu = (cpu[next(iter(endpoints))] / len(ours)) / (
            cpu[list(endpoints)[1]] / len(base))
        print(f"\nratio clusters/status: p50 {ratio50:.2f}, p99 {ratio99:.2f} "
              f"(target <= {TARGET_P99_RATIO}), throughput {rps_ours:.0f}/{rps_base:.0f} "
              f"req/s = {ratio_rps:.2f} (target >= {TARGET_THROUGHPUT_RATIO}): "
              f"{'OK' if ok else 'ABOVE TARGET'}; server CPU per request {ratio_cpu:.2f}")
        return 0 if ok else 1
    finally:
        for name in ("bench-0", "bench-1", "bench-2"):
            r = requests.delete(url + f"cloudtik/api/clusters/{name}", headers=headers)
            if r.status_code == 202:
                wait_op(url, headers, r.json()["operation"]["id"])
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


if __name__ == "__main__":
    sys.exit(main())
