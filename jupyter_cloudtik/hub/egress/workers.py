"""The egress proxy's worker processes: one per authenticated user (up to ``Limits.workers``)
and one shared by every connection that is not placed with a user.

Why processes (issue 27): every client of a single proxy process shares one event loop,
and a client whose traffic is expensive to handle (a body in one-byte chunks, TLS set-ups
dribbled a byte at a time, hundreds of connections) delays everyone else's next step, however
its loop time is accounted (measured: an honest p99 8-20x its quiet value).  A user's own
process is scheduled by the operating system, which shares the CPU between processes; the
honest user's process sleeps until its request arrives and runs at once.

A worker is ``python -m jupyter_cloudtik.hub.egress --worker``: mitmproxy with our add-on,
listening on nothing.  It receives connections over a Unix ``SOCK_SEQPACKET`` pair, one
message per connection (the bytes the front read, and the socket as ``SCM_RIGHTS``), and its
config as JSON lines on stdin like the proxy's (a user's worker gets only its users' client
entries: a token of another user is not valid there).  Its stdout says
``{"worker": "ready"}``, ``{"applied": seq}`` per config and ``{"idle": n}`` once it has held
no connection for ``client_forget_seconds`` after its n-th; the pool then ends it, unless a
connection was handed to it since.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .lines import json_lines
from .proxy import Limits

__all__ = ["Worker", "WorkerPool"]

log = logging.getLogger("jupyter_cloudtik.egress")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
# the package after the interpreter's own site-packages (as the supervisor starts the front)
_BOOT = (f"import sys; sys.path.append({_PACKAGE_ROOT!r}); "
         "from jupyter_cloudtik.hub.egress.__main__ import main; sys.exit(main())")
ACK_TIMEOUT = 10.0
HAND_OVER_TIMEOUT = 5.0
SHARED = "(shared)"


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Worker:
    """One worker process, the users placed with it and what it acknowledged."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process,
                 channel: socket.socket) -> None:
        self.name = name
        self.is_shared = name == SHARED
        self.proc = proc
        self.channel = channel
        self.users: set[str] = set()
        self.sent = 0                # connections handed over
        self.acks: dict[int, asyncio.Future[dict]] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gone = False
        self.reader: asyncio.Task | None = None

    def __repr__(self) -> str:
        return f"<worker {self.name} pid {self.proc.pid}, {len(self.users)} user(s)>"

    async def send_config(self, line: dict[str, Any], seq: int) -> None:
        """Send one config line and wait for its acknowledgement (ValueError if refused)."""
        fut = asyncio.get_running_loop().create_future()
        self.acks[seq] = fut
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(dict(line, seq=seq)) + "\n").encode())
            await self.proc.stdin.drain()
            msg = await asyncio.wait_for(fut, ACK_TIMEOUT)
        finally:
            self.acks.pop(seq, None)
        if "error" in msg:
            raise ValueError(msg["error"])

    async def hand_over(self, sock: socket.socket, head: bytes) -> None:
        """Send the connection (and what was read of it) to the worker; the caller closes
        its own descriptor afterwards (the worker holds the connection then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HAND_OVER_TIMEOUT
        while True:
            try:
                socket.send_fds(self.channel, [head], [sock.fileno()])
                self.sent += 1
                return
            except BlockingIOError:
                # the worker is behind on its intake: wait for room, not the loop
                if loop.time() > deadline:
                    raise TimeoutError(f"{self} took no connection for "
                                       f"{HAND_OVER_TIMEOUT:.0f} s") from None
                room = loop.create_future()
                loop.add_writer(self.channel.fileno(), _resolve, room)
                try:
                    await asyncio.wait_for(room, max(0.01, deadline - loop.time()))
                except TimeoutError:
                    pass
                finally:
                    loop.remove_writer(self.channel.fileno())

    def end(self) -> None:
        """Close its stdin (it exits at EOF) and its channel."""
        self.gone = True
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(OSError):
            self.channel.close()


class WorkerPool:
    """Places connections with workers: a user's with that user's worker (made on its first
    connection, from a spare made ahead), the rest with the shared one; keeps every worker's
    config current; ends idle workers and replaces dead ones."""

    def __init__(self, worker_args: Sequence[str], limits: Limits) -> None:
        self.worker_args = list(worker_args)
        self.limits = limits
        self.config: dict[str, Any] | None = None   # the last applied config line
        self.shared: Worker | None = None
        self.by_user: dict[str, Worker] = {}
        self.workers: list[Worker] = []              # the users' workers
        self._spare: asyncio.Task[Worker] | None = None
        self._lock = asyncio.Lock()                  # config pushes and placements
        self._seq = 0
        self._made = 0
        self._stopping = False

    # -- processes ---------------------------------------------------------------------------
    async def _spawn(self, name: str) -> Worker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _BOOT, "--worker", "--channel-fd", str(theirs.fileno()),
                *self.worker_args, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        w = Worker(name, proc, mine)
        w.reader = asyncio.create_task(self._read(w))
        try:
            await asyncio.wait_for(asyncio.shield(w.ready), 30)
            if self.config is not None:
                await w.send_config(self._config_for(w), self._next_seq())
        except BaseException:
            self._kill(w)
            raise
        return w

    def _kill(self, w: Worker) -> None:
        w.end()
        with contextlib.suppress(ProcessLookupError):
            w.proc.kill()

    async def _read(self, w: Worker) -> None:
        assert w.proc.stdout is not None
        async for msg in json_lines(w.proc.stdout):
            if msg.get("worker") == "ready" and not w.ready.done():
                w.ready.set_result(None)
            elif "idle" in msg:
                self._idle(w, msg["idle"])
            else:
                seq = msg.get("applied", msg.get("seq"))
                fut = w.acks.get(seq) if isinstance(seq, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        code = await w.proc.wait()
        for fut in w.acks.values():
            if not fut.done():
                fut.set_exception(RuntimeError(f"egress worker exited with code {code}"))
        if not w.ready.done():
            w.ready.set_exception(RuntimeError(f"egress worker exited with code {code} "
                                               "before it was ready"))
        ended = w.gone  # ended by us (idle, stop, a config it did not apply)
        self._forget(w)
        self._replace_spare_if(w)
        if not ended and not self._stopping:
            log.warning("egress worker %s exited with code %s; its connections are closed",
                        w.name, code)
            if w is self.shared:
                await self._ensure_shared()

    def _forget(self, w: Worker) -> None:
        w.gone = True
        for u in w.users:
            if self.by_user.get(u) is w:
                del self.by_user[u]
        if w in self.workers:
            self.workers.remove(w)

    def _idle(self, w: Worker, received: int) -> None:
        """The worker held no connection for client_forget_seconds after its ``received``-th:
        end it, unless one was handed to it since (or it is the shared one)."""
        if w is self.shared or w.gone or received != w.sent:
            return
        self._forget(w)
        w.end()
        log.info("forgot %d idle client(s); %d known (their egress worker ended)",
                 len(w.users), len(self.by_user))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _config_for(self, w: Worker) -> dict[str, Any]:
        """A worker's own config: the shared one gets every client (a connection may
        authenticate after its first request there, as with any proxy); a user's worker
        only its users' entries."""
        assert self.config is not None
        if w.is_shared:
            return self.config
        return dict(self.config, clients=[c for c in self.config.get("clients") or []
                                          if c.get("user") in w.users])

    def _ready_spare(self) -> Worker | None:
        """The spare, if it has started (not still starting, failed or cancelled)."""
        t = self._spare
        if t is None or not t.done() or t.cancelled() or t.exception() is not None:
            return None
        return t.result()

    def _replace_spare_if(self, w: Worker) -> None:
        """``w`` is gone: if it was the spare, make another."""
        if self._ready_spare() is w:
            self._spare = None
            self._make_spare()

    async def _respawn_shared(self) -> None:
        """Make the shared worker again; if that fails, say so: until a later try, the
        connections it would take are answered 503 (``place``), never served elsewhere."""
        try:
            self.shared = await self._spawn(SHARED)
        except (OSError, RuntimeError, TimeoutError, ValueError) as e:
            log.warning("egress: the shared worker could not be made again (%s: %s); "
                        "connections without a user's credentials get 503 until it is",
                        type(e).__name__, e)

    async def _ensure_shared(self) -> None:
        """A live shared worker, made again (once, under the lock) if it is gone."""
        if (self.shared is None or self.shared.gone) and not self._stopping:
            async with self._lock:
                if self.shared is None or self.shared.gone:
                    await self._respawn_shared()

    def _make_spare(self) -> None:
        if self._spare is None and not self._stopping \
                and len(self.workers) + 1 <= self.limits.workers:
            self._made += 1
            self._spare = asyncio.create_task(self._spawn(f"w{self._made}"))

    async def start(self) -> None:
        # the spare is made when the first user needs a worker (that user waits for one
        # start, ~0.6 s; then one is kept ahead): a proxy nobody uses costs one worker
        self.shared = await self._spawn(SHARED)

    async def stop(self) -> None:
        self._stopping = True
        if self._spare is not None:
            self._spare.cancel()
            with contextlib.suppress(BaseException):
                w = await self._spare
                self._kill(w)
        for w in [*self.workers, *([self.shared] if self.shared else [])]:
            w.end()
        for w in [*self.workers, *([self.shared] if self.shared else [])]:
            try:
                await asyncio.wait_for(w.proc.wait(), 5)
            except TimeoutError:
                self._kill(w)

    # -- config ------------------------------------------------------------------------------
    async def set_config(self, line: dict[str, Any], users: set[str]) -> None:
        """Apply a new config line to every worker before it counts as applied; a worker
        that does not apply it is ended (it must not serve a revoked token)."""
        async with self._lock:
            self.config = {k: v for k, v in line.items() if k != "seq"}
            for w in list(self.workers):
                gone = w.users - users
                for u in gone:
                    w.users.discard(u)
                    self.by_user.pop(u, None)
            targets = [w for w in [self.shared, *self.workers] if w is not None]
            spare = self._ready_spare()
            if spare is not None:
                targets.append(spare)
            results = await asyncio.gather(
                *(w.send_config(self._config_for(w), self._next_seq()) for w in targets),
                return_exceptions=True)
            for w, r in zip(targets, results, strict=True):
                if isinstance(r, BaseException):
                    log.warning("egress worker %s did not apply the config (%s): ended",
                                w.name, type(r).__name__)
                    self._forget(w)
                    self._kill(w)
                    if w is self.shared:
                        await self._respawn_shared()
                    self._replace_spare_if(w)

    # -- placement ---------------------------------------------------------------------------
    async def _worker_of(self, user: str) -> Worker:
        w = self.by_user.get(user)
        if w is not None and not w.gone:
            return w
        async with self._lock:
            w = self.by_user.get(user)
            if w is not None and not w.gone:
                return w
            if len(self.workers) < self.limits.workers:
                self._make_spare()
            if self._spare is not None:
                spare, self._spare = self._spare, None
                w = await spare
                self.workers.append(w)
                self._make_spare()
            else:
                # every worker is taken: users share them, fewest users first (within one
                # worker, the add-on's per-client shares and loop turns apply)
                w = min(self.workers, key=lambda x: len(x.users))
            w.users.add(user)
            self.by_user[user] = w
            await w.send_config(self._config_for(w), self._next_seq())
            return w

    async def place(self, sock: socket.socket, head: bytes, user: str | None) -> None:
        """Hand ``sock`` (with ``head``, what was read of it) to its worker; the caller
        closes ``sock`` after."""
        if user is None:
            await self._ensure_shared()  # the later try, after a failed _respawn_shared
        w = self.shared if user is None else await self._worker_of(user)
        if w is None or w.gone:
            raise RuntimeError("no egress worker to take the connection")
        await w.hand_over(sock, head)

