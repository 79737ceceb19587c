"""Finding and stopping everything jupyter_cloudtik started under a folder.

Used by the test suite to prove nothing is left behind, and handy after experiments:
``python -m cloudtik_emulators.processes STATE_DIR`` lists (and with ``--kill`` stops)
node processes, launchers and reapers of a state folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import psutil

from jupyter_cloudtik.core.process_groups import GroupRef, signal_group


def cloudtik_processes(base: str | Path) -> list[psutil.Process]:
    """Live processes of ours tied to a state folder under ``base``: nodes (their output
    goes to a node log under ``base``) and daemons (launcher, reaper: by command line)."""
    base = str(Path(base).resolve())
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmd = " ".join(proc.info["cmdline"] or [])
        is_daemon = ("jupyter_cloudtik" in cmd or "cloudtik " in cmd) and base in cmd
        if is_daemon or _writes_under(proc.pid, base):
            found.append(proc)
    return found


def _writes_under(pid: int, base: str) -> bool:
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(base + "/") and "/local/nodes/" in target:
            return True
    return False


def describe(procs: list[psutil.Process]) -> str:
    lines = []
    for p in procs:
        try:
            # a process that is exiting has no command line any more: say what it was
            with p.oneshot():
                where = ""
                try:
                    where = os.readlink(f"/proc/{p.pid}/fd/1")
                except OSError:
                    pass
                lines.append(f"{p.pid}: {' '.join(p.cmdline())[:160]} [{p.name()}, "
                             f"{p.status()}, parent {p.ppid()}, threads {p.num_threads()}, "
                             f"output {where or '?'}]")
        except psutil.Error:
            continue
    return "\n".join(lines)


def stop_launcher(state_dir: str | Path, timeout: float = 10.0) -> None:
    """Ask the launcher of ``state_dir`` to exit, and wait until it has."""
    from jupyter_cloudtik.providers.local import launcher

    try:
        launcher.request(state_dir, {"op": "stop"}, timeout=5)
    except (launcher.LauncherUnavailable, RuntimeError, OSError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            launcher.request(state_dir, {"op": "hello"}, timeout=1)
        except (launcher.LauncherUnavailable, OSError):
            return
        time.sleep(0.05)


def kill_all(procs: list[psutil.Process], grace: float = 2.0) -> None:
    for p in procs:
        try:
            signal_group(GroupRef.of(p.pid), signal.SIGTERM) if os.getpgid(p.pid) == p.pid \
                else p.terminate()
        except (psutil.Error, OSError):
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cloudtik_emulators.processes")
    parser.add_argument("state_dir")
    parser.add_argument("--kill", action="store_true")
    args = parser.parse_args()
    procs = cloudtik_processes(args.state_dir)
    print(describe(procs) or "nothing running")
    if args.kill and procs:
        kill_all(procs)


if __name__ == "__main__":
    main()
