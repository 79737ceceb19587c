"""Kill our own process in the middle of `up`, then run `up` again at once, while the
cloud's listings still lag behind the killed run's creates: it finishes the job, nothing is
duplicated (asserted on the emulator's state and request log), and `down` leaves nothing
behind.

The emulator's listing lag is raised to 5 s for the workers' create, so the second `up`
certainly lists inside it: only the create journal (providers/huaweicloud/nodes.py) can
tell it that the workers exist."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml
from hwc_helpers import cluster_config, leftovers, workspace_config

LAG = 5.0  # seconds the workers' servers stay out of listings


def _servers(hwc, cluster):
    return [s for s in hwc.ctl.state()["servers"]
            if s["tags"].get("cloudtik-cluster-name") == cluster]


def _kill_up_once_workers_exist(hwc, cfg_path, cluster):
    """Run `up` in its own process; once the head exists, make listings lag; kill the
    process as soon as the workers' batch exists at the cloud."""
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_cloudtik", "up", str(cfg_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _servers(hwc, cluster):
            assert proc.poll() is None, "up ended before it made the head"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        hwc.ctl.set_options(list_lag=LAG)  # the head was made with the usual lag
        while not any(s["tags"].get("cloudtik-node-kind") == "worker"
                      for s in _servers(hwc, cluster)):
            assert proc.poll() is None, "up ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return killed_at


def _creates(hwc, since):
    return [r for r in hwc.ctl.requests(since)
            if r.get("action") == "ecs.create_post_paid_servers"]


def _finish_and_check(hwc, core, cfg, cluster, ws, killed_at, since):
    workers = [s["id"] for s in _servers(hwc, cluster)
               if s["tags"].get("cloudtik-node-kind") == "worker"]
    assert len(workers) == 2 and len(_servers(hwc, cluster)) == 3
    info = core.run(core.clusters.up(cfg))
    assert info.state == "running" and info.running_workers == 2
    # the killed run's servers were found and kept: no third create, no duplicate worker
    servers = _servers(hwc, cluster)
    assert len(servers) == 3, servers
    assert sorted(s["id"] for s in servers
                  if s["tags"].get("cloudtik-node-kind") == "worker") == sorted(workers)
    last = core.clusters.ops.list(target=f"cluster:{cluster}")
    assert any("interrupted" in (o.reason or "") for o in last)
    # ...while the listing still lagged: the second up asked for them one by one
    asked = {r["path"].rsplit("/", 1)[-1] for r in hwc.ctl.requests(since)
             if r.get("action") == "ecs.show_server" and r.get("status") == 200}
    assert set(workers) <= asked
    return servers


def _down_and_clean(hwc, core, cluster, ws):
    core.run(core.clusters.down(cluster))
    assert _servers(hwc, cluster) == []
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_up_killed_while_waiting_is_finished_by_the_next_up(hwc, core, env, tmp_path):
    """Killed after the create was answered (its ids are in the journal)."""
    ws, cluster = "killws", "killed"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    cfg_path = tmp_path / "cluster.yaml"
    cfg = cluster_config(cluster, ws, workers=2)
    cfg_path.write_text(yaml.safe_dump(cfg))
    since = hwc.ctl.last_request()
    try:
        killed_at = _kill_up_once_workers_exist(hwc, cfg_path, cluster)
        _finish_and_check(hwc, core, cfg, cluster, ws, killed_at, since)
        creates = _creates(hwc, since)
        assert len(creates) == 2, creates  # the head's and the workers', each once
    finally:
        hwc.ctl.set_options(list_lag=0.1)
    _down_and_clean(hwc, core, cluster, ws)


def test_up_killed_with_the_create_in_flight_is_finished_by_the_next_up(
        hwc, core, env, tmp_path, faults):
    """Killed before the workers' create was answered (the cloud made them; the killed
    process never learnt their ids): the next `up` sends the journal's create again with
    its client token and the cloud answers with the same servers."""
    ws, cluster = "killws2", "inflight"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    cfg_path = tmp_path / "cluster.yaml"
    cfg = cluster_config(cluster, ws, workers=2)
    cfg_path.write_text(yaml.safe_dump(cfg))
    since = hwc.ctl.last_request()
    # the head's create answers at once; the workers' is carried out, its answer is late
    faults.inject("ecs.create_post_paid_servers", "slow_response", after=1, delay=8)
    try:
        killed_at = _kill_up_once_workers_exist(hwc, cfg_path, cluster)
        faults.clear_faults()
        _finish_and_check(hwc, core, cfg, cluster, ws, killed_at, since)
        deadline = time.monotonic() + 30  # the log has the slow call once it answered
        while len(creates := _creates(hwc, since)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        creates.sort(key=lambda r: r["ts"])  # by arrival
        tokens = [r["client_token"] for r in creates]
        # head, workers (answer never read), workers again with the same token: 0 new
        assert len(creates) == 3 and tokens[1] == tokens[2] and tokens[0] != tokens[1], \
            creates
    finally:
        hwc.ctl.set_options(list_lag=0.1)
    _down_and_clean(hwc, core, cluster, ws)


def test_journal_entries_are_sent_again_once_dropped_when_stale_or_refused(
        hwc, core, env, faults, caplog):
    """The create journal on its own, with the emulator's real answers: an entry whose
    create never reached the cloud (the process died before sending) is sent by the next
    listing and makes its server exactly once; an entry older than the token's life is
    dropped unsent; one the cloud refuses is dropped with a warning naming the refusal."""
    import base64
    import uuid

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.base import TAG_CLUSTER_NAME, TAG_NODE_KIND
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider
    from jupyter_cloudtik.providers.huaweicloud.nodes import REPLAY_WITHIN, REQUEST_KEYS

    ws, cluster = "journalws", "journal"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    faults.set_options(boot=False)
    try:
        cfg = cfgmod.build_config(cluster_config(cluster, ws))

        def provider():  # a new process's provider: it did not write the entries
            return HuaweiCloudNodeProvider(cfg["provider"], cluster, core.clusters.context)

        first = provider()
        booted = first.bootstrap_config(cfg)
        nc = {k: booted["available_node_types"]["worker"]["node_config"].get(k)
              for k in REQUEST_KEYS}
        nc["runtime"] = {"role": "worker"}
        tags = list(first._server_tags(nc, {TAG_NODE_KIND: "worker"}).items())
        user_data = base64.b64encode(b"#!/bin/sh\ntrue\n").decode()

        def entry(**change):
            token = str(uuid.uuid4())
            first._journal_add(token, {"node_config": {**nc, **change}, "tags": tags,
                                       "count": 1, "user_data": user_data})
            return token

        never_sent = entry()
        stale = entry()
        refused = entry(flavor="no.such.1")
        with first._journal().transaction() as conn:
            conn.execute("UPDATE huaweicloud_creates SET created_at = ? WHERE token = ?",
                         (time.time() - REPLAY_WITHIN - 60, stale))
        since = hwc.ctl.last_request()
        nodes = provider().non_terminated_nodes({TAG_CLUSTER_NAME: cluster})
        assert len(nodes) == 1 and [s["id"] for s in _servers(hwc, cluster)] == nodes
        creates = _creates(hwc, since)
        assert sorted(r["client_token"] for r in creates) == sorted([never_sent, refused])
        assert any("refused" in r.message and "nothing was created" in r.message
                   for r in caplog.records)
        rows = {r["token"]: r for r in first._journal().query(
            "SELECT * FROM huaweicloud_creates WHERE cluster = ?", (cluster,))}
        assert set(rows) == {never_sent}  # stale and refused dropped
        # a third process finds it by its recorded id (or listed): no create at all
        since = hwc.ctl.last_request()
        assert provider().non_terminated_nodes({TAG_CLUSTER_NAME: cluster}) == nodes
        assert len(_servers(hwc, cluster)) == 1 and not _creates(hwc, since)
        first.terminate_nodes(nodes)
        first.cleanup()
        assert not first._journal().query(
            "SELECT * FROM huaweicloud_creates WHERE cluster = ?", (cluster,))
    finally:
        faults.set_options(boot=True)
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
