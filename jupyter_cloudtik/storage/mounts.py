"""FUSE mounts of storages, kept alive by a supervisor daemon.

Why a daemon: ``rclone mount --daemon`` mounts vanish when the job that started them ends,
and a mount started by a kernel would die with the kernel.  The supervisor is one small
process per state folder (held by an ``flock``, like the reaper) that owns every
``rclone mount`` process.  The ``storage_mounts`` table is the desired state; the supervisor
makes it true on every tick:

* a wanted mount must be a real mountpoint (listed in ``/proc/mounts``), answer a directory
  listing within ``c.Storage.health_timeout``, and be served by its recorded rclone process;
  otherwise what is left is unmounted (``fusermount -uz``) and rclone is started again;
* an unwanted mount is unmounted cleanly (SIGTERM: rclone unmounts itself; then
  ``fusermount -u`` if anything remains) and its row removed;
* on SIGTERM (server shutdown) every mount is unmounted but stays wanted, so the next
  supervisor — started by whichever face opens the state folder next — mounts it again.

Callers never touch mounts themselves: they write the wanted state and wait for the
supervisor to report it, so there is only ever one actor per mountpoint.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..core.env import scrub_environment
from ..core.errors import ConfigError
from ..core.fuse import fusermount, mount_entry, unmount_path
from ..core.locks import try_flock
from ..core.process_groups import GroupRef, terminate_group
from ..core.store import Store
from .rclone import Rclone, log_messages, write_config

log = logging.getLogger("jupyter_cloudtik.storage.mounts")

LOCK_NAME = "mountd.lock"
PROC_TITLE = "cloudtik mount supervisor"
#: the daemon's entry point (storage/mountd.py: it builds a StorageManager, which imports
#: this module, so the entry point lives apart)
DAEMON_MODULE = "jupyter_cloudtik.storage.mountd"
REMOTE = "cts0"  # the internal remote name: user names never reach rclone's command line


class FuseUnavailable(ConfigError):
    """FUSE cannot be used here; the message offers the copy-based sync mode."""

    reason = "fuse_unavailable"


def fuse_problem(fuse_device: str = "/dev/fuse") -> str | None:
    """Why FUSE mounts cannot work here, or None when they can."""
    if not os.path.exists(fuse_device):
        return f"{fuse_device} does not exist (the container or machine has no FUSE device)"
    if not os.access(fuse_device, os.R_OK | os.W_OK):
        return f"{fuse_device} is not readable and writable by this user"
    if fusermount() is None:
        return ("fusermount3 is not installed (Debian/Ubuntu: apt-get install fuse3)")
    return None


# --------------------------------------------------------------------------- mount table
_probe_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                    thread_name_prefix="mount-probe")


def probe(path: str, timeout: float) -> str | None:
    """None if ``path`` answers a listing in time, else why not (a hung FUSE blocks)."""
    fut = _probe_pool.submit(os.listdir, path)
    try:
        fut.result(timeout)
        return None
    except concurrent.futures.TimeoutError:
        return f"no answer within {timeout:g}s"
    except OSError as e:
        return e.strerror or str(e)


def _alive(pid: int | None, started: float | None) -> bool:
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if started is not None and abs(p.create_time() - started) > 1.0:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --------------------------------------------------------------------------- supervisor
@dataclass
class _Child:
    proc: subprocess.Popen | None
    pid: int
    started: float
    config: Path | None
    spawned_at: float


class MountSupervisor:
    """Makes ``storage_mounts`` true; one instance per state folder (see ``main``)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager  # a StorageManager: catalog, rclone, settings, paths
        self.store: Store = manager.store
        self.settings = manager.storage_settings
        self.children: dict[str, _Child] = {}
        self.stopping = threading.Event()

    # one pass ---------------------------------------------------------------------------
    def tick(self) -> int:
        """Check every mount once; returns how many are wanted."""
        wanted = 0
        for row in self.store.query("SELECT * FROM storage_mounts WHERE mode = 'fuse'"):
            name = row["name"]
            try:
                if row["desired"] == "mounted":
                    wanted += 1
                    self._keep_mounted(row)
                else:
                    self._unmount(row, forget=True)
            except Exception as e:  # one broken mount must not stop the others
                log.exception("mount %s: %s", name, e)
                self._set(name, state="failed", reason=self.manager.redact(str(e)))
        return wanted

    def _keep_mounted(self, row) -> None:
        name, path, state = row["name"], row["mount_path"], row["state"]
        child = self.children.get(name)
        if child is None and row["pid"] and _alive(row["pid"], row["pid_started"]):
            # a mount started by an earlier supervisor: adopt it
            child = self.children[name] = _Child(None, row["pid"], row["pid_started"], None,
                                                 time.monotonic())
        alive = child is not None and self._child_alive(child)
        entry = mount_entry(path)
        now = time.time()
        if entry is not None and alive:
            problem = probe(path, self.settings.health_timeout)
            if problem is None:
                if state != "mounted":
                    # after a re-mount the reason stays: it tells the user what happened
                    self._set(name, state="mounted", mounted_at=now, last_check=now,
                              reason=row["reason"] if state == "remounting" else None)
                    log.info("mount %s is up at %s", name, path)
                else:
                    self._set(name, last_check=now)
                self._drop_config(child)
                return
        else:
            problem = "not mounted" if entry is None else "its rclone process is gone"
        if state in ("mounting", "remounting") and child is not None:
            if alive and entry is None and (
                    time.monotonic() - child.spawned_at < self.settings.mount_timeout):
                return  # rclone is still starting
            why = self._log_tail(name) or (
                f"rclone did not mount within {self.settings.mount_timeout:g}s" if alive
                else "rclone exited")
            log.warning("mount %s failed: %s", name, why)
            self._cleanup(name, path)
            self._set(name, state="failed", reason=why, last_check=now, pid=None)
            return
        if state == "failed":
            wait = min(30.0, 2.0 ** min(row["restarts"], 5))
            if row["last_check"] and now - row["last_check"] < wait:
                return  # back off between failed attempts
            self._spawn(row, restarts=row["restarts"] + 1, reason=row["reason"])
            return
        if state == "mounted":
            log.warning("mount %s at %s is broken (%s); mounting again", name, path, problem)
            self._cleanup(name, path)
            self._spawn(row, restarts=row["restarts"] + 1,
                        reason=f"re-mounted after: {problem}", state="remounting")
            return
        # pending (new) or stopped (after a shutdown): start it
        if child is not None or entry is not None:
            self._cleanup(name, path)
        self._spawn(row, restarts=row["restarts"], reason=None)

    def _child_alive(self, child: _Child) -> bool:
        if child.proc is not None:
            return child.proc.poll() is None
        return _alive(child.pid, child.started)

    def _spawn(self, row, restarts: int, reason: str | None, state: str = "mounting"
               ) -> None:
        name, path = row["name"], row["mount_path"]
        info = self.manager.catalog.get(name)
        Path(path).mkdir(parents=True, exist_ok=True)
        try:
            remote = self.manager.catalog.remote(self.manager.grant(
                name, "read" if info.read_only else "write", "name"))
        except Exception as e:
            self._set(name, state="failed", reason=self.manager.redact(str(e)),
                      last_check=time.time())
            return
        rclone: Rclone = self.manager.rclone
        conf = write_config(self.manager.run_dir, {REMOTE: remote})
        args = mount_args(info, self.settings, self.manager.cache_dir / name)
        proc = rclone.spawn(args, conf, self.manager.log_dir / f"mount-{name}.log")
        started = psutil.Process(proc.pid).create_time()
        self.children[name] = _Child(proc, proc.pid, started, conf, time.monotonic())
        self._set(name, state=state, pid=proc.pid, pid_started=started, restarts=restarts,
                  reason=reason, last_check=time.time())

    def _drop_config(self, child: _Child | None) -> None:
        if child is not None and child.config is not None:
            with contextlib.suppress(FileNotFoundError):
                child.config.unlink()
            child.config = None

    def _cleanup(self, name: str, path: str) -> None:
        child = self.children.pop(name, None)
        if child is not None:
            if self._child_alive(child):
                terminate_group(GroupRef(child.pid, child.started), grace=5.0)
            if child.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5)
            self._drop_config(child)
        else:
            row = self.store.query_one(
                "SELECT pid, pid_started FROM storage_mounts WHERE name = ?", (name,))
            if row and _alive(row["pid"], row["pid_started"]):
                terminate_group(GroupRef(row["pid"], row["pid_started"]), grace=5.0)
        unmount_path(path)

    def _unmount(self, row, forget: bool) -> None:
        self._cleanup(row["name"], row["mount_path"])
        gone = mount_entry(row["mount_path"]) is None
        with self.store.transaction() as conn:
            if forget and gone:
                conn.execute("DELETE FROM storage_mounts WHERE name = ?", (row["name"],))
            else:
                conn.execute(
                    "UPDATE storage_mounts SET state = ?, pid = NULL, reason = ?,"
                    " updated_at = ? WHERE name = ?",
                    ("stopped" if gone else "failed",
                     None if gone else f"{row['mount_path']} could not be unmounted",
                     time.time(), row["name"]))
        log.info("mount %s at %s unmounted", row["name"], row["mount_path"])

    def _log_tail(self, name: str) -> str:
        try:
            text = (self.manager.log_dir / f"mount-{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        msgs = log_messages("\n".join(text.splitlines()[-20:]))
        return self.manager.redact(msgs[-1]) if msgs else ""

    def _set(self, name: str, **values: Any) -> None:
        values["updated_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in values)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE storage_mounts SET {cols} WHERE name = ?",
                         (*values.values(), name))

    # life -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Unmount everything, keep it wanted (the next supervisor mounts it again)."""
        for row in self.store.query("SELECT * FROM storage_mounts WHERE mode = 'fuse'"):
            try:
                self._unmount(row, forget=row["desired"] != "mounted")
            except Exception as e:
                log.warning("unmounting %s failed: %s", row["name"], e)

    def run(self, idle_ticks: int = 3) -> None:
        quiet = 0
        while not self.stopping.is_set():
            wanted = self.tick()
            pending = self.store.query_one(
                "SELECT COUNT(*) FROM storage_mounts WHERE mode = 'fuse'")[0]
            quiet = 0 if (wanted or pending) else quiet + 1
            if quiet >= idle_ticks:
                return
            self.stopping.wait(self.settings.health_interval)
        self.shutdown()


def mount_args(info: Any, settings: Any, cache_dir: Path) -> list[str]:
    """``rclone mount`` arguments: admin-controlled flags, then ``--``, then the two paths."""
    flags = [
        "mount",
        "--vfs-cache-mode", info.vfs_cache_mode or settings.vfs_cache_mode,
        "--cache-dir", str(cache_dir),
        "--dir-cache-time", settings.dir_cache_time,
        "--volname", info.name,
        *settings.mount_options,
    ]
    if info.read_only:
        flags.append("--read-only")
    return [*flags, "--", f"{REMOTE}:{info.source}", info.mount_path]


# --------------------------------------------------------------------------- daemon
def _lock_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "storage" / LOCK_NAME


def _try_lock(state_dir: str | Path) -> int | None:
    path = _lock_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return try_flock(path)


def supervisor_pid(state_dir: str | Path) -> int | None:
    """The pid of the running supervisor of this state folder, if one runs."""
    fd = _try_lock(state_dir)
    if fd is not None:
        os.close(fd)
        return None
    try:
        return int((Path(state_dir) / "storage" / "mountd.pid").read_text())
    except (OSError, ValueError):
        return -1


def ensure_supervisor(state_dir: str | Path, settings_json: str,
                      extra_env: dict[str, str] | None = None) -> bool:
    """Start the supervisor daemon unless one runs already; True if started."""
    if supervisor_pid(state_dir) is not None:
        return False

    env = scrub_environment(dict(os.environ))
    env.update(extra_env or {})
    log_path = Path(state_dir) / "storage" / "mountd.log"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        subprocess.Popen(
            [sys.executable, "-m", DAEMON_MODULE, "--state-dir",
             str(state_dir), "--settings", settings_json],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env,
            start_new_session=True, close_fds=True,
        )
    finally:
        os.close(fd)
    return True


def _supervisor_process(state_dir: str | Path) -> psutil.Process | None:
    """The supervisor process of ``state_dir`` from its pid file, even while it exits; or
    one just spawned that has not written its pid file yet (found by its command line)."""
    try:
        pid = int((Path(state_dir) / "storage" / "mountd.pid").read_text())
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())
        if (DAEMON_MODULE in cmd or PROC_TITLE in cmd) and (
                proc.status() != psutil.STATUS_ZOMBIE):
            return proc
    except (OSError, ValueError, psutil.Error):
        pass
    wanted = ["-m", DAEMON_MODULE, "--state-dir", str(state_dir)]
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                cmd[i:i + len(wanted)] == wanted for i in range(len(cmd))):
            return proc
    return None


def stop_supervisor(state_dir: str | Path, timeout: float = 30.0) -> bool:
    """Ask the supervisor to unmount everything and exit (mounts stay wanted); True once a
    running supervisor has exited."""
    proc = _supervisor_process(state_dir)
    if proc is None:
        return False
    with contextlib.suppress(psutil.Error):
        proc.terminate()
    try:
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        return False
    except psutil.Error:
        pass
    return True
