"""Emulated servers "boot" by running their user data as local processes.

Each server gets its own folder (its disk), its own loopback address (its private IP), a
minimal environment (nothing of the emulator's own environment leaks in: no access keys),
and a metadata URL that stands in for the link-local metadata service of a real server.
The user data runs in its own process group; everything the server started is stopped
with the group when the server is deleted or the emulator stops.  A server whose
processes have all ended is reported as powered off (SHUTOFF), which is how a real node
whose runtime died looks to the cloud's API once its watchdog powers it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from jupyter_cloudtik.core import env as envnames
from jupyter_cloudtik.core.process_groups import (
    GroupRef,
    Owned,
    group_running,
    signal_group,
    writes_under,
)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned node processes so they are reaped here, not left as zombies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def server_processes(root: Path, emulator_id: str) -> list[int]:
    """Live processes of the emulated servers under ``root``: those whose output goes to a
    server's folder, or that carry the emulator's environment marker.  Both: Dask sets its
    process title, which blanks what /proc shows of its environment, so a leak check by the
    marker alone never saw a Dask process left behind."""
    logs_here = writes_under(Path(root) / "servers")
    out = []
    me = os.getpid()
    for p in psutil.process_iter(["environ", "status"]):
        try:
            if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = p.info.get("environ") or {}
            if env.get(envnames.EMULATOR_ID) == emulator_id or logs_here(p):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


class Machines:
    """Processes of the emulated servers, keyed by server id."""

    def __init__(self, root: Path, metadata_base: str, emulator_id: str,
                 stop_grace: float = 3.0) -> None:
        self.root = root
        self.metadata_base = metadata_base.rstrip("/")
        self.emulator_id = emulator_id
        self.stop_grace = stop_grace
        self.procs: dict[str, subprocess.Popen] = {}
        #: each server's process group as started: stopping a server signals it only
        #: while the number is still its own (core/process_groups)
        self.groups: dict[str, GroupRef] = {}
        self.lock = threading.Lock()
        self._stoppers: list[threading.Thread] = []
        self.subreaper = become_subreaper()

    def server_dir(self, server_id: str) -> Path:
        return self.root / "servers" / server_id

    def environment(self, server_id: str, node_dir: Path) -> dict[str, str]:
        bindir = str(Path(sys.executable).parent)
        return {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(node_dir),
            "LANG": "C.UTF-8",
            "TMPDIR": str(node_dir / "tmp"),
            envnames.NODE_DIR: str(node_dir),
            envnames.METADATA_URL: f"{self.metadata_base}/{server_id}",
            # the emulated OBS answers for its own domain through the emulator (a proxy)
            envnames.OBS_PROXY: self.metadata_base.rsplit("/_emulator", 1)[0],
            # stands for /run (a tmpfs on a real server): where the node keeps its TLS key
            envnames.RUNTIME_DIR: str(node_dir / "run"),
            envnames.EMULATED_SERVER: server_id,
            envnames.EMULATOR_ID: self.emulator_id,
        }

    def boot(self, server: dict[str, Any], prefix: list[str] | None = None,
             env: dict[str, str] | None = None,
             script_at: tuple[Path, list[str]] | None = None) -> str:
        """Run the server's user data; returns what happened, for the console log.

        ``prefix`` runs it elsewhere (realistic mode: ``ip netns exec NS``, which execs, so
        the process group is still the server's) and ``env`` overrides the environment
        (there: the metadata service at 169.254.169.254 and the VPC's OBS endpoint);
        ``script_at`` is (where to write the user data, the command that runs it) when
        the server has a root of its own (the stock image)."""
        sid = server["id"]
        node_dir = self.server_dir(sid)
        (node_dir / "tmp").mkdir(parents=True, exist_ok=True, mode=0o700)
        script = server.get("script") or ""
        console = node_dir / "console.log"
        if not script.startswith("#!"):
            note = ("no user data" if not script else
                    "user data is not a script (#!...); the emulator runs scripts only")
            console.write_text(note + "\n")
            return note
        path, run = script_at or (node_dir / "user-data", [str(node_dir / "user-data")])
        path.write_text(script)
        path.chmod(0o700)
        with open(console, "ab") as log:
            proc = subprocess.Popen(
                [*(prefix or []), *run], cwd=node_dir,
                env={**self.environment(sid, node_dir), **(env or {})},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        ref = GroupRef.of(proc.pid)
        with self.lock:
            self.procs[sid] = proc
            self.groups[sid] = ref
        return f"user data started (pid {proc.pid})"

    def console_output(self, server_id: str) -> str:
        """What the server printed to its console: the user data's output (cloud-init
        copies it there on a real image), and the emulator's boot notes."""
        try:
            return (self.server_dir(server_id) / "console.log").read_text(errors="replace")
        except OSError:
            return ""

    def alive(self, server_id: str) -> bool:
        """Something the server started still runs (its group, while the number is its own;
        else what still logs to its folder)."""
        with self.lock:
            proc = self.procs.get(server_id)
            ref = self.groups.get(server_id)
        if proc is None or ref is None:
            return False
        proc.poll()
        return group_running(ref, self._owned(server_id))

    def stop(self, server_id: str, wait: bool = False) -> None:
        with self.lock:
            proc = self.procs.pop(server_id, None)
            ref = self.groups.pop(server_id, None)
        if proc is None or ref is None:
            return
        t = threading.Thread(target=self._stop_group, args=(server_id, proc, ref),
                             daemon=True)
        t.start()
        self._stoppers.append(t)
        if wait:
            t.join()

    def _owned(self, server_id: str) -> Owned:
        """Proof a process is this server's: its output goes to the server's folder (the
        runtimes log there), or it carries the marker of the server's environment.  The
        marker alone is not enough: Dask sets its process title, which overwrites what
        /proc shows of the environment."""
        logs_here = writes_under(self.server_dir(server_id))

        def owned(p: psutil.Process) -> bool:
            if logs_here(p):
                return True
            env = p.environ()
            return (env.get(envnames.EMULATOR_ID) == self.emulator_id
                    and env.get(envnames.EMULATED_SERVER) == server_id)
        return owned

    def _stop_group(self, server_id: str, proc: subprocess.Popen, ref: GroupRef) -> None:
        owned = self._owned(server_id)
        signal_group(ref, signal.SIGTERM, owned)
        deadline = time.monotonic() + self.stop_grace
        while time.monotonic() < deadline:
            proc.poll()
            if not group_running(ref, owned):
                break
            time.sleep(0.05)
        else:
            signal_group(ref, signal.SIGKILL, owned)
        # a process of this server that left the group (setsid) is found by its proof
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and owned(p):
                    p.kill()
            except psutil.Error:
                continue
        with contextlib.suppress(Exception):
            proc.wait(timeout=1)

    def stop_all(self) -> None:
        with self.lock:
            ids = list(self.procs)
        for sid in ids:
            self.stop(sid)
        for t in list(self._stoppers):
            t.join(timeout=self.stop_grace + 5)
        self._stoppers = [t for t in self._stoppers if t.is_alive()]
        if self.subreaper:
            reap_children()

    def leftovers(self) -> list[int]:
        """Pids of processes of this emulator's servers that are still alive."""
        return server_processes(self.root, self.emulator_id)
