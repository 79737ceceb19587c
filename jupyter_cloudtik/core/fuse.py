"""FUSE mountpoints as the kernel lists them: shared by storage's mount supervisor and the
Spark runtime, which unmounts what a killed rclone left of a cluster's mounts."""

from __future__ import annotations

import os
import shutil
import subprocess


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def mount_entry(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The /proc/mounts entry whose mountpoint is ``path``, if any."""
    target = os.path.normpath(str(path))
    try:
        with open("/proc/mounts") as f:
            lines = f.readlines()
    except OSError:
        return None
    found = None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and _unescape(parts[1]) == target:
            found = {"source": _unescape(parts[0]), "mountpoint": target, "fstype": parts[2],
                     "options": parts[3] if len(parts) > 3 else ""}
    return found


def unmount_path(path: str, lazy: bool = False) -> bool:
    """Unmount a FUSE mountpoint; True when nothing is mounted there afterwards."""
    if mount_entry(path) is None:
        return True
    tool = fusermount()
    if tool:
        subprocess.run([tool, "-u", *(["-z"] if lazy else []), "--", path],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30, check=False)
    if mount_entry(path) is not None and not lazy:
        return unmount_path(path, lazy=True)
    return mount_entry(path) is None
