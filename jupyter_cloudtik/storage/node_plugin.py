"""Storage credentials for nodes that get nothing private at boot: a Dask worker plugin.

Cloud nodes boot from user data, which the cloud shows to anyone who can read the server
(and the metadata service serves to any process on it), so credentials must not travel
there.  Instead the rclone configuration reaches each worker at run time over the
cluster's authenticated (mutual TLS) Dask connection: the manager registers this plugin
with the scheduler, which hands it to every worker, now and later ones.  The worker
writes it to a 0600 file on a tmpfs (``/run/cloudtik`` on our nodes, else ``/dev/shm``),
points ``RCLONE_CONFIG`` at it for the tasks, and removes it when the worker stops.  It
is never in user data, metadata, tags, the state database, logs or a command line.

This module is pickled by value (the nodes do not have jupyter_cloudtik installed): it
imports only the standard library and distributed.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from distributed.diagnostics.plugin import WorkerPlugin

PLUGIN_NAME = "cloudtik-storage"
TMPFS_CANDIDATES = ("/run/cloudtik", "/dev/shm")


def _on_tmpfs(path: str) -> bool:
    best, fstype = "", ""
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            under = path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")
            if under and len(parts[1]) >= len(best):
                best, fstype = parts[1], parts[2]
    return fstype == "tmpfs"


class RcloneConfigPlugin(WorkerPlugin):
    name = PLUGIN_NAME

    def __init__(self, content: str, storages: list[str], binary: str | None = None) -> None:
        self.content = content
        self.storages = storages
        self.binary = binary  # the manager's rclone: used where a node has the same path
        self.path: str | None = None

    def __repr__(self) -> str:  # never the content
        return f"RcloneConfigPlugin(storages={self.storages})"

    def setup(self, worker) -> None:
        folder = next((d for d in TMPFS_CANDIDATES if os.path.isdir(d) and _on_tmpfs(d)),
                      None)
        if folder is None:
            raise RuntimeError("no tmpfs (/run/cloudtik or /dev/shm) for the storage "
                               "configuration; refusing to write credentials to a disk")
        path = os.path.join(folder, f"rclone-{os.getpid()}.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.content)
        self.path = path
        os.environ["RCLONE_CONFIG"] = path
        os.environ["CLOUDTIK_STORAGES"] = ",".join(self.storages)
        binary = self.binary if self.binary and os.access(self.binary, os.X_OK) \
            else shutil.which("rclone")
        if binary:
            os.environ["CLOUDTIK_RCLONE"] = binary

    def teardown(self, worker) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
