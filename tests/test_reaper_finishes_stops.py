"""A reaper killed in the middle of stopping an idle cluster leaves it `stopping`, its down
operation owned by a dead process.  The next reaper finishes that stop, with its reason
(found by tests/chaos/test_reaper_crashes.py in a full run; here the state is made
directly, so the case is hit every time)."""

from __future__ import annotations

import asyncio
import subprocess

from jupyter_cloudtik.clusters.reaper import Reaper
from jupyter_cloudtik.providers.local.processes import find_marked_processes


def test_a_stop_left_by_a_killed_reaper_is_finished(manager, settings):
    info = asyncio.run(manager.up({"cluster_name": "halfway", "idle_timeout_minutes": 30},
                                  workers=0))
    assert info.state == "running" and find_marked_processes(settings.state_dir)
    reason = "idle for 31.0 minutes (idle_timeout_minutes: 30)"
    op = manager.ops.start("cluster.down", "cluster:halfway", {"reason": reason},
                           user="reaper")
    dead = subprocess.Popen(["true"])
    dead.wait()
    with manager.store.transaction() as conn:  # what the killed reaper left behind
        conn.execute("UPDATE operations SET owner_pid = ? WHERE id = ?", (dead.pid, op.id))
        conn.execute("UPDATE clusters SET state = 'stopping' WHERE name = 'halfway'")

    assert asyncio.run(Reaper(manager).tick()) == ["halfway"]
    after = manager.get("halfway")
    assert (after.state, after.reason) == ("stopped", reason)
    assert not find_marked_processes(settings.state_dir)
    assert manager.ops.get(op.id).state not in ("pending", "running")  # the dead one ended
