"""The egress proxy's front: the one listening socket, which reads each new connection's first
request head and hands the connection to the worker process of the user whose valid
credentials that head carries (``workers.py``), or to the shared worker.

It does as little as it can per connection (accept, read a head, one credentials check, one
``sendmsg``) and nothing after: a user's later requests on a kept-alive connection, its
bodies, its TLS set-ups and its tunnels never pass through here, so they cannot wait behind
another user's.  What it bounds itself is what happens before a connection is anybody's:
the head must be complete within ``handshake_timeout`` and ``max_header_bytes``, and one
peer address may hold at most ``preauth_connections`` connections not placed yet (over it,
its oldest is closed: the idle ones, an honest client's head comes at once).

The placement is not the authentication: a connection placed with alice's worker is
authenticated again, request by request, by that worker, which knows no token but its
users'.  A head without valid credentials (or not an HTTP/1 request at all) goes to the
shared worker, which answers it exactly as the single proxy did (``407``, anonymous use when
allowed, an error for a malformed head).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket

from .proxy import Limits, ProxyConfig
from .workers import WorkerPool

__all__ = ["Front"]

log = logging.getLogger("jupyter_cloudtik.egress")

# the kernel's accept queue: a deeper one made a new honest connection wait behind a flood
# of queued ones (measured, docs/hub-egress.md "Fairness and keep-alive under load")
BACKLOG = 100


class Front:
    """Accepts, reads first heads, and places connections with the pool's workers."""

    def __init__(self, pool: WorkerPool, limits: Limits, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.pool = pool
        self.limits = limits
        self.host = host
        self.requested_port = port
        self.config = ProxyConfig()
        self.port: int | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        # per peer address, the connections whose head is being read, oldest first
        self._waiting: dict[str, collections.OrderedDict[asyncio.Task, None]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError:
            sock.close()
            raise
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept())
        return self.port

    def set_config(self, config: ProxyConfig) -> None:
        self.config = config

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        if self._sock is not None:
            self._sock.close()
        for t in list(self._tasks):
            t.cancel()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except OSError as e:
                # out of descriptors or a connection reset before accept: go on after a
                # moment (EMFILE would otherwise spin)
                log.warning("egress front: accept failed (%s)", e.strerror or e)
                await asyncio.sleep(0.05)
                continue
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = str(addr[0]) if addr else "?"
            task = asyncio.create_task(self._intake(conn, peer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            waiting = self._waiting.setdefault(peer, collections.OrderedDict())
            waiting[task] = None
            while len(waiting) > self.limits.preauth_connections:
                old, _ = waiting.popitem(last=False)
                log.info("closing the oldest of more than %d unauthenticated connections "
                         "from %s (limit preauth_connections)",
                         self.limits.preauth_connections, peer)
                old.cancel()

    def _placed(self, task: asyncio.Task | None, peer: str) -> None:
        waiting = self._waiting.get(peer)
        if waiting is not None and task is not None:
            waiting.pop(task, None)
            if not waiting:
                del self._waiting[peer]

    async def _intake(self, conn: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        head = bytearray()
        try:
            try:
                async with asyncio.timeout(self.limits.handshake_timeout):
                    while True:
                        data = await loop.sock_recv(conn, 65536)
                        if not data:
                            return
                        head += data
                        # a head that is not an HTTP/1 request line (TLS to the proxy, h2
                        # prior knowledge is still a request line), or as large as a head
                        # may be: the shared worker answers it
                        if not head[:1].isalpha() or b"\r\n\r\n" in head \
                                or len(head) >= self.limits.max_header_bytes:
                            break
            except TimeoutError:
                log.info("closing an unauthenticated connection after %.0fs",
                         self.limits.handshake_timeout)
                return
            self._placed(me, peer)
            ident = self.config.claimed(bytes(head)) if head[:1].isalpha() else None
            user = ident.user if ident is not None else None
            try:
                await self.pool.place(conn, bytes(head), user)
            except (OSError, RuntimeError, TimeoutError, ValueError) as e:
                log.warning("egress front: could not hand a connection of %s to its worker "
                            "(%s): closed", user or peer, type(e).__name__)
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(conn, b"HTTP/1.1 503 Service Unavailable\r\n"
                                            b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            return
        finally:
            self._placed(me, peer)
            conn.close()
