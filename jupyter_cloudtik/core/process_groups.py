"""Signalling a process group we started, and never one that merely has its number now.

Nodes, jobs, mounts and side-kicks each lead a process group of their own (``setsid``), and
stopping one signals the group.  The group's number is its leader's pid: it stays reserved
while any member of the group lives, but once the group is empty the kernel may hand the
number to any new process, which can then lead a group of its own with it.  A record read
later (a node whose processes died an hour ago, a side-kick's pid from a file) therefore
names *somebody's* group, not necessarily ours.  ``os.killpg`` on such a number killed
other people's work: in CI, ``down`` of a crashed local cluster SIGKILLed the just-booted
servers of another test that had been given the number (they showed as powered off
0.4 s after starting).

So every group signal of the package is decided here, on one rule:

* the number is ours while its leader lives with the start time we recorded (a zombie
  leader still holds it): then the whole group is signalled;
* otherwise only members that prove they are ours (``owned``: e.g. their output goes to
  our log folder, see :func:`writes_under`) are signalled, one by one; with no proof,
  nothing is.

``tests/test_process_groups.py`` reuses a number on purpose (a pid namespace whose next pid
is set) and checks the new owner survives; a test of the tree keeps ``os.killpg`` out of
every other module.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

#: a start time recorded for a pid matches the process's within this: psutil derives it
#: from clock ticks since boot plus the boot time, which each process reads for itself and
#: which moves a little as the clock is adjusted; a stale record names a process that
#: started long before the number was reused, far outside this
START_TOLERANCE = 0.5

Owned = Callable[[psutil.Process], bool]


@dataclass(frozen=True)
class GroupRef:
    """A process group as we started it: the leader's pid and its start time."""

    pgid: int
    started: float | None

    @classmethod
    def of(cls, pid: int) -> GroupRef:
        """The group ``pid`` leads, identified by its start time now (call it right after
        starting the process, or when ``pid`` was just found by a marker of ours)."""
        return cls(pid, start_time(pid))


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def leader_holds_number(ref: GroupRef) -> bool:
    """The recorded leader still exists (alive or a zombie not yet reaped), so the group
    number cannot belong to anybody else."""
    if not ref.pgid or ref.pgid <= 1 or ref.started is None:
        return False
    try:
        return abs(psutil.Process(ref.pgid).create_time() - ref.started) <= START_TOLERANCE
    except psutil.Error:
        return False


def members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose group is ``pgid``."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error, OSError):
            continue
    return out


def writes_under(folder: str | os.PathLike[str]) -> Owned:
    """Proof of ownership: the process's stdout or stderr is a file under ``folder`` (our
    node and job processes log there; an open file survives ``fork`` and ``exec``)."""
    prefix = os.fspath(folder).rstrip("/") + "/"

    def owned(proc: psutil.Process) -> bool:
        for fd in (1, 2):
            try:
                if os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith(prefix):
                    return True
            except OSError:
                continue
        return False

    return owned


def signal_group(ref: GroupRef, sig: int, owned: Owned | None = None) -> int:
    """Send ``sig`` to the group of ``ref`` if it is still ours (see the module's rule);
    returns how many targets were signalled (the group counts as one)."""
    if leader_holds_number(ref):
        try:
            os.killpg(ref.pgid, sig)
            return 1
        except PermissionError:
            return 0
        except ProcessLookupError:  # ours, but it leads no group (a node's child found
            try:                    # by its marker after its leader died): itself
                psutil.Process(ref.pgid).send_signal(sig)
                return 1
            except psutil.Error:
                return 0
    if owned is None:
        return 0
    sent = 0
    for proc in members(ref.pgid):
        try:
            if owned(proc):
                proc.send_signal(sig)
                sent += 1
        except psutil.Error:
            continue
    return sent


def group_running(ref: GroupRef, owned: Owned | None = None) -> bool:
    """Something of the group is still running: a live leader, or a member that is ours."""
    if leader_holds_number(ref):
        try:
            if psutil.Process(ref.pgid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            pass
        return bool(members(ref.pgid))
    return owned is not None and any(_safe(owned, p) for p in members(ref.pgid))


def _safe(owned: Owned, proc: psutil.Process) -> bool:
    try:
        return owned(proc)
    except psutil.Error:
        return False


def terminate_group(ref: GroupRef, grace: float = 2.0, owned: Owned | None = None) -> None:
    """SIGTERM the group, SIGKILL what of it is left after ``grace``; each signal decided
    again by the rule (the leader may end, and its number be reused, while we wait)."""
    if not group_running(ref, owned):
        return
    signal_group(ref, signal.SIGTERM, owned)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_running(ref, owned):
            return
        time.sleep(0.02)
    signal_group(ref, signal.SIGKILL, owned)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and group_running(ref, owned):
        time.sleep(0.02)


def signal_child(proc: Any, sig: int) -> bool:
    """Signal the group of a child we started and have not reaped (``subprocess.Popen`` or
    ``asyncio.subprocess.Process``): until it is reaped, even a dead child holds its
    number.  Once reaped, nothing is sent (the number may be reused)."""
    poll = getattr(proc, "poll", None)
    if (poll() if poll is not None else proc.returncode) is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
