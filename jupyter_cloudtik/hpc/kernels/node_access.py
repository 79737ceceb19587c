"""What an HPC kernel's node may ask of the user's server: copies between the session's
storages and the kernel's job folder, and a storage folder's listing.

Why a grant per kernel: the node is another machine (often shared with other users), so
it gets neither the storages' credentials nor the server's own tokens.  When the kernel
is reached, the provisioner grants it a token of its own (``grant``), writes it with the
URL into the job folder (mode 0600, the job's account) and forwards the server's port to
the node's loopback through the kernel's SSH connection (``ssh -R``); the token works for
that kernel's routes only (``hpc/kernels/{id}/node/...``) and ends with the kernel
(``revoke``).  Every path on the node is under the job's folder; every storage is decided
by the storage feature's own checks (its manager's ``location``, read-only storages).
"""

from __future__ import annotations

import asyncio
import hmac
import posixpath
import re
import secrets
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError, NotFoundError
from ...core.store import Store
from ..storage_stager import storage_stager
from .job import API_FILE, HELPER_FILE

_BAD = re.compile(r"[\x00-\x1f\\]")


@dataclass
class NodeAccess:
    kernel_id: str
    token: str
    job: Any  # job.KernelJob
    settings: Any  # CloudTik settings (the state folder: the storages)


_grants: dict[str, NodeAccess] = {}
_lock = threading.Lock()


def grant(kernel_id: str, job: Any, settings: Any) -> NodeAccess:
    access = NodeAccess(kernel_id, secrets.token_urlsafe(32), job, settings)
    with _lock:
        _grants[kernel_id] = access
    return access


def revoke(kernel_id: str) -> None:
    with _lock:
        _grants.pop(kernel_id, None)


def check(kernel_id: str, token: str | None) -> NodeAccess | None:
    """The kernel's access if ``token`` is its own, else None (for any other kernel, a
    missing one or no token alike)."""
    with _lock:
        access = _grants.get(kernel_id)
    if access is None or not token or not hmac.compare_digest(token.encode(),
                                                               access.token.encode()):
        return None
    return access


def inside(folder: str, rel: Any, field: str) -> tuple[str, str]:
    """``rel`` as a path under the job's folder: (the path, ``rel`` normalised); an
    absolute path, ``..``, a control character or nothing at all is refused."""
    if not isinstance(rel, str) or not rel.strip() or _BAD.search(rel) or rel.startswith("/") \
            or len(rel) > 1024:
        raise ConfigError(f"{field}: {rel!r} is not a path in the kernel's working folder "
                          "(relative, without '..')", field=field, value=rel)
    norm = posixpath.normpath(rel)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise ConfigError(f"{field}: {rel!r} leaves the kernel's working folder",
                          field=field, value=rel)
    if norm in (API_FILE, HELPER_FILE, "kernel.json", "kernel.sh") or norm.startswith(
            ".cloudtik"):
        raise ConfigError(f"{field}: {rel!r} is one of the kernel's own files", field=field,
                          value=rel)
    return f"{folder}/{norm}", norm


def _stager(access: NodeAccess) -> Any:
    stager = storage_stager(access.settings, Store(access.settings.state_dir))
    if stager is None:
        raise ConfigError("storage: this server offers no storages", field="storage")
    return stager


def _storage_location(stager: Any, location: Any, field: str) -> str:
    if not isinstance(location, str) or not stager.handles(location):
        raise NotFoundError(f"{field}: {location!r} is not NAME:path of a storage of this "
                            "session", field=field, value=location)
    return location


async def get(access: NodeAccess, src: Any, dest: Any) -> dict[str, Any]:
    """Storage ``NAME:path`` -> the job's folder (``dest``, default its last name)."""
    stager = _stager(access)
    src = _storage_location(stager, src, "src")
    await stager.acheck(src)
    name = dest or posixpath.basename(src.partition(":")[2].rstrip("/"))
    target, rel = inside(access.job.folder, name, "dest")
    with tempfile.TemporaryDirectory(prefix="cloudtik-node-") as tmp:
        local = Path(tmp) / "item"
        await stager.adownload(src, local, None, (0.0, 1.0))
        size = _size(local)
        await asyncio.to_thread(access.job.backend.shell.put, local, target)
    return {"src": src, "path": rel, "bytes": size}


async def put(access: NodeAccess, src: Any, dst: Any) -> dict[str, Any]:
    """A file or folder of the job's folder -> storage ``NAME:path`` (a folder there)."""
    stager = _stager(access)
    source, rel = inside(access.job.folder, src, "src")
    dst = _storage_location(stager, dst, "dst")
    await stager.acheck(dst, for_output=True)
    shell = access.job.backend.shell
    if not await asyncio.to_thread(shell.exists, source):
        raise NotFoundError(f"src: {rel!r} does not exist in the kernel's working folder",
                            field="src", value=src)
    with tempfile.TemporaryDirectory(prefix="cloudtik-node-") as tmp:
        local = Path(tmp) / posixpath.basename(rel)
        await asyncio.to_thread(shell.get, source, local)
        size = _size(local)
        await stager.aupload(local, dst, None, (0.0, 1.0))
    return {"path": rel, "dst": dst, "bytes": size}


async def ls(access: NodeAccess, path: Any) -> dict[str, Any]:
    stager = _stager(access)
    path = _storage_location(stager, path, "path")
    return await stager.manager.ls(path)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
