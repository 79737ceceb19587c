"""Helpers of the chaos tests: a real Jupyter server (with the extension) on a state folder
of its own that survives SIGKILLs and restarts, and the counters of what a crash may leave
behind (processes, mounts, state that does not parse, operations that never end).

Nothing here is mocked: the server, the launcher and its Dask nodes, rclone, the mount
supervisor, the local HPC backend's job processes and the reaper daemon are the real ones.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.server.conftest import BIN, Server, _start_server, _stop

SERVER_CONFIG = """
c.LocalProvider.terminate_grace = 2.0
c.CloudTik.reaper_interval = 0.5
"""

ACTIVE_OPERATION_STATES = ("pending", "running")
FINAL = ("succeeded", "failed", "cancelled")


def rounds(default: int) -> int:
    """``CLOUDTIK_CHAOS_ROUNDS`` (more rounds for a longer campaign), else ``default``."""
    text = os.environ.get("CLOUDTIK_CHAOS_ROUNDS", "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(
            f"CLOUDTIK_CHAOS_ROUNDS: {text!r} is not a whole number of rounds (1 or more)")
    return int(text)


def seeded(name: str) -> tuple[int, random.Random]:
    """The seed (``CLOUDTIK_CHAOS_SEED`` replays one) and its random generator."""
    text = os.environ.get("CLOUDTIK_CHAOS_SEED", "").strip()
    seed = int(text) if text else random.SystemRandom().randrange(1 << 32)
    print(f"{name}: seed {seed} (replay: CLOUDTIK_CHAOS_SEED={seed})", file=sys.stderr)
    return seed, random.Random(seed)


class ChaosServer:
    """A Jupyter server that can be SIGKILLed and started again on the same folders."""

    def __init__(self, base: Path, extra_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.base = base
        self.extra_args = extra_args or []
        self.extra_env = extra_env or {}
        (base / "config").mkdir(parents=True, exist_ok=True)
        (base / "config" / "jupyter_cloudtik_config.py").write_text(SERVER_CONFIG)
        self.starts = 0
        self.server: Server | None = None
        self.start()

    @property
    def state_dir(self) -> Path:
        return self.base / "state"

    @property
    def root(self) -> Path:
        return self.base / "root"

    def start(self) -> Server:
        log = self.base / "server.log"
        if log.exists():  # keep every start's log: _start_server truncates it
            log.rename(self.base / f"server-{self.starts}.log")
        self.starts += 1
        self.server = _start_server(self.base, "server", [
            "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
            "--CloudTik.reaper_interval=0.5",
            *self.extra_args,
        ], {"JUPYTER_CONFIG_DIR": str(self.base / "config"), **self.extra_env})
        # the extension loaded (a server whose extension failed to load still answers
        # api/status, and every cloudtik route is Jupyter's HTML 404)
        r = call(self.server, "GET", "operations", params={"limit": 1})
        if r is None or r.status_code != 200:
            log = self.server.log_text()
            lines = [ln for ln in log.splitlines() if "cloudtik" in ln or "Error" in ln]
            raise AssertionError(
                f"start {self.starts}: the cloudtik API does not answer "
                f"({r.status_code if r is not None else 'no answer'}); log {self.log_path}:\n"
                + "\n".join(lines[-40:]))
        return self.server

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    def kill(self, group: bool) -> None:
        """SIGKILL the server: its process group, or the server process alone."""
        proc = self.server.proc
        try:
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def restart(self) -> Server:
        return self.start()

    def stop(self) -> list[str]:
        return _stop(self.server) if self.server is not None else []

    def logs(self, tail: int | None = None) -> str:
        """Every start's log (``tail``: the last characters of each)."""
        texts = [p.read_text(errors="replace") for p in sorted(self.base.glob("server*.log"))]
        return "\n".join(t[-tail:] if tail else t for t in texts)


# --------------------------------------------------------------------------- requests
def call(srv: Server, method: str, path: str, **kw: Any) -> requests.Response | None:
    """One request; None when the server died under it (the answer is unknown)."""
    try:
        return srv.request(method, path, timeout=kw.pop("timeout", 30), **kw)
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
        return None


def wait_operation(srv: Server, op_id: str, timeout: float = 90) -> dict[str, Any] | None:
    """The finished operation; None if the server died while we waited."""
    deadline = time.monotonic() + timeout
    op: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = call(srv, "GET", f"operations/{op_id}")
        if r is None:
            return None
        assert r.status_code == 200, (f"GET operations/{op_id}: {r.status_code} "
                                      f"{r.text[:300]}; server log {srv.log_path}")
        op = r.json()
        if op["state"] in FINAL:
            return op
        time.sleep(0.1)
    raise AssertionError(f"operation {op_id} still {op.get('state')} after {timeout}s: {op}")


# --------------------------------------------------------------------------- counters
def our_processes(base: Path, keep: set[int] = frozenset()) -> list[psutil.Process]:
    """Live processes tied to ``base``: its path in their command line, environment or
    working folder, or their output going to a file under it (Dask nodes, rclone, jobs,
    daemons).  ``keep``: pids the test itself runs (the rclone S3 server)."""
    base_s = str(base.resolve())
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status", "cwd"]):
        if p.pid == me or p.pid in keep or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            hit = base_s in " ".join(p.info["cmdline"] or []) \
                or (p.info["cwd"] or "").startswith(base_s) \
                or any(base_s in v for v in p.environ().values())
            if not hit:
                for fd in (1, 2):
                    try:
                        if os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith(base_s):
                            hit = True
                    except OSError:
                        pass
        except psutil.Error:
            continue
        if hit:
            found.append(p)
    return found


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"  {p.pid}: {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            continue
    return "\n".join(out)


def wait_no_processes(base: Path, keep: set[int], timeout: float) -> list[psutil.Process]:
    """Daemons (launcher, mount supervisor, reaper) idle out by themselves; wait for them,
    then return what is still alive: orphans."""
    deadline = time.monotonic() + timeout
    left = our_processes(base, keep)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = our_processes(base, keep)
    return left


def fuse_mounts_under(base: Path) -> list[str]:
    base_s = str(base.resolve())
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(base_s)]


def state_corruption(state_dir: Path) -> list[str]:
    """What of the state folder does not read back: the SQLite store's integrity check, every
    JSON column value, every ``.json`` file."""
    problems = []
    db = state_dir / "state.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchall()
        if check != [("ok",)]:
            problems.append(f"state.db integrity_check: {check}")
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            for row in conn.execute(f"SELECT * FROM {table}"):
                for col, value in zip(cols, row, strict=True):
                    if isinstance(value, str) and value[:1] in ("{", "["):
                        try:
                            json.loads(value)
                        except ValueError:
                            problems.append(f"{table}.{col}: not JSON: {value[:80]!r}")
    finally:
        conn.close()
    for path in state_dir.rglob("*.json"):
        try:
            json.loads(path.read_text())
        except (ValueError, OSError) as e:
            problems.append(f"{path.relative_to(state_dir)}: {e}")
    return problems


def cli_list(state_dir: Path) -> tuple[int, Any, str]:
    """`jupyter cloudtik list --all --json` on the state folder: (code, parsed, stderr)."""
    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(state_dir)}
    r = subprocess.run([str(BIN / "jupyter-cloudtik"), "list", "--all", "--json"],
                       capture_output=True, text=True, timeout=60, env=env)
    try:
        parsed = json.loads(r.stdout) if r.returncode == 0 else None
    except ValueError:
        parsed = None
    return r.returncode, parsed, r.stderr
