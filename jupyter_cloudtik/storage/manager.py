"""StorageManager: the storage feature's API for every face (and for HPC staging).

Catalog calls (add, get, list, remove) are quick and synchronous.  Work that takes time —
copy, sync, mount, unmount — is a recorded operation (``storage.copy`` ...) with progress
events built from rclone's own stats (bytes, files, speed, ETA), cancellable from any
process.  ``test`` and ``ls`` are short commands with a timeout.

Locations are ``"NAME:path"`` for a storage (the path is relative to the storage's source)
or a local path (relative paths are taken from ``c.Storage.working_dir``); a
:class:`Location` says the same without parsing.  Other features move data with
:meth:`StorageManager.transfer`, which can report into their own operation::

    await storage.download("mydata", "inputs/run1", "/scratch/job1", ctx=job_ctx)
    await storage.upload("/scratch/job1/out", "mydata", "outputs/run1", ctx=job_ctx)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import (
    CloudTikError,
    ConfigError,
    ConflictError,
    NotFoundError,
    OperationCancelled,
    PermissionDeniedError,
)
from ..core.grants import Grant, policy_for
from ..core.identity import ActsForUser, os_user
from ..core.operations import OperationContext, OperationInfo, Operations
from ..core.paths import user_path
from ..core.runner import OperationHandle, OperationRunner
from ..core.secrets import KEY_ENV, RedactingFilter, Redactor, SecretStore, open_secret_store
from ..core.settings import CloudTik, default_settings
from ..core.store import Store
from ..core.units import format_bytes
from . import mounts as mountmod
from .catalog import ParsedURL, StorageCatalog, StorageInfo, check_name, parse_url
from .rclone import (
    Rclone,
    StorageError,
    TransferStats,
    rclone_binary,
    remove_stale_configs,
)
from .settings import Storage

log = logging.getLogger("jupyter_cloudtik.storage")

REMOTE_SRC = "cts0"
REMOTE_DST = "cts1"
MOUNT_POLL = 0.1


@dataclass(frozen=True)
class Location:
    """A place data is: a storage and a path inside its source, or a local path."""

    storage: str | None
    path: str

    @property
    def is_local(self) -> bool:
        return self.storage is None

    def __str__(self) -> str:
        return self.path if self.storage is None else f"{self.storage}:{self.path}"



class StorageManager(ActsForUser):
    """Storages, transfers and mounts of one state folder."""

    def __init__(self, settings: CloudTik | None = None, store: Store | None = None,
                 user: str | None = None, secrets: SecretStore | None = None,
                 supervise: bool = True) -> None:
        self.settings = settings or default_settings()
        self.storage_settings = Storage(parent=self.settings)
        self.store = store or Store(self.settings.state_dir)
        self.user = user or os_user()
        self.secrets = secrets or open_secret_store(self.settings, self.store)
        # events redacted with the store the storages' secrets are in (Vault or the table)
        self.ops = Operations(self.store, redact=self.secrets.live_redactor())
        self.binary = rclone_binary(self.storage_settings.rclone_path or None)
        self.catalog = StorageCatalog(self.store, self.secrets, self.storage_settings,
                                      self.binary, user=self.user)
        self.base_dir = Path(self.settings.state_dir) / "storage"
        self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.run_dir = self.base_dir / "run"
        self.cache_dir = self.base_dir / "cache"
        self.log_dir = self.base_dir / "logs"
        self.rclone = Rclone(self.binary, self.run_dir, self.redact)
        remove_stale_configs(self.run_dir)  # credentials a killed process left in plain text
        # what local paths callers may name (core.locations); a server sets its root's
        self.locations: locs.LocationPolicy = locs.InProcess(
            base=self.storage_settings.working_dir or None)
        # a transfer sees the cancel flag within 0.25 s and stops rclone itself
        self.runner = OperationRunner(self.ops, cancel_grace=10.0, redact=self.redact,
                                      what="storage operation")
        if supervise:
            self.recover()

    # secrets hygiene -------------------------------------------------------------------
    def redactor(self, names: list[str] | None = None) -> Redactor:
        """Scrubs the values of these storages' credentials out of text (the secret
        store builds it: the values never leave it)."""
        names = names if names is not None else [s.name for s in self.catalog.list()]
        try:
            return self.secrets.redactor(self.catalog.redactor_scopes(names))
        except CloudTikError:
            return Redactor()

    def grant(self, name: str, mode: str, field: str = "storage") -> Grant:
        """The access policy's decision for the acting caller (``core/grants.py``): the
        same "no storage named" for missing and not theirs; read-only ones not written."""
        return policy_for(self.store).grant(self.caller, "storage", name, mode, field=field)

    def redact(self, text: str) -> str:
        return self.redactor()(text)

    def log_filter(self) -> logging.Filter:
        """A logging filter that knows the secrets of storages added later too."""
        manager = self

        class _Live(RedactingFilter):
            def filter(self, record: logging.LogRecord) -> bool:
                self.redactor = manager.redactor()
                return super().filter(record)

        return _Live(self.redactor())

    # catalog ---------------------------------------------------------------------------
    def backends(self) -> list[dict[str, Any]]:
        """The backends users may add, with rclone's description."""
        all_ = self.catalog.backends()
        return [{"name": n, "description": all_[n].description}
                for n in self.catalog.allowed_backends()]

    def backend_schema(self, backend: str, provider: str | None = None) -> dict[str, Any]:
        return self.catalog.backend_schema(backend, provider)

    def add(self, name: str, backend: str | None = None, options: dict[str, Any] | None = None,
            *, url: str | None = None, source: str | None = None, read_only: bool = True,
            mount_path: str | None = None, vfs_cache_mode: str | None = None,
            description: str = "", replace: bool = False,
            read_only_credentials: dict[str, Any] | None = None,
            dry_run: bool = False, ask: list[str] | None = None) -> StorageInfo:
        """Record a storage.  ``url`` is a short form (s3://bucket/path, obs://bucket,
        webdav+https://host/path, sftp://user@host/path); ``options`` add to or override it.
        ``read_only_credentials``: options that can only read it, for nodes of users who
        may only read it (the hub catalogue's; None keeps what there was).

        ``dry_run=True`` checks all of it and saves nothing (the storage as it would be
        recorded); ``ask`` names the options whose values it does not have yet
        (``StorageCatalog.add``): what ``%storage add --ask`` checks before asking.
        """
        check_name(name)
        options = dict(options or {})
        if url is not None:
            parsed: ParsedURL = parse_url(url)
            if backend is not None and backend != parsed.backend:
                raise ConfigError(f"backend: {backend!r} contradicts the URL ({parsed.backend})",
                                  field="backend")
            backend = parsed.backend
            options = {**parsed.options, **options}
            if source is None:
                source = parsed.source
        if backend is None:
            raise ConfigError("backend: missing; give a backend type (s3, webdav, sftp, ...) "
                              "or a url", field="backend")
        if mount_path is not None:
            mount_path = str(self.locations.local(mount_path, "mount_path", write=True))
        if replace and self.catalog.exists(name) and self._mount_row(name):
            raise ConflictError(f"storage {name!r} is mounted; unmount it before replacing it",
                                field="name")
        return self.catalog.add(name, backend, options, source=source or "",
                                read_only=read_only, mount_path=mount_path,
                                vfs_cache_mode=vfs_cache_mode, description=description,
                                replace=replace,
                                read_only_credentials=read_only_credentials,
                                dry_run=dry_run, ask=ask)

    def get(self, name: str) -> StorageInfo:
        info = self.catalog.get(name)
        info.mount = self.mount_status(name)
        return info

    def list(self) -> list[StorageInfo]:
        out = self.catalog.list()
        for info in out:
            info.mount = self.mount_status(info.name)
        return out

    async def remove(self, name: str) -> None:
        """Unmount (if mounted) and forget a storage and its secrets."""
        self.catalog.get(name)
        if self._mount_row(name):
            await (await self.start_unmount(name)).wait()
        self.catalog.remove(name)

    # locations ---------------------------------------------------------------------------
    def location(self, where: str | Location, field: str = "location", *,
                 write: bool = False) -> Location:
        """``"NAME:path"`` of a known storage, else a local path, resolved by this
        manager's location policy (``core.locations``; a 4xx naming ``field``).  A
        :class:`Location` is taken as it is: code builds those, users type strings."""
        if isinstance(where, Location):
            if where.storage is not None:
                self.catalog.get(where.storage)
            return where
        if not isinstance(where, str) or not where:
            raise ConfigError(f"{field}: {where!r} is not a path or NAME:path", field=field)
        r = locs.resolve(where, field, self.locations, write=write,
                         is_storage=self.catalog.exists, missing=self._no_storage)
        if r.kind == "storage":
            return Location(r.storage, r.path)
        if r.kind == "local":
            return Location(None, r.text)
        raise ConfigError(f"{field}: {where!r} is a URL; add it as a storage (url=...) and "
                          "name it as NAME:path", field=field, value=where)

    def _no_storage(self, name: str, field: str) -> None:
        """The catalogue's "no storage named" (it lists the known names), for ``field``."""
        try:
            self.catalog.get(name)
        except CloudTikError as e:
            e.field = field
            raise

    def _remote_path(self, info: StorageInfo, path: str) -> str:
        if any(c in path for c in "\x00\n\r"):
            raise ConfigError("path: must be a single line", field="path")
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ConfigError(f"path: {path!r} may not contain '..'", field="path", value=path)
        rel = "/".join(parts)
        source = info.source.rstrip("/")
        if not source:
            return rel
        return f"{source}/{rel}" if rel else source

    def _local_path(self, path: str, field: str = "path") -> str:
        if "\x00" in path:
            raise ConfigError(f"{field}: contains a NUL character", field=field)
        p = user_path(path, field)
        if not p.is_absolute():
            p = Path(self.storage_settings.working_dir).expanduser() / p
        return posixpath.normpath(str(p))  # absolute: never read as a flag or a remote

    # short commands ------------------------------------------------------------------------
    async def test(self, name: str) -> dict[str, Any]:
        """Connect and list the source once; raises a StorageError saying what failed."""
        info = self.catalog.get(name)
        started = time.monotonic()
        out = await self.rclone.run(
            f"storage {name!r}", ["lsjson", "--max-depth", "1", "--retries", "1",
                                  "--low-level-retries", "1", "--contimeout", "10s",
                                  "--timeout", "20s", "--",
                                  f"{REMOTE_SRC}:{self._remote_path(info, '')}"],
            {REMOTE_SRC: self.catalog.remote(self.grant(name, "read", "name"))},
            timeout=self.storage_settings.command_timeout,
            redact=self.redactor([name]))
        entries = json.loads(out or b"[]")
        return {"name": name, "ok": True, "entries": len(entries),
                "seconds": round(time.monotonic() - started, 3)}

    async def ls(self, where: str | Location, *, offset: int = 0, limit: int = 200,
                 recursive: bool = False) -> dict[str, Any]:
        """One page of a storage folder, folders first, then files, by name."""
        loc = self.location(where)
        if loc.is_local:
            raise ConfigError(f"ls: {str(loc)!r} is not a storage path; use NAME:path",
                              field="location")
        if offset < 0 or limit <= 0:
            raise ConfigError("ls: offset must be 0 or more and limit more than 0",
                              field="limit")
        info = self.catalog.get(loc.storage)
        # an idle timeout well below the command's budget: a stalled request is retried
        # instead of eating the whole budget (rclone's default idle timeout is 5 minutes)
        args = ["lsjson", "--retries", "1", "--low-level-retries", "3", "--contimeout", "10s",
                "--timeout", "15s"]
        args += ["--recursive"] if recursive else ["--max-depth", "1"]
        out = await self.rclone.run(
            f"listing {loc}", [*args, "--", f"{REMOTE_SRC}:{self._remote_path(info, loc.path)}"],
            {REMOTE_SRC: self.catalog.remote(self.grant(loc.storage, "read", "path"))},
            timeout=self.storage_settings.command_timeout,
            redact=self.redactor([loc.storage]))
        return {"storage": loc.storage,
                **listing_page(out, loc.path, offset, limit, f"listing {loc}")}

    # transfers ---------------------------------------------------------------------------
    async def start_copy(self, src: str | Location, dst: str | Location, *,
                         mode: str = "copy") -> OperationHandle:
        """Start copying (or with ``mode="sync"`` mirroring) ``src`` into ``dst``."""
        s, d = self.location(src), self.location(dst)
        self._check_transfer(s, d, mode)
        target_name = d.storage or s.storage
        op = self.ops.start(f"storage.{mode}", f"storage:{target_name}",
                            {"src": str(s), "dst": str(d)}, user=self.user, exclusive=False)
        ctx = OperationContext(self.ops, op.id)
        return self._launch(op, self.transfer(s, d, mode=mode, ctx=ctx))

    async def copy(self, src: str | Location, dst: str | Location) -> dict[str, Any]:
        return await (await self.start_copy(src, dst)).wait()

    async def sync(self, src: str | Location, dst: str | Location) -> dict[str, Any]:
        return await (await self.start_copy(src, dst, mode="sync")).wait()

    def _check_transfer(self, s: Location, d: Location, mode: str) -> None:
        if mode not in ("copy", "sync"):
            raise ConfigError(f"mode: {mode!r} is not copy or sync", field="mode")
        if s.is_local and d.is_local:
            raise ConfigError("copy: both ends are local paths; one must be NAME:path of a "
                              "storage", field="dst")
        if d.storage is not None:
            info = self.catalog.get(d.storage)
            if info.read_only:
                raise PermissionDeniedError(
                    f"storage {info.name!r} is read-only; add it again with read_only=False "
                    "(--read-write) to write to it", field="dst", value=str(d))
        if s.is_local and not Path(self._local_path(s.path, "src")).exists():
            raise NotFoundError(f"src: local path {self._local_path(s.path)} does not exist",
                                field="src")

    def _endpoint(self, loc: Location, remote_name: str, remotes: dict[str, Any]) -> str:
        if loc.is_local:
            return self._local_path(loc.path)
        info = self.catalog.get(loc.storage)
        writes = remote_name == REMOTE_DST
        grant = self.grant(loc.storage, "write" if writes else "read",
                           "dst" if writes else "src")
        remotes[remote_name] = self.catalog.remote(grant)
        return f"{remote_name}:{self._remote_path(info, loc.path)}"

    async def transfer(
        self,
        src: str | Location,
        dst: str | Location,
        *,
        mode: str = "copy",
        ctx: OperationContext | None = None,
        fraction: tuple[float, float] = (0.0, 1.0),
        on_stats: Callable[[TransferStats], None] | None = None,
        step: str = "transfer",
    ) -> dict[str, Any]:
        """Copy or sync now, reporting into ``ctx`` (any operation, e.g. an HPC job's).

        ``fraction`` maps this transfer's progress into that operation's range.
        Cancellation of ``ctx``'s operation stops rclone.
        """
        s, d = self.location(src), self.location(dst)
        self._check_transfer(s, d, mode)
        remotes: dict[str, Any] = {}
        a = self._endpoint(s, REMOTE_SRC, remotes)
        b = self._endpoint(d, REMOTE_DST, remotes)
        if d.is_local:
            Path(b).mkdir(parents=True, exist_ok=True)
        names = [n for n in (s.storage, d.storage) if n]
        lo, hi = fraction
        last_emit = [0.0]

        def report(st: TransferStats) -> None:
            if on_stats is not None:
                on_stats(st)
            if ctx is None:
                return
            now = time.monotonic()
            if now - last_emit[0] < 0.4:
                return
            last_emit[0] = now
            frac = st.fraction
            ctx.progress(step, describe_stats(st),
                         None if frac is None else lo + (hi - lo) * frac, **st.to_dict())

        def cancelled() -> bool:
            if ctx is None:
                return False
            try:
                ctx.checkpoint()
            except OperationCancelled:
                return True
            return False

        if ctx is not None:
            ctx.progress(step, f"{mode} {s} → {d}", lo)
        started = time.monotonic()
        stats = await self.rclone.transfer(
            f"{mode} {s} → {d}",
            [mode, *self.storage_settings.transfer_options, "--", a, b], remotes, report, cancelled,
            redact=self.redactor(names))
        seconds = time.monotonic() - started
        result = {"src": str(s), "dst": str(d), "mode": mode, "seconds": round(seconds, 3),
                  **stats.to_dict(),
                  "throughput": round(stats.bytes / seconds, 1) if seconds > 0 else None}
        if ctx is not None:
            ctx.progress(step, f"{mode} done: {format_bytes(stats.bytes)} in "
                         f"{stats.files} file(s), {seconds:.1f}s", hi, **stats.to_dict())
        return result

    async def download(self, storage: str, path: str, local_dir: str | os.PathLike[str],
                       **kw: Any) -> dict[str, Any]:
        """Storage path → local folder (HPC stage-in)."""
        return await self.transfer(Location(check_name(storage, "storage"), path),
                                   Location(None, os.fspath(local_dir)), **kw)

    async def upload(self, local_dir: str | os.PathLike[str], storage: str, path: str,
                     **kw: Any) -> dict[str, Any]:
        """Local folder → storage path (HPC stage-out)."""
        return await self.transfer(Location(None, os.fspath(local_dir)),
                                   Location(check_name(storage, "storage"), path), **kw)

    # mounts ------------------------------------------------------------------------------
    def _mount_row(self, name: str):
        return self.store.query_one("SELECT * FROM storage_mounts WHERE name = ?", (name,))

    def mount_status(self, name: str) -> dict[str, Any] | None:
        row = self._mount_row(name)
        if row is None:
            return None
        out = {k: row[k] for k in ("mode", "desired", "state", "mount_path", "reason",
                                   "restarts", "mounted_at", "last_check", "pid")}
        if row["mode"] == "fuse":
            out["is_mountpoint"] = mountmod.mount_entry(row["mount_path"]) is not None
        return out

    def mounts(self) -> list[dict[str, Any]]:
        return [{"name": r["name"], **(self.mount_status(r["name"]) or {})}
                for r in self.store.query("SELECT name FROM storage_mounts ORDER BY name")]

    def fuse_problem(self) -> str | None:
        return mountmod.fuse_problem(self.storage_settings.fuse_device)

    def supervisor_settings(self) -> str:
        s = self.storage_settings
        keys = ("rclone_path", "vfs_cache_mode", "transfer_options", "dir_cache_time",
                "mount_options",
                "health_interval", "health_timeout", "mount_timeout", "fuse_device",
                "working_dir", "allowed_backends", "allowed_wrapping_backends",
                "allowed_unsafe_options")
        return json.dumps({k: getattr(s, k) for k in keys})

    def ensure_supervisor(self) -> bool:
        env = {}
        if os.environ.get(KEY_ENV):  # the daemon must read the secrets it mounts with
            env[KEY_ENV] = os.environ[KEY_ENV]
        env.update(getattr(self.secrets, "daemon_env", lambda: {})())
        return mountmod.ensure_supervisor(self.settings.state_dir, self.supervisor_settings(),
                                          env)

    def recover(self) -> bool:
        """Start the supervisor when mounts are wanted (after a restart); True if started."""
        row = self.store.query_one(
            "SELECT COUNT(*) FROM storage_mounts WHERE mode = 'fuse'")
        if not row or not row[0]:
            return False
        try:
            return self.ensure_supervisor()
        except OSError as e:  # never break a face because the daemon cannot start
            log.warning("cannot start the mount supervisor: %s", e)
            return False

    async def start_mount(self, name: str, *, mode: str = "fuse") -> OperationHandle:
        """Mount a storage at its mount path (``mode="sync"``: download a copy instead)."""
        info = self.catalog.get(name)
        if mode not in ("fuse", "sync"):
            raise ConfigError(f"mode: {mode!r} is not fuse or sync", field="mode")
        if mode == "fuse":
            problem = self.fuse_problem()
            if problem:
                raise mountmod.FuseUnavailable(
                    f"cannot mount {name!r}: FUSE is not available here ({problem}). Use the "
                    f"copy-based sync mode instead: `%storage mount {name} --mode sync` "
                    f"(Python: mount({name!r}, mode='sync')) copies the data to "
                    f"{info.mount_path}.", field="mode")
        row = self._mount_row(name)
        if row is not None and row["desired"] == "mounted" and row["mode"] != mode:
            raise ConflictError(f"storage {name!r} is already mounted in {row['mode']} mode; "
                                "unmount it first", field="name")
        op = self.ops.start("storage.mount", f"storage:{name}/mount", {"mode": mode},
                            user=self.user)
        ctx = OperationContext(self.ops, op.id)
        work = self._mount_fuse(ctx, info) if mode == "fuse" else self._mount_sync(ctx, info)
        return self._launch(op, work)

    async def mount(self, name: str, *, mode: str = "fuse") -> dict[str, Any]:
        return await (await self.start_mount(name, mode=mode)).wait()

    def _prepare_mount_path(self, info: StorageInfo, allow_files: bool) -> Path:
        path = Path(info.mount_path)
        if mountmod.mount_entry(path) is not None:
            return path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"mount_path: cannot create {path}: {e.strerror}",
                              field="mount_path") from e
        if not path.is_dir():
            raise ConfigError(f"mount_path: {path} exists and is not a folder",
                              field="mount_path")
        if not allow_files and any(path.iterdir()):
            raise ConflictError(
                f"mount_path: {path} is not empty; a mount would hide its files. Empty it or "
                "choose another mount path", field="mount_path")
        return path

    async def _mount_fuse(self, ctx: OperationContext, info: StorageInfo) -> dict[str, Any]:
        name = info.name
        row = self._mount_row(name)
        if row is not None and row["desired"] == "mounted" and row["state"] == "mounted" and (
                mountmod.mount_entry(info.mount_path) is not None):
            ctx.progress("mounted", f"{name} is already mounted at {info.mount_path}", 1.0)
            return {"name": name, "mount_path": info.mount_path, "mode": "fuse",
                    "already": True}
        self._prepare_mount_path(info, allow_files=False)
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO storage_mounts (name, mode, desired, state, mount_path,"
                " created_at, updated_at) VALUES (?, 'fuse', 'mounted', 'pending', ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET desired = 'mounted', mode = 'fuse',"
                " state = CASE WHEN storage_mounts.state = 'mounted' THEN 'mounted'"
                " ELSE 'pending' END, mount_path = excluded.mount_path, reason = NULL,"
                " updated_at = excluded.updated_at",
                (name, info.mount_path, now, now))
        ctx.progress("mount", f"mounting {name} at {info.mount_path}"
                     f"{' (read-only)' if info.read_only else ''}", 0.1)
        self.ensure_supervisor()
        deadline = time.monotonic() + self.storage_settings.mount_timeout + 10
        while True:
            ctx.checkpoint()
            row = self._mount_row(name)
            if row is None:
                raise ConflictError(f"the mount of {name!r} was removed while it started",
                                    field="name")
            if row["state"] == "mounted":
                break
            if row["state"] == "failed":
                self._unwant(name)
                raise StorageError(f"mounting {name!r} failed: {row['reason']}")
            if time.monotonic() > deadline:
                self._unwant(name)
                raise StorageError(f"mounting {name!r} did not finish in time "
                                   f"(state {row['state']})")
            if mountmod.supervisor_pid(self.settings.state_dir) is None:
                self.ensure_supervisor()
            await asyncio.sleep(MOUNT_POLL)
        ctx.progress("mounted", f"{name} is mounted at {info.mount_path}", 1.0)
        return {"name": name, "mount_path": info.mount_path, "mode": "fuse",
                "read_only": info.read_only}

    def _unwant(self, name: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE storage_mounts SET desired = 'unmounted', updated_at = ?"
                         " WHERE name = ?", (time.time(), name))

    async def _mount_sync(self, ctx: OperationContext, info: StorageInfo) -> dict[str, Any]:
        path = self._prepare_mount_path(info, allow_files=True)
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO storage_mounts (name, mode, desired, state, mount_path,"
                " created_at, updated_at) VALUES (?, 'sync', 'mounted', 'syncing', ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET state = 'syncing', mode = 'sync',"
                " desired = 'mounted', updated_at = excluded.updated_at",
                (info.name, str(path), now, now))
        try:
            result = await self.transfer(Location(info.name, ""), Location(None, str(path)),
                                         ctx=ctx, fraction=(0.05, 0.95), step="sync")
        except BaseException as e:
            with self.store.transaction() as conn:
                conn.execute("UPDATE storage_mounts SET state = 'failed', reason = ?,"
                             " updated_at = ? WHERE name = ?",
                             (getattr(e, "message", str(e)), time.time(), info.name))
            raise
        with self.store.transaction() as conn:
            conn.execute("UPDATE storage_mounts SET state = 'synced', reason = NULL,"
                         " mounted_at = ?, updated_at = ? WHERE name = ?",
                         (time.time(), time.time(), info.name))
        ctx.progress("synced", f"a copy of {info.name} is in {path}; run mount again to "
                     "refresh it", 1.0)
        return {"name": info.name, "mount_path": str(path), "mode": "sync", **{
            k: result[k] for k in ("bytes", "files", "seconds")}}

    async def start_unmount(self, name: str) -> OperationHandle:
        self.catalog.get(name)
        row = self._mount_row(name)
        if row is None:
            raise ConflictError(f"storage {name!r} is not mounted", field="name")
        op = self.ops.start("storage.unmount", f"storage:{name}/mount", {}, user=self.user)
        ctx = OperationContext(self.ops, op.id)
        return self._launch(op, self._unmount(ctx, name, row["mode"]))

    async def unmount(self, name: str) -> dict[str, Any]:
        return await (await self.start_unmount(name)).wait()

    async def _unmount(self, ctx: OperationContext, name: str, mode: str) -> dict[str, Any]:
        info = self.catalog.get(name)
        if mode == "sync":
            pushed = None
            if not info.read_only:
                ctx.progress("sync", f"copying local changes in {info.mount_path} back to "
                             f"{name}", 0.05)
                pushed = await self.transfer(Location(None, info.mount_path),
                                             Location(name, ""), ctx=ctx,
                                             fraction=(0.05, 0.95), step="sync")
            with self.store.transaction() as conn:
                conn.execute("DELETE FROM storage_mounts WHERE name = ?", (name,))
            ctx.progress("unmounted", f"{name}: the local copy in {info.mount_path} is kept",
                         1.0)
            return {"name": name, "mode": "sync", "pushed": pushed}
        self._unwant(name)
        ctx.progress("unmount", f"unmounting {name} from {info.mount_path}", 0.2)
        self.ensure_supervisor()
        deadline = time.monotonic() + 60
        while (row := self._mount_row(name)) is not None:  # one read: it may go meanwhile
            if row["state"] == "failed" and row["desired"] == "unmounted" and row["reason"]:
                raise StorageError(f"unmounting {name!r} failed: {row['reason']}")
            if time.monotonic() > deadline:
                raise StorageError(f"unmounting {name!r} did not finish within 60s")
            if mountmod.supervisor_pid(self.settings.state_dir) is None:
                self.ensure_supervisor()
            await asyncio.sleep(MOUNT_POLL)
        ctx.progress("unmounted", f"{name} is unmounted", 1.0)
        return {"name": name, "mode": "fuse",
                "is_mountpoint": mountmod.mount_entry(info.mount_path) is not None}

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Unmount every mount now (server shutdown); they come back on ``recover``."""
        return mountmod.stop_supervisor(self.settings.state_dir, timeout)

    # operations plumbing -------------------------------------------------------------------
    def _launch(self, op: OperationInfo, coro: Awaitable[Any]) -> OperationHandle:
        return self.runner.launch(op, coro)

    async def wait(self, op_id: str, poll: float = 0.1) -> Any:
        return await self.runner.wait(op_id, poll)

    async def cancel(self, op_id: str) -> OperationInfo:
        return await self.runner.cancel(op_id)


def describe_stats(st: TransferStats) -> str:
    parts = [f"{format_bytes(st.bytes)} / {format_bytes(st.total_bytes)}"]
    if st.total_files:
        parts.append(f"{st.files}/{st.total_files} files")
    if st.speed:
        parts.append(f"{format_bytes(int(st.speed))}/s")
    if st.eta is not None:
        parts.append(f"ETA {st.eta:.0f}s")
    return ", ".join(parts)


def listing_page(out: bytes | str, path: str, offset: int, limit: int,
                 what: str = "listing") -> dict[str, Any]:
    """One page of ``rclone lsjson`` output for folder ``path``: folders first, then files,
    by name."""
    try:
        items = json.loads(out or b"[]")
    except ValueError:  # cut short (rclone killed at the command's timeout), or not JSON
        items = None
    if not isinstance(items, list) or not all(
            isinstance(e, dict) and isinstance(e.get("Path"), str) for e in items):
        shown = (out[:80] if isinstance(out, str) else out[:80].decode(errors="replace"))
        raise StorageError(f"{what}: rclone lsjson answered something that is not a listing "
                           f"({shown!r}…)")
    items.sort(key=lambda e: (not e.get("IsDir"), e["Path"]))
    base = path.strip("/")
    page = [{
        "name": e.get("Name"),
        "path": f"{base}/{e['Path']}" if base else e["Path"],
        "is_dir": bool(e.get("IsDir")),
        "size": None if e.get("IsDir") else e.get("Size"),
        "mod_time": e.get("ModTime"),
        "mime_type": e.get("MimeType"),
    } for e in items[offset:offset + limit]]
    end = offset + len(page)
    return {"path": base, "entries": page, "total": len(items), "offset": offset,
            "limit": limit, "next_offset": end if end < len(items) else None}
