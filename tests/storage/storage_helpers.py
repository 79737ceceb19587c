"""Helpers shared by the storage tests (importable: pytest puts this folder on sys.path)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil


def wait_for(predicate, timeout=15.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def ps_output() -> str:
    """Every process's full command line, as any user on the machine can see it."""
    return subprocess.run(["ps", "-eo", "pid,args", "ww"], capture_output=True, text=True,
                          check=True).stdout + "\n".join(
        " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def env_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""
