"""The one async-to-sync bridge: blocking faces over the async core, on one loop thread.

The core is asynchronous (operations are tasks, the job poller is a task, event streams
are async iterators).  The magics, the CLI, widgets and the ``Cluster`` / ``Job`` /
storage APIs are blocking, and inside a kernel the main thread already runs an event loop,
so they cannot ``asyncio.run`` the core themselves.  As in ipyparallel's ``AsyncFirst``
(``ipyparallel/_async.py``), coroutines written once are given synchronous twins; here
every twin runs its coroutine on **one** loop thread per process (``bridge()``), shared by
the cluster backend, the storage client and the jobs client, so tasks they start (an
operation, the job poller) live on one loop that outlives any single call.

* ``Bridge.run(coro)`` blocks for the result; Ctrl-C in the caller cancels the coroutine.
* ``Bridge.iterate(factory)`` turns an async iterator into a blocking one (events).
* ``blocking("name")`` generates a face method that calls ``self.<target>.name(...)`` (a
  coroutine) through the bridge, optionally mapping the result (``then=``).
* ``choose_client(...)`` is the one place that decides how a face reaches the core: the
  Jupyter server's REST API inside a kernel it started (``CLOUDTIK_API_URL`` set), else the
  core in this process for the state folder; one client per kind and place per process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from . import env

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread, for calling coroutines from sync code."""

    def __init__(self, name: str = "cloudtik-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """The coroutine's result, run on this loop; Ctrl-C (or a timeout) cancels it."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("LoopThread.run called from its own loop")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if timeout is not None:
            try:
                return fut.result(timeout)
            finally:
                fut.cancel()
        try:
            while True:
                try:
                    return fut.result(timeout=0.1)  # short waits keep Ctrl-C responsive
                except concurrent.futures.TimeoutError:
                    continue
        finally:
            fut.cancel()

    def iterate(self, factory: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        """Items of the async iterator ``factory()`` as they come (blocking iterator);
        closing it (or Ctrl-C) stops the async side."""
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for item in factory():
                    q.put(item)
            except BaseException as e:  # surface it in the caller's thread
                q.put(e)
            finally:
                q.put(done)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while True:
                try:
                    item = q.get(timeout=0.1)  # short waits keep Ctrl-C responsive
                except queue.Empty:
                    continue
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            fut.cancel()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Bridge(LoopThread):
    """The process's loop thread.  It lives as long as the process: ``stop`` does nothing
    (a face that is closed must not end the tasks of the others on the same loop)."""

    def stop(self) -> None:
        return None


_bridge: Bridge | None = None
_bridge_lock = threading.Lock()


def bridge() -> Bridge:
    """The one bridge of this process (started on first use)."""
    global _bridge
    with _bridge_lock:
        if _bridge is None or not _bridge.thread.is_alive():
            _bridge = Bridge("cloudtik-bridge")
        return _bridge


def blocking(name: str, *, target: str = "manager",
             then: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """A generated blocking method: ``self.<target>.<name>(*args, **kw)`` awaited on the
    bridge (``then`` maps the result, e.g. a handle to its operation id)."""

    def method(self, *args: Any, **kwargs: Any) -> Any:
        result = bridge().run(getattr(getattr(self, target), name)(*args, **kwargs))
        return then(result) if then is not None else result

    method.__name__ = name
    method.__doc__ = f"Blocking twin of ``{target}.{name}`` (run on the process's bridge)."
    return method


def handle_id(handle: Any) -> str:
    """``then=`` for ``start_*`` twins: the operation id of a handle."""
    return handle.op_id


# REST under a Jupyter server, else the core in this process ------------------------------
_clients: dict[tuple[str, str, str], Any] = {}
_clients_lock = threading.Lock()


def choose_client(kind: str, rest: Callable[[], T], core: Callable[[Any], T],
                  settings: Any = None) -> T:
    """The ``kind`` client of this process.  Inside a kernel started by a Jupyter server
    with the extension (``CLOUDTIK_API_URL`` set) and with no explicit settings: ``rest()``,
    so the server owns every long operation; else ``core(settings)`` for the configured
    state folder.  Cached per kind and place."""
    url = os.environ.get(env.API_URL)
    if url and settings is None:
        key = (kind, "rest", url)
        factory: Callable[[], T] = rest
    else:
        # deferred: start-up (core.settings ~23 ms, loads traitlets, jupyter_core)
        from .settings import default_settings

        settings = settings or default_settings()
        key = (kind, "core", str(settings.state_dir))
        factory = functools.partial(core, settings)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = factory()
        return _clients[key]


def forget_clients(kind: str | None = None) -> list[Any]:
    """Drop the cached clients (of one kind); returns them, for the caller to close."""
    with _clients_lock:
        keys = [k for k in _clients if kind is None or k[0] == kind]
        return [_clients.pop(k) for k in keys]
