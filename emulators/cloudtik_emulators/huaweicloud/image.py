"""A stock OS image for realistic emulated servers: a minimal Debian root, built once.

``debootstrap --variant=minbase --include=python3 SUITE`` from the Debian mirror this
machine's apt uses, so a server boots like a public cloud image: ``python3`` (the suite's,
3.11 for bookworm) and nothing else of ours — no pip, no venv/ensurepip, no Dask.  The
root is cached outside any clone (``$CLOUDTIK_IMAGE_CACHE`` or
``/var/cache/jupyter_cloudtik/images/SUITE-minbase-python3``, keyed by suite) and never
written to: each server gets a copy-on-write view of it (overlayfs, machines.py).
A cold build takes about 3 minutes here; a cached one is found at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

from jupyter_cloudtik.core import env as envnames

DEFAULT_CACHE = "/var/cache/jupyter_cloudtik/images"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get(envnames.IMAGE_CACHE) or DEFAULT_CACHE)


def apt_mirror() -> str:
    """The Debian archive this machine's apt uses (deb822 .sources or sources.list)."""
    paths = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for p in paths:
        with contextlib.suppress(OSError):
            for block in p.read_text().split("\n\n"):
                uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
                suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
                if uris and suites and "security" not in uris.group(1):
                    return uris.group(1)
    with contextlib.suppress(OSError):
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[-3] if parts[1].startswith("[") else parts[1]
    return DEFAULT_MIRROR


def image_path(suite: str = "bookworm") -> Path:
    return cache_dir() / f"{suite}-minbase-python3"


def available() -> str | None:
    if os.geteuid() != 0:
        return "the stock image needs root (debootstrap, overlayfs, chroot)"
    if not image_path().exists() and shutil.which("debootstrap") is None:
        return "the stock image needs debootstrap (scripts/install-system-deps.sh)"
    return None


def ensure_image(suite: str = "bookworm", timeout: float = 1200) -> Path:
    """The cached root of ``suite``, built now (under a lock) if it is not there yet."""
    final = image_path(suite)
    if (final / "usr" / "bin" / "python3").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it right now
        if (final / "usr" / "bin" / "python3").exists():
            return final
        tmp = final.parent / f".{suite}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        p = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", suite,
                            str(tmp), apt_mirror()], capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-15:])
            raise ImageError(f"debootstrap {suite} failed:\n{tail}")
        shutil.rmtree(tmp / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tmp.rename(final)
    return final
