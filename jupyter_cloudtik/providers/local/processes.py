"""Finding, checking and stopping the processes that make up local nodes.

A process is identified by its pid *and* its start time, so a recycled pid is never
mistaken for a node.  Every node process writes its output to its node folder's log: if a
record is ever lost (a crash between fork and bookkeeping), ``find_marked_processes`` still
finds the process by that open file, so nothing is orphaned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from ...core import env

NODE_ID_ENV = env.NODE_ID
CLUSTER_ENV = env.CLUSTER
STATE_DIR_ENV = env.STATE_DIR


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


def node_of_process(pid: int, nodes_dir: str) -> str | None:
    """The node id a process belongs to, read from where its stdout/stderr point.

    Node processes (and everything they start) write to ``<nodes_dir>/<node_id>/node.log``;
    an open file is a marker that survives ``fork`` (unlike the environment, which /proc
    shows as it was at ``exec``) and cannot be forgotten by a crash between fork and
    bookkeeping.
    """
    prefix = nodes_dir.rstrip("/") + "/"
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            return target[len(prefix):].split("/", 1)[0]
    return None


def find_marked_processes(
    state_dir: Path, cluster: str | None = None, node_ids: Iterable[str] | None = None
) -> dict[int, str]:
    """{pid: node_id} of live processes that belong to nodes of this state folder.

    Only this user's processes are readable, which is what we want: we can only own
    those.  ``cluster`` filters by the node id's prefix (ids are ``<cluster>-<kind>-<hex>``).
    """
    wanted = set(node_ids) if node_ids is not None else None
    nodes_dir = str(Path(state_dir) / "local" / "nodes")
    found: dict[int, str] = {}
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        node_id = node_of_process(proc.pid, nodes_dir)
        if node_id is None:
            continue
        if cluster is not None and not (
            node_id.startswith(f"{cluster}-head-") or node_id.startswith(f"{cluster}-worker-")
        ):
            continue
        if wanted is not None and node_id not in wanted:
            continue
        found[proc.pid] = node_id
    return found
