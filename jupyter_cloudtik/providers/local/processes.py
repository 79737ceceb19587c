"""Finding, checking and stopping the processes that make up local nodes.

A process is identified by its pid *and* its start time, so a recycled pid is never
mistaken for a node.  Every node process carries ``CLOUDTIK_NODE_ID`` and
``CLOUDTIK_STATE_DIR`` in its environment: if a record is ever lost (a crash between fork
and bookkeeping), ``find_marked_processes`` still finds the process, so nothing is orphaned.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

NODE_ID_ENV = "CLOUDTIK_NODE_ID"
CLUSTER_ENV = "CLOUDTIK_CLUSTER"
STATE_DIR_ENV = "CLOUDTIK_STATE_DIR"


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_alive(pid: int | None, started: float | None = None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def group_rss(pgid: int) -> int:
    total = 0
    for proc in group_members(pgid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def terminate_group(pid: int, started: float | None, grace: float = 2.0) -> None:
    """SIGTERM the node's process group, then SIGKILL whatever is left after ``grace``.

    Node processes lead their own session and group (``setsid``), so the group holds the
    runtime and anything it started (setup commands, a nanny's worker).
    """
    if not is_alive(pid, started):
        _kill_group_quietly(pid, signal.SIGKILL)  # leftovers of a dead leader
        return
    _kill_group_quietly(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid, started) and not _group_has_members(pid):
            return
        time.sleep(0.02)
    _kill_group_quietly(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and is_alive(pid, started):
        time.sleep(0.02)


def _group_has_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return any(p.status() != psutil.STATUS_ZOMBIE for p in group_members(pgid))
    except (ProcessLookupError, PermissionError):
        return False
    except psutil.Error:
        return False


def _kill_group_quietly(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def find_marked_processes(
    state_dir: Path, cluster: str | None = None, node_ids: Iterable[str] | None = None
) -> dict[int, str]:
    """{pid: node_id} of live processes marked as nodes of this state folder.

    Only this user's processes are readable, which is what we want: we can only own
    those.
    """
    wanted = set(node_ids) if node_ids is not None else None
    state = str(state_dir)
    found: dict[int, str] = {}
    me = os.getuid()
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != me:
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        node_id = env.get(NODE_ID_ENV)
        if not node_id or env.get(STATE_DIR_ENV) != state:
            continue
        if cluster is not None and env.get(CLUSTER_ENV) != cluster:
            continue
        if wanted is not None and node_id not in wanted:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        found[proc.pid] = node_id
    return found
