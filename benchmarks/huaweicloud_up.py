"""`up` and `down` of N workers on the emulated Huawei Cloud in --no-boot mode.

The emulator runs as its own process with ``--no-boot``: servers go BUILD -> ACTIVE as on
the cloud, but their user data is not run, so 1,000 workers need no 1,000 processes.
Without a running head there is no Dask scheduler to wait for, so "up" here is every
cloud call `up` makes through the provider: bootstrap (workspace look-ups, key pair,
image), list the cluster, create the head (with the cluster's TLS object and the
client's wheels staged in the workspace bucket), create N workers (at most 100 per ECS
create call), mark them up to date (TMS, 50 servers a call), list again.  "down" is what
`down` makes: list, delete the workers (up to 1,000 a call) and the head, wait for the ECS
jobs, list again, delete the cluster's objects from the bucket.  API calls are counted by
the emulator (every request it received, retries included).

"create calls" are those for the workers (the head's create is one more API call).
Prints, for each N, exactly one line:
    N=1000 up: create calls 10, API calls 37, 41.2 s; down: API calls 12, 8.3 s

Usage: python benchmarks/huaweicloud_up.py [N ...]    (default: 1 10 100 1000)
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path


def cluster_cfg(name: str, workers: int) -> dict:
    return {"cluster_name": name,
            "provider": {"type": "huaweicloud", "workspace_name": "bench"},
            "available_node_types": {
                "head": {"node_config": {"flavor": "s6.medium.2"}},
                "worker": {"node_config": {"flavor": "s6.small.1"}, "min_workers": workers,
                           "max_workers": max(workers, 1)}},
            "head_node_type": "head"}


def main(sizes: list[int]) -> dict[int, dict[str, float]]:
    root = Path(tempfile.mkdtemp(prefix="hwc-bench-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(root / "state")
    os.environ["HOME"] = str(root)
    from cloudtik_emulators.huaweicloud.process import start_emulator
    from jupyter_cloudtik.clusters.manager import ClusterManager
    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.providers.base import (
        TAG_CLUSTER_NAME,
        TAG_NODE_KIND,
        TAG_NODE_STATUS,
    )
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider
    from jupyter_cloudtik.workspaces.manager import WorkspaceManager

    (root / "emulator").mkdir()
    emu = start_emulator(root / "emulator", boot_seconds=0.3, no_boot=True)
    ctl = emu.ctl
    os.environ["HUAWEICLOUD_CREDENTIALS_FILE"] = str(root / "emulator" / "credentials")
    ctl.set_options(quotas={"instances": 5000, "cores": 20000, "ram": 50_000_000})
    settings = CloudTik(state_dir=str(root / "state"), start_reaper=False)
    cm = ClusterManager(settings=settings)
    wm = WorkspaceManager(settings=settings, store=cm.store)
    results: dict[int, dict[str, float]] = {}
    try:
        asyncio.run(wm.create("bench", {"provider": {
            "type": "huaweicloud", "region": emu.info["region"],
            "endpoint": emu.info["endpoint"], "allowed_ssh_sources": ["127.0.0.1/32"]}}))
        for n in sizes:
            name = f"bench{n}"
            cfg = cfgmod.build_config(cluster_cfg(name, n))
            prov = HuaweiCloudNodeProvider(cfg["provider"], name, cm.context)
            mark = ctl.last_request()
            t0 = time.perf_counter()
            cfg = prov.bootstrap_config(cfg)
            prov.non_terminated_nodes({TAG_CLUSTER_NAME: name})
            made = []
            for kind, count in (("head", 1), ("worker", n)):
                nc = {**cfg["available_node_types"][kind]["node_config"],
                      "runtime": {"role": kind, "cluster_name": name,
                                  "scheduler_address": "tcp://10.0.0.1:8786"}}
                made += list(prov.create_node(nc, {TAG_NODE_KIND: kind}, count))
            prov.set_nodes_tags(made, {TAG_NODE_STATUS: "up-to-date"})
            assert len(prov.non_terminated_nodes({TAG_CLUSTER_NAME: name})) == n + 1
            up_s = time.perf_counter() - t0
            up = [r for r in ctl.requests(mark) if r.get("action")]
            # create calls for the workers (the head's own create is one more API call)
            creates = sum(1 for r in up if r["action"] == "ecs.create_post_paid_servers"
                          and '"cloudtik-node-kind","value":"worker"' in r["body"]
                          .replace(" ", ""))

            mark = ctl.last_request()
            t0 = time.perf_counter()
            nodes = prov.non_terminated_nodes({TAG_CLUSTER_NAME: name})
            heads = set(prov.non_terminated_nodes({TAG_CLUSTER_NAME: name,
                                                   TAG_NODE_KIND: "head"}))
            prov.terminate_nodes([x for x in nodes if x not in heads])
            prov.terminate_nodes(sorted(heads))
            assert prov.non_terminated_nodes({TAG_CLUSTER_NAME: name}) == []
            prov.cleanup()  # as `down` does after the last node: the cluster's OBS objects
            down_s = time.perf_counter() - t0
            down = [r for r in ctl.requests(mark) if r.get("action")]
            results[n] = {"creates": creates, "up_calls": len(up), "up_s": up_s,
                          "down_calls": len(down), "down_s": down_s}
            print(f"N={n} up: create calls {creates}, API calls {len(up)}, {up_s:.1f} s; "
                  f"down: API calls {len(down)}, {down_s:.1f} s", flush=True)
            assert creates == math.ceil(n / 100), (n, creates)
        asyncio.run(wm.delete("bench"))
        left = ctl.leftovers()
        assert not left, f"left at the emulator: {left}"
    finally:
        emu.stop()
    return results


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 10, 100, 1000])
