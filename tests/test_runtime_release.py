"""The local provider's ``cleanup`` lets every runtime its cluster's nodes ran release what
they leave on the machine (``Runtime.release_local``): Spark's nodes can leave a dead FUSE
mount of a storage (rclone SIGKILLed after the grace period) under the cluster's storage
root, and the provider itself names no runtime."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from jupyter_cloudtik.core.fuse import fusermount, mount_entry, unmount_path
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.providers.base import ProviderContext
from jupyter_cloudtik.providers.local import LocalNodeProvider
from jupyter_cloudtik.storage.rclone import rclone_binary


def _dead_mount(src, mp):
    """A FUSE mount whose rclone was killed: still listed, nothing answers."""
    p = subprocess.Popen([rclone_binary(), "mount", "--config", "/dev/null", str(src), str(mp)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while mount_entry(str(mp)) is None and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if mount_entry(str(mp)) is None:
        p.kill()
        pytest.skip("FUSE mounts are not possible here")
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert mount_entry(str(mp)) is not None


@pytest.mark.parametrize("runtimes,released", [(["dask", "spark"], True), (["dask"], False)])
def test_cleanup_releases_what_the_clusters_runtimes_left(settings, state_dir, tmp_path,
                                                           runtimes, released):
    if fusermount() is None:
        pytest.skip("no fusermount")
    src = tmp_path / "src"
    src.mkdir()
    mp = state_dir / "spark-storage" / "rel" / "data"
    mp.mkdir(parents=True)
    _dead_mount(src, mp)
    try:
        ctx = ProviderContext(state_dir=state_dir, store=Store(str(state_dir)), settings=settings)
        prov = LocalNodeProvider({"type": "local"}, "rel", ctx)
        now = time.time()
        with prov.store.transaction() as conn:  # what create_node recorded; the node ended
            conn.execute(
                "INSERT INTO local_nodes (node_id, cluster, tags, state, info, created_at,"
                " updated_at, terminated_at) VALUES (?, ?, '{}', 'terminated', ?, ?, ?, ?)",
                ("rel-head", "rel", json.dumps({"runtimes": runtimes}), now, now, now))
        prov.cleanup()
        assert (mount_entry(str(mp)) is None) is released
    finally:
        unmount_path(str(mp), lazy=True)
