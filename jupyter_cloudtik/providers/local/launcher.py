"""The local launcher: a small daemon that forks node processes with Dask preloaded.

Why it exists: a fresh ``dask worker`` spends ~0.4 s importing distributed before it does
anything, and two workers plus a scheduler on a 2-core laptop make ``%cluster up`` several
times slower than ``LocalCluster``.  The launcher imports Dask (and the dashboard) once and
forks each node from that warm image, like multiprocessing's forkserver.

Rules that keep forking safe and nodes independent:

* the daemon is single-threaded and runs no asyncio loop, so a fork copies no lock held by
  another thread;
* each node calls ``setsid``: it leads its own session and process group, outlives the
  launcher, the kernel and the CLI, and is stopped by signalling its group;
* the daemon listens on a unix socket in the user's 0700 state folder and serves only
  peers with the same uid (``SO_PEERCRED``);
* one launcher per state folder, enforced by an ``flock`` held for its lifetime;
* it exits once it has no live children and no request came for ``idle_seconds``.

While it lives it also reaps its children (recording their exit codes for error messages)
and enforces each worker's memory limit the way a Dask nanny would (terminate at 95%).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..._version import __version__
from ...core.locks import try_flock
from ...core.process_groups import GroupRef, signal_group
from .node import run_node
from .processes import start_time

MEMORY_TERMINATE_FRACTION = 0.95
PROTOCOL = 1


def local_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "local"


def socket_path(state_dir: str | Path) -> Path:
    """The launcher's socket; a short path under /tmp when the state folder is too deep."""
    p = local_dir(state_dir) / "launcher.sock"
    if len(str(p)) < 100:
        return p
    digest = hashlib.sha1(str(Path(state_dir).resolve()).encode()).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"cloudtik-{os.getuid()}"
    short.mkdir(mode=0o700, exist_ok=True)
    return short / f"{digest}.sock"


class LauncherUnavailable(RuntimeError):
    pass


# --------------------------------------------------------------------------- client side
def request(state_dir: str | Path, message: dict[str, Any], timeout: float = 30.0) -> Any:
    path = socket_path(state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except OSError as e:
            raise LauncherUnavailable(str(e)) from e
        data = b""
        try:
            s.sendall(json.dumps(message).encode() + b"\n")
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError as e:
            raise LauncherUnavailable(f"the launcher did not answer in {timeout:g} s") from e
        except ConnectionError as e:  # it closed its socket (stopping) as we connected
            raise LauncherUnavailable(str(e)) from e
    if not data:
        raise LauncherUnavailable("the launcher closed the connection")
    reply = json.loads(data)
    if not reply.get("ok"):
        raise RuntimeError(reply.get("error", "launcher error"))
    return reply.get("result")


_starting = threading.Lock()  # one start at a time per process (a prewarm and an `up`)


def ensure_running(
    state_dir: str | Path, idle_seconds: float, env: dict[str, str], timeout: float = 30.0
) -> dict[str, Any]:
    """Connect to the launcher of ``state_dir``, starting one if none answers."""
    with _starting:
        return _ensure_running(state_dir, idle_seconds, env, timeout)


def _ensure_running(state_dir: str | Path, idle_seconds: float, env: dict[str, str],
                    timeout: float) -> dict[str, Any]:
    try:
        hello = request(state_dir, {"op": "hello"}, timeout=timeout)
        if hello.get("version") == __version__ and hello.get("protocol") == PROTOCOL:
            return hello
        request(state_dir, {"op": "retire"}, timeout=5)  # outdated code: replace it
    except LauncherUnavailable:
        pass
    ldir = local_dir(state_dir)
    ldir.mkdir(parents=True, exist_ok=True, mode=0o700)
    proc = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # start one unless a launcher holds the lock: one starting (it listens before its
        # slow imports and answers between them) or one still exiting (then try again)
        if proc is None and _lock_free(ldir / "launcher.lock"):
            proc = _spawn(state_dir, idle_seconds, env, ldir)
        try:
            return request(state_dir, {"op": "hello"}, timeout=timeout)
        except LauncherUnavailable:
            if proc is not None and proc.poll() is not None:
                if proc.returncode != 0:
                    break
                proc = None  # exit code 0: another launcher won the lock
            time.sleep(0.01)
    tail = _tail(ldir / "launcher.log")
    raise LauncherUnavailable(f"the local launcher did not start; its log ends with:\n{tail}")


def start_soon(state_dir: str | Path, idle_seconds: float, env: dict[str, str]) -> None:
    """Start the launcher of ``state_dir`` without waiting for it, unless one is there
    (its socket accepts from its start) or starting (it holds the lock)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(socket_path(state_dir)))
            return
        except OSError:
            pass
    with _starting:
        ldir = local_dir(state_dir)
        ldir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if _lock_free(ldir / "launcher.lock"):
            _spawn(state_dir, idle_seconds, env, ldir)


def _spawn(state_dir: str | Path, idle_seconds: float, env: dict[str, str],
           ldir: Path) -> subprocess.Popen:
    log = open(ldir / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "jupyter_cloudtik.providers.local.launcher",
             "--state-dir", str(state_dir), "--idle-seconds", str(idle_seconds)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True, close_fds=True,
        )
    finally:
        log.close()


def _lock_free(path: Path) -> bool:
    """No launcher holds the lock (none runs nor is starting)."""
    fd = try_flock(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- server side
class Launcher:
    def __init__(self, state_dir: Path, idle_seconds: float) -> None:
        self.state_dir = state_dir
        self.idle_seconds = idle_seconds
        self.children: dict[int, dict[str, Any]] = {}  # pid -> spec summary
        self.last_request = time.monotonic()
        self.last_launch = time.monotonic()  # the dashboard waits for a pause in launches
        self.retired = False
        self.running = True
        self.selector = selectors.DefaultSelector()
        self.lock_fd: int | None = None
        self.listener: socket.socket | None = None
        self.sock_path = socket_path(state_dir)
        self.preloaded: set[str] = set()

    # set-up -------------------------------------------------------------------------
    def acquire_lock(self) -> bool:
        ldir = local_dir(self.state_dir)
        ldir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = try_flock(ldir / "launcher.lock")
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.lock_fd = fd
        return True

    def listen(self) -> None:
        try:
            self.sock_path.unlink()
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(str(self.sock_path))
        finally:
            os.umask(old)
        s.listen(64)
        s.setblocking(False)
        self.listener = s
        self.selector.register(s, selectors.EVENT_READ)

    # Dask, imported once here so each forked node starts in milliseconds: first what
    # every node needs, then the dashboard (bokeh, about as slow to import as Dask itself).
    # The daemon listens before importing anything, answers ``hello`` between these steps,
    # and forks nodes as soon as the first group is in: nodes add their dashboard after
    # they are up (dashboard_later.py), so no launch waits for bokeh.  The daemon imports
    # it only once no request came for DASHBOARD_AFTER_IDLE seconds (a starting cluster's
    # launches come in quick succession), so later nodes find it loaded.
    PRELOAD_CORE = ("distributed", "distributed.cli.dask_scheduler",
                    "distributed.cli.dask_worker", "distributed.http.scheduler.api",
                    "jupyter_cloudtik.providers.local.node",
                    "jupyter_cloudtik.providers.local.dashboard_later")
    #: in steps of at most ~0.1 s (a launch that comes meanwhile waits for one step only);
    #: every one optional (no bokeh, no jupyter-server-proxy: the node says so itself)
    PRELOAD_DASHBOARD = (
        # what every node asks once (a worker as it registers, a scheduler and a client
        # as they meet): package versions from the installed distributions, ~10 ms;
        # asked here once, cached in every later fork
        "distributed.versions:get_versions",
        "bokeh.core.properties", "bokeh.models",  # 0.25 s: its package loads as one
        "bokeh.io", "bokeh.plotting", "distributed.dashboard.components",
        "distributed.dashboard.scheduler", "distributed.dashboard.worker",
        "aiohttp.connector", "aiohttp", "jupyter_server.base.handlers",
        "jupyter_server_proxy", "distributed.http.proxy")
    DASHBOARD_AFTER_IDLE = 0.5

    def preload_pending(self) -> list[str]:
        return [m for m in self.PRELOAD_CORE + self.PRELOAD_DASHBOARD if m not in self.preloaded]

    def preload_step(self) -> None:
        """Import the next preload module (an optional one may be missing: no bokeh)."""
        import importlib

        name = self.preload_pending()[0]
        self.preloaded.add(name)
        module, _, function = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if function:
                getattr(loaded, function)()
        except ImportError:
            if name not in self.PRELOAD_DASHBOARD:
                raise
        finally:
            if not self.preload_pending():  # see main(): the collector was off meanwhile
                gc.freeze()
                gc.enable()
        if threading.active_count() != 1:  # pragma: no cover - would make fork unsafe
            print(f"preloading {name} started threads: {threading.enumerate()}", flush=True)

    def preload(self, dashboard: bool = True) -> None:
        """Finish the core group (and the dashboard's, with ``dashboard``)."""
        while any(m in self.PRELOAD_CORE or dashboard for m in self.preload_pending()):
            self.preload_step()

    def _preload_wait(self) -> float | None:
        """Seconds until the next preload step is due (0: now), None: nothing to load."""
        pending = self.preload_pending()
        if not pending:
            return None
        if pending[0] in self.PRELOAD_CORE:
            return 0.0
        return max(self.DASHBOARD_AFTER_IDLE - (time.monotonic() - self.last_launch), 0.0)

    # loop ----------------------------------------------------------------------------
    def serve(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        last_guard = 0.0
        while self.running:
            wait = self._preload_wait()
            for key, _ in self.selector.select(timeout=0.2 if wait is None else min(wait, 0.2)):
                if key.fileobj is self.listener:
                    self._accept()
            if self.running and self._preload_wait() == 0:
                self.preload_step()
            self._reap()
            now = time.monotonic()
            if now - last_guard >= 1.0:
                last_guard = now
                self._guard_memory()
            if self._should_exit(now):
                break
        self.shutdown()

    def _on_term(self, signum, frame) -> None:
        self.running = False

    def _should_exit(self, now: float) -> bool:
        if self.children:
            return False
        if self.retired:
            return True
        return now - self.last_request >= max(self.idle_seconds, 2.0)

    def shutdown(self) -> None:
        if self.listener is not None and not self.retired:
            try:
                if self.sock_path.exists():
                    self.sock_path.unlink()
            except OSError:
                pass
        if self.listener is not None:
            self.listener.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        with conn:
            conn.setblocking(True)
            conn.settimeout(10)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                self._reply(conn, {"ok": False, "error": "permission denied"})
                return
            data = b""
            try:
                while not data.endswith(b"\n"):
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
                message = json.loads(data)
            except (OSError, ValueError) as e:
                self._reply(conn, {"ok": False, "error": f"bad request: {e}"})
                return
            self.last_request = time.monotonic()
            try:
                result = self.handle(message, conn)
                self._reply(conn, {"ok": True, "result": result})
            except Exception as e:
                self._reply(conn, {"ok": False, "error": f"{type(e).__name__}: {e}"})

    @staticmethod
    def _reply(conn: socket.socket, payload: dict[str, Any]) -> None:
        try:
            conn.sendall(json.dumps(payload).encode() + b"\n")
        except OSError:
            pass

    def handle(self, message: dict[str, Any], conn: socket.socket) -> Any:
        op = message.get("op")
        if op == "hello":
            return {"version": __version__, "protocol": PROTOCOL, "pid": os.getpid(),
                    "children": len(self.children), "preloading": len(self.preload_pending())}
        if op == "launch":
            # no launch waits for the dashboard's modules (see PRELOAD_CORE)
            self.preload(dashboard=False)
            try:
                return [self.launch(spec, conn) for spec in message["specs"]]
            finally:
                self.last_launch = time.monotonic()
        if op == "retire":
            self.retire()
            return {"retired": True}
        if op == "stop":
            self.running = False
            return {"stopping": True}
        raise ValueError(f"unknown op {op!r}")

    def retire(self) -> None:
        """Stop serving (a newer launcher takes over); live until the children end."""
        self.retired = True
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            try:
                self.sock_path.unlink()
            except OSError:
                pass
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    # forking -------------------------------------------------------------------------
    def launch(self, spec: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        sys.stdout.flush()
        sys.stderr.flush()
        # what is loaded so far is never collected in the node: its pages stay shared
        # with the launcher's instead of being copied when the collector walks them
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the node
            code = 1
            try:
                gc.enable()
                os.setsid()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                conn.close()
                if self.listener is not None:
                    self.listener.close()
                self.selector.close()
                if self.lock_fd is not None:
                    os.close(self.lock_fd)
                code = run_node(spec)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)

        started = start_time(pid)
        self.children[pid] = {
            "node_id": spec["node_id"],
            "node_dir": spec["node_dir"],
            "memory_limit": spec.get("memory_limit") or 0,
            "started": started,
        }
        return {"node_id": spec["node_id"], "pid": pid, "started": started}

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                code = os.waitstatus_to_exitcode(status)
                path = Path(child["node_dir"], "exitcode")
                try:
                    if code < 0 or not path.exists():  # killed by a signal: say which
                        path.write_text(str(code))
                except OSError:
                    pass

    def _guard_memory(self) -> None:
        import psutil

        for pid, child in list(self.children.items()):
            limit = child["memory_limit"]
            if not limit:
                continue
            try:
                proc = psutil.Process(pid)
                procs = [proc, *proc.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs)
            except psutil.Error:
                continue
            if rss > MEMORY_TERMINATE_FRACTION * limit:
                try:
                    Path(child["node_dir"], "killed").write_text(
                        f"memory: {rss} bytes in use, limit {limit} bytes"
                    )
                    with open(Path(child["node_dir"], "node.log"), "a") as f:
                        f.write(f"[cloudtik] worker uses {rss} bytes, over 95% of its memory "
                                f"limit {limit}; terminating it\n")
                except OSError:
                    pass
                signal_group(GroupRef(pid, child["started"]), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jupyter_cloudtik.providers.local.launcher")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    # no cyclic collection while Dask loads (tens of thousands of objects that all live:
    # the collector only costs time, ~10% of the import); on again once all is loaded,
    # and in every node from its start
    gc.disable()
    launcher = Launcher(Path(args.state_dir), args.idle_seconds)
    if not launcher.acquire_lock():
        print("another launcher serves this state folder; exiting", flush=True)
        return
    try:
        import setproctitle

        setproctitle.setproctitle(f"cloudtik launcher {args.state_dir}")
    except Exception:
        pass
    launcher.listen()  # before the slow imports: clients connect and wait, none starts another
    print(f"launcher {os.getpid()} serving {launcher.sock_path} (version {__version__})",
          flush=True)
    launcher.serve()


if __name__ == "__main__":
    main()
