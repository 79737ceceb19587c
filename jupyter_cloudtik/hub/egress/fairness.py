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

__all__ = ["OVER_LIMIT_DELAY", "ClientShare", "FairLoop", "fair_reads"]

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

    # seconds: a client that used the loop within this is "active".  Not shorter: a client
    # whose requests are slowed to more than this by an abuser would stop counting, and
    # the abuser would no longer be paced (measured: honest GETs of 3 s with 0.5)
    ACTIVE = 2.0
    SLOW = 0.002   # a read whose handling took longer: the next read of that connection is small
    # seconds of loop time a client that stayed within its share may use at once before it
    # is paced: an honest client's request (a few ms of work in a burst: head, hooks,
    # upstream connection, response) is never held for its own last step; an abuser is
    # always past it
    CREDIT = 0.25

    def __init__(self, addon: EgressAddon) -> None:
        self.addon = addon
        self.share = max(0.01, min(1.0, addon.limits.client_loop_share))
        # connections whose last read was cheap to handle: read in full (64 KiB); the
        # others, new ones included, in small pieces
        self.cheap: weakref.WeakSet[connection.Connection] = weakref.WeakSet()
        self._active: set[str] = set()
        self._counted_at = 0.0

    def _others_active(self, key: str, now: float) -> int:
        """How many clients other than ``key`` are active (counted at most every 20 ms:
        this runs on every step of every connection)."""
        if now - self._counted_at > 0.02:
            since = now - self.ACTIVE
            self._active = {k for k, c in self.addon.clients.items() if c.seen > since}
            self._counted_at = now
        return len(self._active) - (key in self._active)

    def size(self, conn: connection.Connection) -> int:
        """How much to read next from ``conn``: little at first and after a read that was
        expensive (64 KiB of one-byte chunks is one long step of the loop)."""
        return 65535 if conn in self.cheap else 512

    async def pace(self, client: connection.Client) -> asyncio.Lock | None:
        """Before data read for ``client`` is handled: while it is over its share, its
        connections queue (FIFO, one woken at a time) and each waits for the client's next
        turn; the lock returned is released once the data is handled."""
        # a connection that has not authenticated yet is paced on its peer address (on a
        # single-host hub, one bucket for every user's first head): leaving pre-auth
        # reads unpaced and billing them to the user afterwards was measured worse (honest
        # GETs up to 2-11 s instead of ~1 s: a churning client's first reads jumped the
        # queue), see docs/hub-egress.md
        cl = self.addon.client(self.addon.key(client))
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

    def charge(self, client: connection.Client, spent: float, defer: bool = False) -> None:
        """``client``'s connection handler used the loop for ``spent`` (any event: data,
        a hook's completion, a connection opened or closed).  ``defer``: the connection's
        own set-up and tear-down (accepting it, its connect and disconnect hooks); before
        it authenticates that is kept on the connection and billed to its user when it
        does (``bill``), not to its peer address: on a single-host hub the peer bucket
        paces every user's first head, and a flood of new connections billed there held
        an honest user's first request for seconds."""
        if defer:
            st = self.addon.conns.get(client)
            if st is not None and not st.key:
                st.deferred += spent
                return
        self.bill(client, spent)

    def bill(self, client: connection.Client, spent: float) -> None:
        key = self.addon.key(client)
        cl = self.addon.client(key)
        now = time.monotonic()
        cl.seen = now
        others = self._others_active(key, now) if self.share < 1 else 0
        if others:
            # its share is divided by the others active: with the pre-auth bucket of the
            # hub host, an abuser and an honest user, neither of the first two may take
            # half the loop (together they would take all of it)
            share = self.share / others
            cl.next_read = (max(now - self.CREDIT, cl.next_read)
                            + spent * (1.0 / share - 1.0))



_GATE: FairLoop | None = None


class _Steps:
    """Awaits ``coro`` charging the loop time of each of its steps (the time between two of
    its suspensions: what it really took from everyone, never the time it waited) to
    ``client``.  A hook that awaits a look-up, an upstream connection being opened, a
    ``429`` held back for a second: charged what they computed, not how long they took."""

    __slots__ = ("_client", "_defer", "_it")

    def __init__(self, coro, client: connection.Client,  # type: ignore[no-untyped-def]
                 defer: bool = False) -> None:
        self._it = coro.__await__()
        self._client = client
        self._defer = defer

    def __await__(self):  # type: ignore[no-untyped-def]
        return self

    def __iter__(self):  # type: ignore[no-untyped-def]
        return self

    def __next__(self):  # type: ignore[no-untyped-def]
        return self.send(None)

    def send(self, value):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return self._it.send(value)
        finally:
            if _GATE is not None:
                _GATE.charge(self._client, time.perf_counter() - t0, self._defer)

    def throw(self, *exc):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return self._it.throw(*exc)
        finally:
            if _GATE is not None:
                _GATE.charge(self._client, time.perf_counter() - t0, self._defer)

    def close(self) -> None:
        self._it.close()


def fair_reads(gate: FairLoop) -> None:
    """mitmproxy reads every connection as fast as data comes and hands it to its layers
    at once: a client whose reads are expensive (tiny chunks, a flood of requests) takes the
    loop every other client waits on.  Reads of client connections go through ``gate``
    (``FairLoop``): they are taken in small pieces after an expensive one, and a client that
    used more than its share of the loop waits before its data is handled while others are
    active (the reads of its upstream connections count for it too).

    What a client used is measured step by step on every task mitmproxy runs for its
    connection (``_Steps``): the connection's life (accept, hooks, close), its reads, its
    upstream connections (opened, read, closed), the add-ons' hooks and timers.  Charging
    only the handling of data read, and hooks by their wall time capped at 5 ms, left out
    the upstream connections and the accepting of connections (17 s of the 79 s of loop
    time in a profile under a flood of connections) and billed an honest client for the
    time its hooks waited on a look-up (issue 27).  The rest
    is mitmproxy's ``ConnectionHandler.handle_connection`` (11.0.2)."""
    global _GATE
    first = _GATE is None
    _GATE = gate
    if not first:
        return
    from mitmproxy.connection import ConnectionState
    from mitmproxy.proxy import events

    async def _handle_connection(self, connection):  # type: ignore[no-untyped-def]
        cancelled = None
        reader = self.transports[connection].reader
        assert reader
        gate = _GATE
        while True:
            try:
                # not while a hook of this connection's handler is pending: mitmproxy's
                # layers queue what arrives meanwhile (cheap to take, so read 64 KiB at a
                # time) and handle the whole queue in one step when the hook completes:
                # seconds of one-byte chunks in one step of the loop (measured: steps of
                # 0.7-2 s and an honest GET of 26 s under the tiny-chunk upload)
                while self.hook_tasks:
                    await asyncio.wait(list(self.hook_tasks))
                data = await reader.read(gate.size(connection) if gate else 65535)
                if not data:
                    raise OSError("Connection closed by peer.")
                turn = await gate.pace(self.client) if gate is not None else None
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
                # one read handled is one step of the loop: the reader may hold more (up
                # to 128 KiB), and reading it without yielding made a step of seconds of
                # one-byte chunks whose cost was charged (and paced) only after it
                await asyncio.sleep(0)
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

    async def handle_connection(self, connection):  # type: ignore[no-untyped-def]
        if connection is self.client:
            # a task of its own; an upstream connection's runs inside open_connection's
            return await _Steps(_handle_connection(self, connection), self.client)
        return await _handle_connection(self, connection)

    mitm_server.ConnectionHandler.handle_connection = handle_connection

    def steps(name: str) -> None:
        """The task entry ``name`` of mitmproxy's handler, its steps charged."""
        original = getattr(mitm_server.ConnectionHandler, name)

        defer = name == "handle_client"

        async def timed(self, *args):  # type: ignore[no-untyped-def]
            return await _Steps(original(self, *args), self.client, defer)

        timed.__name__ = name
        setattr(mitm_server.ConnectionHandler, name, timed)

    # handle_client: the connection's life (its own reads are handle_connection's task);
    # open_connection: an upstream connection, from the server_connect hook to its close;
    # hook_task: the add-ons' work (credentials, rules, the log line); wakeup: timers
    for name in ("handle_client", "open_connection", "hook_task", "wakeup"):
        steps(name)
