"""Real storage servers on loopback, for tests, demos and benchmarks: ``rclone serve``.

``rclone serve s3|webdav|sftp`` over a local folder speaks the real protocols with real
authentication.  The servers get their credentials through the environment (never the
command line, which every user can read with ``ps``) and pick a free port themselves
(``127.0.0.1:0``); the port is read back from rclone's log, so nothing races for it.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.process_groups import signal_child
from .rclone import clean_environment, rclone_binary

_ADDR_RE = re.compile(
    r"(?:https?://|sftp://|on \[?)?(127\.0\.0\.1|\[::1\]|\d+\.\d+\.\d+\.\d+):(\d+)")


@dataclass
class RcloneServer:
    kind: str  # s3 | webdav | sftp
    root: Path
    user: str
    password: str
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        scheme = "sftp" if self.kind == "sftp" else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def storage_options(self, password: str | None = None) -> dict[str, str]:
        """Options of a storage pointing at this server (``password`` overrides)."""
        pw = self.password if password is None else password
        if self.kind == "s3":
            return {"provider": "Rclone", "endpoint": self.url, "access_key_id": self.user,
                    "secret_access_key": pw}
        if self.kind == "webdav":
            return {"url": self.url, "vendor": "rclone", "user": self.user, "pass": pw}
        return {"host": self.host, "port": str(self.port), "user": self.user, "pass": pw}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_child(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                signal_child(self.proc, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> RcloneServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_server(kind: str, root: str | os.PathLike[str], *, workdir: str | os.PathLike[str],
                 user: str | None = None, password: str | None = None,
                 dir_cache_time: str = "100ms", timeout: float = 20.0,
                 host: str = "127.0.0.1", read_only: bool = False) -> RcloneServer:
    """Start ``rclone serve KIND root`` on ``host`` (loopback unless a test needs an address
    emulated servers can reach) with generated credentials.

    ``dir_cache_time`` is short so files written straight into ``root`` show up at once, but
    never ``0s``: with 0s rclone 1.75's VFS starts a whole-tree ``ForgetAll`` for every
    directory read, and under a few parallel PUTs these pile up (150 goroutines waiting on
    the same locks) until ``serve s3`` stops answering — the CI hang of the storage tests."""
    if dir_cache_time.strip() in ("0", "0s", "0ms"):
        raise ValueError("dir_cache_time: 0s makes rclone serve hang under parallel writes; "
                         "use a small positive duration such as 100ms")
    root, workdir = Path(root), Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    user = user or f"user{secrets.token_hex(3)}"
    password = password or secrets.token_urlsafe(18)
    env = clean_environment()
    env["RCLONE_CACHE_DIR"] = str(workdir / "cache")
    if kind == "s3":
        env["RCLONE_AUTH_KEY"] = f'"{user},{password}"'  # CSV: one "key,secret" pair
    elif kind in ("webdav", "sftp"):
        env["RCLONE_USER"] = user
        env["RCLONE_PASS"] = password
    else:
        raise ValueError(f"unknown server kind {kind!r}")
    log = workdir / f"serve-{kind}-{secrets.token_hex(4)}.log"  # a fresh log: its port only
    argv = [rclone_binary(), "--config", os.devnull, "serve", kind, "--addr", f"{host}:0",
            "--dir-cache-time", dir_cache_time, "--log-file", str(log), "--log-level", "INFO"]
    if kind == "s3":
        argv += ["--vfs-cache-mode", "off"]
    if read_only:  # a credential that can only read (a storage's read-only credential)
        argv += ["--read-only"]
    argv += ["--", str(root)]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    server = RcloneServer(kind, root, user, password, proc=proc, log=log, host=host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"rclone serve {kind} exited: {text[-2000:]}")
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            m = _ADDR_RE.search(line) if "NOTICE" in line else None
            if m and int(m.group(2)):
                server.port = int(m.group(2))
                return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"rclone serve {kind} did not report its address within {timeout}s")
