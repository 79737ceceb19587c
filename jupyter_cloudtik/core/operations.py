"""Recorded operations and their progress events.

Every long piece of work (cluster up/down/scale, later workspace create, mounts, jobs) is an
operation row with an id, a state and an append-only list of events.  Events carry a global,
increasing id, so a client that reconnects asks for "events after N" and misses nothing.

An operation belongs to the process that runs it (pid + start time + host).  When that
process dies, the next process that looks at the operation sees the owner is gone and marks
it ``failed`` ("interrupted"), which lets a later ``up``/``down`` take over: operations are
reconcilers, so taking over means running again, not resuming a script.

Cancellation is cooperative and works across processes: ``request_cancel`` sets a flag in
the database; the owner checks it at every checkpoint (``OperationContext.checkpoint``), and
an in-process owner is also interrupted at once through its asyncio task.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from .errors import ConflictError, OperationCancelled
from .ids import resolve_row
from .store import Store, dumps, loads

ACTIVE_STATES = ("pending", "running")
FINAL_STATES = ("succeeded", "failed", "cancelled")

EventListener = Callable[["Event"], None]


@dataclass
class Event:
    """One progress event; ``fraction`` is the operation's overall progress in [0, 1]."""

    id: int
    op_id: str
    ts: float
    step: str
    message: str
    fraction: float | None = None
    level: str = "info"
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Target:
    """What an operation works on, e.g. ``Target("cluster", "etl")``.

    Stored (and answered, for compatibility) as the string ``kind:name`` with an optional
    ``/part`` (``storage:data/mount``); every reader uses ``Target.parse`` or the
    operation's ``resource`` instead of splitting the string itself.
    """

    kind: str
    name: str
    part: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" + (f"/{self.part}" if self.part else "")

    @classmethod
    def parse(cls, text: str) -> Target:
        kind, sep, rest = (text or "").partition(":")
        if not sep:
            return cls("", text or "")
        name, slash, part = rest.partition("/")
        if kind == "storage" and slash:
            return cls(kind, name, part)
        return cls(kind, rest)

    def to_dict(self) -> dict[str, str]:
        d = {"kind": self.kind, "name": self.name}
        if self.part:
            d["part"] = self.part
        return d


@dataclass
class OperationInfo:
    id: str
    kind: str
    target: str
    state: str
    params: dict[str, Any]
    reason: str | None
    result: Any
    cancel_requested: bool
    user: str | None
    owner_pid: int | None
    created_at: float
    updated_at: float
    finished_at: float | None

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def resource(self) -> Target:
        """The structured target (``kind``, ``name``)."""
        return Target.parse(self.target)

    @property
    def warnings(self) -> list[str]:
        """What the operation was allowed to do but says loudly (e.g. a cluster that
        oversubscribes this machine): recorded when it started, shown by every face."""
        return list((self.params or {}).get("warnings") or [])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["resource"] = self.resource.to_dict()
        d["warnings"] = self.warnings
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OperationInfo:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


class StartedOperation(str):
    """The id of an operation just started (a ``str``: callers that pass the id on keep
    working), carrying the operation as its start answered it, so a face does not ask
    again for what it was already told (the cluster's name, the operation's target)."""

    info: OperationInfo

    def __new__(cls, info: OperationInfo) -> StartedOperation:
        obj = super().__new__(cls, info.id)
        obj.info = info
        return obj


def started_info(backend: Any, op_id: str) -> OperationInfo:
    """The operation ``op_id`` as its start answered it, else as the backend reads it."""
    info = getattr(op_id, "info", None)
    return info if isinstance(info, OperationInfo) else backend.operation(op_id)


def _process_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def owner_alive(pid: int | None, host: str | None, started: float | None) -> bool:
    """Is the process that owns an operation still the same live process?"""
    if pid is None:
        return False
    if host and host != socket.gethostname():
        return True  # cannot check another host's processes; trust the record
    now_started = _process_start_time(pid)
    if now_started is None:
        return False
    if started is not None and abs(now_started - started) > 1.0:
        return False  # the pid was reused by another process
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _StoreRedactor:
    """The state folder's secret store's live redactor, made on first use (most
    operations emit nothing a secret could be in, and many processes never emit)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._live: Callable[[str], str | None] | None = None

    def __call__(self, text: str) -> str | None:
        if not text:
            return text
        if self._live is None:
            # deferred: start-up (core.secrets ~22 ms, loads traitlets, cryptography)
            from .secrets import SecretStore

            self._live = SecretStore(self._store).live_redactor()
        return self._live(text)


class Operations:
    """Creates, updates and reads operations and events in the store."""

    def __init__(self, store: Store,
                 redact: Callable[[str], str | None] | None = None) -> None:
        self.store = store
        #: applied to every event message and finish reason before it is stored or shown:
        #: a message quoting what a cloud, a system or a copy answered may hold a
        #: credential of this state folder, whichever feature emits it (default: every
        #: value of the folder's secret store, ``SecretStore.live_redactor``)
        self.redact = redact if redact is not None else _StoreRedactor(store)
        self._listeners: list[EventListener] = []
        self._listeners_lock = threading.Lock()

    # listeners (same process) ---------------------------------------------------------
    def add_listener(self, listener: EventListener) -> None:
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _notify(self, event: Event) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a broken view must not break the operation
                pass

    # life cycle -------------------------------------------------------------------
    def start(
        self,
        kind: str,
        target: str,
        params: dict[str, Any] | None = None,
        user: str | None = None,
        exclusive: bool = True,
    ) -> OperationInfo:
        """Record a new running operation owned by this process.

        With ``exclusive``, refuse when another live operation works on the same target;
        operations whose owner died are marked interrupted first.
        """
        now = time.time()
        op_id = uuid.uuid4().hex[:12]
        pid = os.getpid()
        with self.store.transaction() as conn:
            if exclusive:
                active = self._active_for(conn, target)
                if active:
                    op = active[0]
                    raise ConflictError(
                        f"{target} is busy with operation {op.id} ({op.kind}, started "
                        f"{time.strftime('%H:%M:%S', time.localtime(op.created_at))}); "
                        f"wait for it or cancel it",
                        field="name",
                        op_id=op.id,
                    )
            conn.execute(
                "INSERT INTO operations (id, kind, target, params, state, owner_pid, owner_host,"
                " owner_started, user, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (
                    op_id, kind, target, dumps(params or {}), pid, socket.gethostname(),
                    _process_start_time(pid), user, now, now,
                ),
            )
        self.emit(op_id, "start", f"{kind} {target}", 0.0,
                  data={"kind": kind, "resource": Target.parse(target).to_dict()})
        return self.get(op_id)

    def emit(
        self,
        op_id: str,
        step: str,
        message: str,
        fraction: float | None = None,
        level: str = "info",
        data: dict[str, Any] | None = None,
    ) -> Event:
        now = time.time()
        if self.redact is not None:
            message = self.redact(message) or ""
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        with self.store.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO events (op_id, ts, step, message, fraction, level, data)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (op_id, now, step, message, fraction, level, dumps(data or {})),
            )
            conn.execute("UPDATE operations SET updated_at = ? WHERE id = ?", (now, op_id))
        event = Event(cur.lastrowid, op_id, now, step, message, fraction, level, data or {})
        self._notify(event)
        return event

    def finish(
        self, op_id: str, state: str, reason: str | None = None, result: Any = None
    ) -> OperationInfo:
        assert state in FINAL_STATES, state
        now = time.time()
        if self.redact is not None and reason:
            reason = self.redact(reason)
        message = {"succeeded": "done", "cancelled": "cancelled"}.get(state, reason or state)
        if state != "succeeded" and reason:
            message = reason
        self.emit(
            op_id, state, message, 1.0 if state == "succeeded" else None,
            level="error" if state == "failed" else "info",
        )
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE operations SET state = ?, reason = ?, result = ?, updated_at = ?,"
                " finished_at = ? WHERE id = ?",
                (state, reason, dumps(result), now, now, op_id),
            )
        return self.get(op_id)

    def adopt(self, op_id: str, message: str | None = None) -> OperationInfo | None:
        """Make this process the owner of an operation whose work outlives processes.

        For work that goes on elsewhere (an HPC job runs on its system whether or not the
        kernel that submitted it lives), whoever watches it next takes the operation over:
        an active one whose owner is gone, or one that a reader marked "interrupted"
        because its owner was gone.  Returns None (and changes nothing) when the
        operation finished otherwise or another live process owns it.
        """
        now = time.time()
        pid = os.getpid()
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone()
            if row is None:
                return None
            interrupted = row["state"] == "failed" and (row["reason"] or "").startswith(
                "interrupted:")
            if row["state"] not in ACTIVE_STATES and not interrupted:
                return None
            if row["owner_pid"] == pid and row["owner_host"] == socket.gethostname():
                return _row_to_op(row)
            if not interrupted and owner_alive(
                    row["owner_pid"], row["owner_host"], row["owner_started"]):
                return None
            conn.execute(
                "UPDATE operations SET state = 'running', reason = NULL, finished_at = NULL,"
                " owner_pid = ?, owner_host = ?, owner_started = ?, updated_at = ?"
                " WHERE id = ?",
                (pid, socket.gethostname(), _process_start_time(pid), now, op_id),
            )
        self.emit(op_id, "adopt", message or f"taken over by process {pid}")
        return self.get(op_id)

    def request_cancel(self, op_id: str) -> OperationInfo:
        op = self.get(op_id)
        if op.done:
            return op
        op_id = op.id  # a prefix was resolved
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE operations SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                (time.time(), op_id),
            )
        self.emit(op_id, "cancel", "cancellation requested")
        self._reap_if_orphaned(op_id)
        return self.get(op_id)

    def cancel_requested(self, op_id: str) -> bool:
        row = self.store.query_one(
            "SELECT cancel_requested FROM operations WHERE id = ?", (op_id,)
        )
        return bool(row and row[0])

    # reading --------------------------------------------------------------------------
    def get(self, op_id: str, user: str | None = None) -> OperationInfo:
        """The operation ``op_id`` names (a whole id, or the start of one); with ``user``,
        among that user's operations only, and another user's operation is "no operation"
        exactly like a missing one (``core.ids``).

        An active operation whose owner is gone is marked interrupted first, so a reader
        (a client polling ``GET operations/{id}`` after the server that ran it was killed)
        sees it end instead of "running" forever."""
        row = resolve_row(
            self.store, "operations", op_id, user=user, field="op_id",
            missing="no operation with id '{id}'",
            ambiguous="operation: '{id}' matches several of your operations "
                      "({candidates}); give more of the id")
        if self._orphaned(row):
            self._reap_if_orphaned(row["id"])
            row = self.store.query_one("SELECT * FROM operations WHERE id = ?", (row["id"],))
        return _row_to_op(row)

    @staticmethod
    def _orphaned(row) -> bool:
        return row["state"] in ACTIVE_STATES and not owner_alive(
            row["owner_pid"], row["owner_host"], row["owner_started"])

    def list(
        self, target: str | None = None, active_only: bool = False, limit: int = 100,
        user: str | None = None,
    ) -> list[OperationInfo]:
        sql = "SELECT * FROM operations"
        clauses, params = [], []
        if target is not None:
            clauses.append("target = ?")
            params.append(target)
        if user is not None:
            clauses.append("user = ?")
            params.append(user)
        if active_only:
            clauses.append("state IN ('pending', 'running')")
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY created_at DESC LIMIT ?"
        params.append(limit)
        rows = self.store.query(sql, params)
        orphans = [r["id"] for r in rows if self._orphaned(r)]
        if orphans:  # as in get(): what a dead process left "running" has ended
            for op_id in orphans:
                self._reap_if_orphaned(op_id)
            rows = self.store.query(sql, params)
        return [_row_to_op(r) for r in rows]

    def active_for(self, target: str) -> list[OperationInfo]:
        with self.store.transaction() as conn:
            return self._active_for(conn, target)

    def _active_for(self, conn, target: str) -> list[OperationInfo]:
        rows = conn.execute(
            "SELECT * FROM operations WHERE target = ? AND state IN ('pending', 'running')",
            (target,),
        ).fetchall()
        alive = []
        for row in rows:
            if owner_alive(row["owner_pid"], row["owner_host"], row["owner_started"]):
                alive.append(_row_to_op(row))
            else:
                self._mark_interrupted(conn, row["id"], row["owner_pid"])
        return alive

    def _reap_if_orphaned(self, op_id: str) -> None:
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone()
            if row and row["state"] in ACTIVE_STATES and not owner_alive(
                row["owner_pid"], row["owner_host"], row["owner_started"]
            ):
                self._mark_interrupted(conn, op_id, row["owner_pid"])

    def _mark_interrupted(self, conn, op_id: str, pid: int | None) -> None:
        now = time.time()
        reason = f"interrupted: the process that ran it (pid {pid}) is gone"
        conn.execute(
            "INSERT INTO events (op_id, ts, step, message, level) VALUES (?, ?, 'failed', ?,"
            " 'error')",
            (op_id, now, reason),
        )
        conn.execute(
            "UPDATE operations SET state = 'failed', reason = ?, updated_at = ?, finished_at = ?"
            " WHERE id = ?",
            (reason, now, now, op_id),
        )

    def events(self, op_id: str | None = None, after: int = 0, limit: int = 1000,
               user: str | None = None) -> list[Event]:
        if op_id is None and user is not None:  # one user's operations (hub sidekick)
            rows = self.store.query(
                "SELECT e.* FROM events e JOIN operations o ON o.id = e.op_id"
                " WHERE e.id > ? AND o.user = ? ORDER BY e.id LIMIT ?", (after, user, limit))
        elif op_id is None:
            rows = self.store.query(
                "SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
            )
        else:
            rows = self.store.query(
                "SELECT * FROM events WHERE op_id = ? AND id > ? ORDER BY id LIMIT ?",
                (op_id, after, limit),
            )
        return [_row_to_event(r) for r in rows]

    def last_event_id(self, user: str | None = None) -> int:
        """The newest event's id (with ``user``: of that user's operations only, so one
        user of a shared state folder learns nothing of the others' activity)."""
        if user is None:
            row = self.store.query_one("SELECT MAX(id) FROM events")
        else:
            row = self.store.query_one(
                "SELECT MAX(e.id) FROM events e JOIN operations o ON o.id = e.op_id"
                " WHERE o.user = ?", (user,))
        return int(row[0] or 0)

    async def watch(
        self, op_id: str, after: int = 0, poll_interval: float = 0.25
    ) -> AsyncIterator[Event]:
        """Yield the events of ``op_id`` after ``after`` until the operation is final.

        Events from this process arrive at once (listener); those written by another
        process are picked up by polling the store.
        """
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_event(ev: Event) -> None:
            if ev.op_id == op_id:
                loop.call_soon_threadsafe(wake.set)

        self.add_listener(on_event)
        try:
            last = after
            while True:
                for ev in self.events(op_id, after=last):
                    last = ev.id
                    yield ev
                op = self.get(op_id)
                if op.done:
                    for ev in self.events(op_id, after=last):
                        last = ev.id
                        yield ev
                    return
                if op.owner_pid != os.getpid():
                    self._reap_if_orphaned(op_id)
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), poll_interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.remove_listener(on_event)

    async def watch_all(
        self, after: int = 0, poll_interval: float = 0.25, batch: int = 500
    ) -> AsyncIterator[Event]:
        """Yield the events of every operation after ``after``, without end.

        For live views of everything that happens (the side panel): the consumer stops by
        closing the iterator.  Like ``watch``, events from this process arrive at once and
        those of other processes within ``poll_interval``.
        """
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_event(_ev: Event) -> None:
            loop.call_soon_threadsafe(wake.set)

        self.add_listener(on_event)
        try:
            last = after
            while True:
                wake.clear()
                events = self.events(after=last, limit=batch)
                for ev in events:
                    last = ev.id
                    yield ev
                if len(events) == batch:
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), poll_interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.remove_listener(on_event)

    def prune(self, older_than_seconds: float) -> int:
        """Forget finished operations (and their events) older than the given age."""
        cutoff = time.time() - older_than_seconds
        with self.store.transaction() as conn:
            cur = conn.execute(
                "DELETE FROM operations WHERE finished_at IS NOT NULL AND finished_at < ?",
                (cutoff,),
            )
            return cur.rowcount


class OperationContext:
    """What a running operation uses to report progress and notice cancellation."""

    def __init__(self, ops: Operations, op_id: str) -> None:
        self.ops = ops
        self.op_id = op_id
        self._last_check = 0.0
        self.fraction = 0.0

    def progress(
        self,
        step: str,
        message: str,
        fraction: float | None = None,
        level: str = "info",
        **data: Any,
    ) -> Event:
        if fraction is not None:
            self.fraction = fraction
        return self.ops.emit(self.op_id, step, message, fraction, level, data)

    def checkpoint(self) -> None:
        """Raise ``OperationCancelled`` if someone asked to cancel this operation."""
        now = time.monotonic()
        if now - self._last_check < 0.05:
            return
        self._last_check = now
        if self.ops.cancel_requested(self.op_id):
            raise OperationCancelled("cancelled by request")


def _row_to_op(row) -> OperationInfo:
    return OperationInfo(
        id=row["id"],
        kind=row["kind"],
        target=row["target"],
        state=row["state"],
        params=loads(row["params"], {}),
        reason=row["reason"],
        result=loads(row["result"]),
        cancel_requested=bool(row["cancel_requested"]),
        user=row["user"],
        owner_pid=row["owner_pid"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _row_to_event(row) -> Event:
    return Event(
        id=row["id"],
        op_id=row["op_id"],
        ts=row["ts"],
        step=row["step"],
        message=row["message"],
        fraction=row["fraction"],
        level=row["level"],
        data=loads(row["data"], {}),
    )
