"""`up` on the emulated Huawei Cloud: API calls for 1, 10, 100 workers, time for 10.

* End to end (the emulator boots every server's user data as local processes): `up` of 1
  and 10 workers through the cluster manager, counting the Huawei API requests the
  emulator received, by action, and timing `up` of 10 workers against the same `up` on
  the embedded local provider (baseline: same Dask runtime, no cloud).
* Provider level for 1, 10, 100 workers (the emulator does not boot them: 100 Dask
  workers do not fit on a small machine): bootstrap + head + workers creation calls.

Usage: python benchmarks/huaweicloud_up.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path


def counts_since(ctl, mark: int) -> Counter:
    return Counter(r["action"] for r in ctl.requests(mark) if r.get("action"))


def cluster_cfg(name: str, workers: int) -> dict:
    return {"cluster_name": name,
            "provider": {"type": "huaweicloud", "workspace_name": "bench"},
            "available_node_types": {
                "head": {"node_config": {"flavor": "s6.medium.2"}},
                "worker": {"node_config": {"flavor": "s6.small.1"}, "min_workers": workers,
                           "max_workers": max(workers, 1)}},
            "head_node_type": "head"}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="hwc-bench-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(root / "state")
    os.environ["HOME"] = str(root)
    os.environ.setdefault("CLOUDTIK_LAUNCHER_IDLE", "5")
    from jupyter_cloudtik.core.cluster_manager import ClusterManager
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.core.workspace_manager import WorkspaceManager
    from jupyter_cloudtik.testing.huaweicloud import Emulator, EmulatorControl, Options

    emu = Emulator(root / "emulator", Options(boot_seconds=0.1)).start()
    os.environ["HUAWEICLOUD_CREDENTIALS_FILE"] = str(root / "emulator" / "credentials")
    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    settings = CloudTik(state_dir=str(root / "state"), start_reaper=False)
    cm = ClusterManager(settings=settings)
    wm = WorkspaceManager(settings=settings, store=cm.store)

    async def run() -> None:
        mark = ctl.last_request()
        await wm.create("bench", {"provider": {"type": "huaweicloud", "region": "cn-north-4",
                                               "endpoint": emu.endpoint,
                                               "allowed_ssh_sources": ["127.0.0.1/32"]}})
        ws_calls = counts_since(ctl, mark)
        print(f"workspace create: {sum(ws_calls.values())} API calls")

        print("\nend to end `up` (servers boot, workers join):")
        print(f"{'workers':>8} {'API calls':>10} {'create calls':>13} {'tag calls':>10} "
              f"{'seconds':>8}")
        times = {}
        for n in (1, 10):
            mark = ctl.last_request()
            t0 = time.perf_counter()
            info = await cm.up(cluster_cfg(f"e2e{n}", n))
            took = time.perf_counter() - t0
            assert info.running_workers == n
            c = counts_since(ctl, mark)
            times[n] = took
            print(f"{n:>8} {sum(c.values()):>10} {c['ecs.create_post_paid_servers']:>13} "
                  f"{c['ecs.batch_create_server_tags']:>10} {took:>8.2f}")
            if n == 10:
                print("   by action: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
            await cm.down(f"e2e{n}")

        local = {"cluster_name": "local10", "provider": {"type": "local"},
                 "available_node_types": {"head": {"resources": {"CPU": 0}},
                                          "worker": {"resources": {"CPU": 0,
                                                                   "memory": "256MiB"},
                                                     "min_workers": 10, "max_workers": 10}},
                 "head_node_type": "head"}
        t0 = time.perf_counter()
        await cm.up(local)
        local_took = time.perf_counter() - t0
        await cm.down("local10")
        print(f"\n`up` of 10 workers: huaweicloud (emulated) {times[10]:.2f}s, local provider "
              f"{local_took:.2f}s (baseline) -> ratio {times[10] / local_took:.2f}x")

        print("\nprovider level (emulator not booting): bootstrap + head + N workers")
        ctl.set_options(boot=False)
        from jupyter_cloudtik.core import config as cfgmod
        from jupyter_cloudtik.providers.base import TAG_NODE_KIND
        from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

        print(f"{'workers':>8} {'API calls':>10} {'create calls':>13}")
        for n in (1, 10, 100):
            cfg = cfgmod.build_config(cluster_cfg(f"prov{n}", n))
            prov = HuaweiCloudNodeProvider(cfg["provider"], f"prov{n}", cm.context)
            mark = ctl.last_request()
            cfg = prov.bootstrap_config(cfg)
            for kind, count in (("head", 1), ("worker", n)):
                nc = {**cfg["available_node_types"][kind]["node_config"],
                      "runtime": {"role": kind, "cluster_name": f"prov{n}",
                                  "scheduler_address": "tcp://10.0.0.1:8786"}}
                prov.create_node(nc, {TAG_NODE_KIND: kind}, count)
            prov.non_terminated_nodes({})
            c = counts_since(ctl, mark)
            print(f"{n:>8} {sum(c.values()):>10} {c['ecs.create_post_paid_servers']:>13}")
            prov.terminate_nodes(prov.non_terminated_nodes({}))
        ctl.set_options(boot=True)
        await wm.delete("bench")
        left = ctl.leftovers()
        print(f"\nleft at the emulator after down + workspace delete: {left or 'nothing'}")

    try:
        asyncio.run(run())
    finally:
        emu.stop()


if __name__ == "__main__":
    main()
