"""`%cluster up --provider dask-gateway` vs raw dask-gateway, in the same run.

Both sides start a 2-worker cluster on the same real dask-gateway-server (local backend)
and run one task; the time is from the first call until that task's result:

  raw:   Gateway(...).new_cluster(); cluster.scale(2); client.wait_for_workers(2); result
  ours:  Cluster.up(config with provider dask-gateway, 2 workers); cluster.client(); result

Prints the median of each and the ratio ours/raw (target <= 1.1).  Rounds alternate so
machine noise hits both sides alike.  Usage: python benchmarks/gateway_up.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORKERS = 2


def raw_round(address: str, password: str) -> float:
    from dask_gateway import BasicAuth, Gateway

    t0 = time.perf_counter()
    gw = Gateway(address, auth=BasicAuth("bench", password))
    cluster = gw.new_cluster()
    cluster.scale(WORKERS)
    client = cluster.get_client(set_as_default=False)
    client.wait_for_workers(WORKERS)
    assert client.submit(sum, [1, 2]).result() == 3
    took = time.perf_counter() - t0
    client.close()
    cluster.shutdown()
    gw.close()
    return took


def ours_round(address: str, i: int) -> float:
    from jupyter_cloudtik.clusters.api import Cluster

    cfg = {"cluster_name": f"bench{i}",
           "provider": {"type": "dask-gateway", "address": address,
                        "auth": {"type": "basic", "username": "bench"}},
           "available_node_types": {"head": {"resources": {"CPU": 0}},
                                    "worker": {"resources": {"CPU": 1}, "max_workers": 4}},
           "head_node_type": "head"}
    t0 = time.perf_counter()
    cluster = Cluster.up(cfg, workers=WORKERS, progress=False)
    client = cluster.client(set_as_default=False)
    assert client.submit(sum, [1, 2]).result() == 3
    took = time.perf_counter() - t0
    client.close()
    cluster.down(progress=False)
    return took


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    root = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(root / "state")
    os.environ.setdefault("CLOUDTIK_LAUNCHER_IDLE", "5")
    from cloudtik_emulators.dask_gateway import GatewayServer

    server = GatewayServer(root / "gateway").start()
    os.environ["DASK_GATEWAY_PASSWORD"] = server.password
    raw, ours = [], []
    try:
        raw_round(server.address, server.password)  # warm both paths once (imports, caches)
        ours_round(server.address, 0)
        for i in range(rounds):
            raw.append(raw_round(server.address, server.password))
            ours.append(ours_round(server.address, i + 1))
            print(f"round {i + 1}: raw {raw[-1]:.2f}s  ours {ours[-1]:.2f}s", flush=True)
    finally:
        server.stop()
    r, o = statistics.median(raw), statistics.median(ours)
    print(f"\n{'':28}{'median':>10}")
    print(f"{'raw dask-gateway':28}{r:>9.2f}s")
    print(f"{'%cluster up dask-gateway':28}{o:>9.2f}s")
    print(f"ratio ours/raw: {o / r:.2f}x (target <= 1.10)")


if __name__ == "__main__":
    main()
