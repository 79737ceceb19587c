"""Per-client fairness of the proxy's one event loop (issue 27): each client's shares of
what all clients share (name look-ups, TLS set-ups, connections: ``ClientShare``), and the
bookkeeping of loop time that makes a client whose reads are expensive (a body in one-byte
chunks, a flood of requests) wait for its own turn while others are served (``FairLoop``,
wired into mitmproxy's connection handler by ``fair_reads``)."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import TYPE_CHECKING

from mitmproxy import connection
from mitmproxy.proxy import server as mitm_server

from .proxy import Limits

if TYPE_CHECKING:
    from .addon import EgressAddon

__all__ = ["HOOK_CHARGE_CAP", "OVER_LIMIT_DELAY", "ClientShare", "FairLoop", "fair_reads"]

# a connection over its client's client_connections is answered 429 after this long: a
# client that reconnects at once cannot turn refusals into work the loop does for everyone
OVER_LIMIT_DELAY = 1.0


class ClientShare:
    """One client's shares of what all clients share (see ``Limits``)."""

    def __init__(self, limits: Limits) -> None:
        self.lookups = asyncio.Semaphore(limits.client_lookups)
        self.handshakes = asyncio.Semaphore(limits.client_handshakes)
        self.connections = 0
        self.next_read = 0.0   # its connections' next read waits until then (loop share)
        self.turn = asyncio.Lock()  # its connections take turns (FIFO) while it is paced
        self.seen = 0.0        # its last read


class FairLoop:
    """Per-client bookkeeping of the event loop: one client's expensive reads (a body in
    one-byte chunks, a flood of requests over many connections) are paid for by waiting
    before its next read while other clients are active, and read in small pieces, so no
    single step of the loop takes long.  Work-conserving: a client alone is never held."""

    ACTIVE = 0.5   # seconds: a client that read within this is "active"
    SLOW = 0.002   # a read whose handling took longer: the next read of that connection is small

    def __init__(self, addon: EgressAddon) -> None:
        self.addon = addon
        self.wait = 1.0 / max(0.01, min(1.0, addon.limits.client_loop_share)) - 1.0
        # connections whose last read was cheap to handle: read in full (64 KiB); the
        # others, new ones included, in small pieces
        self.cheap: weakref.WeakSet[connection.Connection] = weakref.WeakSet()

    def _others_active(self, key: str, now: float) -> bool:
        return any(k != key and c.seen > now - self.ACTIVE
                   for k, c in self.addon.clients.items())

    def size(self, conn: connection.Connection) -> int:
        """How much to read next from ``conn``: little at first and after a read that was
        expensive (64 KiB of one-byte chunks is one long step of the loop)."""
        return 65535 if conn in self.cheap else 2048

    def pace_key(self, client: connection.Client, data: bytes) -> str:
        """Whose turn a read of ``client`` waits for.  An authenticated connection: its
        user's.  One that has not authenticated yet: the user whose valid credentials its
        head carries, if the head holds a whole ``Proxy-Authorization`` line, else its peer
        address.  Why: on a single-host hub every user's server connects from 127.0.0.1,
        and a peer bucket for first heads put an honest user's first request in the queue
        of another user's reconnect churn (6.4 s in CI under many-connections).  A claim
        is only believed with the right token (the same check the request gets after), so
        nobody can queue in another user's bucket; leaving first reads unpaced was measured
        worse (a churning client's first reads jumped the queue), see docs/hub-egress.md."""
        key = self.addon.key(client)
        if not key.startswith("peer:"):
            return key
        user = self.addon.claimed_user(data)
        return f"user:{user}" if user is not None else key

    async def pace(self, client: connection.Client, data: bytes = b"") -> asyncio.Lock | None:
        """Before data read for ``client`` is handled: while it is over its share, its
        connections queue (FIFO, one woken at a time) and each waits for the client's next
        turn; the lock returned is released once the data is handled."""
        cl = self.addon.client(self.pace_key(client, data))
        if cl.next_read - time.monotonic() <= 0.001 and not cl.turn.locked():
            return None
        await cl.turn.acquire()
        try:
            delay = cl.next_read - time.monotonic()
            if delay > 0.001:
                await asyncio.sleep(delay)
        except BaseException:
            cl.turn.release()
            raise
        return cl.turn

    def after(self, conn: connection.Connection, spent: float) -> None:
        """A read of ``conn`` took ``spent`` to handle: the next one is small if it was
        expensive."""
        if spent > self.SLOW:
            self.cheap.discard(conn)
        else:
            self.cheap.add(conn)

    def charge(self, client: connection.Client, spent: float) -> None:
        """``client``'s connection handler used the loop for ``spent`` (any event: data,
        a hook's completion, a connection opened or closed)."""
        key = self.addon.key(client)
        cl = self.addon.client(key)
        now = time.monotonic()
        cl.seen = now
        if self.wait and self._others_active(key, now):
            cl.next_read = max(now, cl.next_read) + spent * self.wait



_GATE: FairLoop | None = None
# a hook is charged its wall time up to this (beyond it, it was waiting, not working)
HOOK_CHARGE_CAP = 0.005


def fair_reads(gate: FairLoop) -> None:
    """mitmproxy reads every connection as fast as data comes and hands it to its layers
    at once: a client whose reads are expensive (tiny chunks, a flood of requests) takes the
    loop every other client waits on.  Reads of client connections go through ``gate``
    (``FairLoop``): they are taken in small pieces after an expensive one, and a client that
    used more than its share of the loop waits before its data is handled while others are
    active (the reads of its upstream connections count for it too).  The rest is
    mitmproxy's ``ConnectionHandler.handle_connection`` (11.0.2)."""
    global _GATE
    first = _GATE is None
    _GATE = gate
    if not first:
        return
    from mitmproxy.connection import ConnectionState
    from mitmproxy.proxy import events

    async def handle_connection(self, connection):  # type: ignore[no-untyped-def]
        cancelled = None
        reader = self.transports[connection].reader
        assert reader
        gate = _GATE
        while True:
            try:
                data = await reader.read(gate.size(connection) if gate else 65535)
                if not data:
                    raise OSError("Connection closed by peer.")
                turn = await gate.pace(self.client, data) if gate is not None else None
            except OSError:
                break
            except asyncio.CancelledError as e:
                cancelled = e
                break
            try:
                t0 = time.perf_counter()
                await self.server_event(events.DataReceived(connection, data))
                if gate is not None:
                    gate.after(connection, time.perf_counter() - t0)
            finally:
                if turn is not None:
                    turn.release()
            try:
                await self.drain_writers()
            except asyncio.CancelledError as e:
                cancelled = e
                break

        if cancelled is None and connection.transport_protocol == "tcp":
            connection.state &= ~ConnectionState.CAN_READ
        else:
            connection.state = ConnectionState.CLOSED

        await self.server_event(events.ConnectionClosed(connection))

        if connection.state is ConnectionState.CAN_WRITE:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError as e:
                cancelled = e

        try:
            writer = self.transports[connection].writer
            assert writer
            writer.close()
        except OSError:
            pass
        self.transports.pop(connection)

        if cancelled:
            raise cancelled

    mitm_server.ConnectionHandler.handle_connection = handle_connection
    original_event = mitm_server.ConnectionHandler.server_event

    async def server_event(self, event):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            await original_event(self, event)
        finally:
            if _GATE is not None:
                _GATE.charge(self.client, time.perf_counter() - t0)

    mitm_server.ConnectionHandler.server_event = server_event

    async def hook_task(self, hook):  # type: ignore[no-untyped-def]
        # the add-ons' work for a hook is the client's too (ours: credentials, rules, the
        # log line); its wall time, capped, since it may await a look-up
        t0 = time.perf_counter()
        await self.handle_hook(hook)
        if _GATE is not None:
            _GATE.charge(self.client, min(time.perf_counter() - t0, HOOK_CHARGE_CAP))
        if hook.blocking:
            await self.server_event(events.HookCompleted(hook))

    mitm_server.ConnectionHandler.hook_task = hook_task
