"""Kill our own process in the middle of `up`, then run `up` again: it finishes the job,
nothing is duplicated, and `down` leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml
from hwc_helpers import cluster_config, leftovers, workspace_config


def _servers(hwc, cluster):
    return [s for s in hwc.ctl.state()["servers"]
            if s["tags"].get("cloudtik-cluster-name") == cluster]


def test_up_killed_midway_is_finished_by_the_next_up(hwc, core, env, tmp_path):
    ws = "killws"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    cfg_path = tmp_path / "cluster.yaml"
    cfg = cluster_config("killed", ws, workers=2)
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_cloudtik", "up", str(cfg_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        # kill it once the workers' batch exists at the cloud but before they joined
        while not any(s["tags"].get("cloudtik-node-kind") == "worker"
                      for s in _servers(hwc, "killed")):
            assert proc.poll() is None, "up ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(_servers(hwc, "killed")) == 3

    info = core.run(core.clusters.up(cfg))
    assert info.state == "running" and info.running_workers == 2
    servers = _servers(hwc, "killed")
    assert len(servers) == 3  # the servers the killed run made were found and kept
    last = core.clusters.ops.list(target="cluster:killed")
    assert any("interrupted" in (o.reason or "") for o in last)

    core.run(core.clusters.down("killed"))
    assert _servers(hwc, "killed") == []
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
