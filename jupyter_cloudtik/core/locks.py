"""One daemon per state folder: a non-blocking ``flock`` on a lock file.

The reaper, the storage supervisor and the local launcher each hold such a lock for their
whole lifetime; whoever cannot take it knows another one runs.  The kernel drops the lock
when the holder dies, so a crashed daemon never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


def try_flock(path: str | Path) -> int | None:
    """The open descriptor holding an exclusive lock on ``path`` (created 0600 if missing),
    or None when another process holds it.  Other errors are raised: they are not "busy"."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd
