"""How the faces reach the core: a backend with the same calls in every setting.

``CoreBackend`` runs the async core in this process on a background event loop (so it works
the same from a kernel, whose main thread already runs a loop, and from the CLI).  A
backend that talks to a Jupyter server's REST API offers the same methods; ``get_backend``
picks one from the environment, so magics, widgets and the ``Cluster`` API never care.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Protocol, TypeVar

from .core.errors import ConflictError
from .core.models import ClusterInfo
from .core.operations import Event, OperationInfo
from .providers.base import ConnectInfo

T = TypeVar("T")
API_URL_ENV = "CLOUDTIK_API_URL"


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
        if threading.current_thread() is self.thread:
            raise RuntimeError("LoopThread.run called from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Backend(Protocol):
    """What every face may ask; implemented in process and over REST."""

    kind: str

    def start_up(self, config: dict[str, Any] | None, *, name: str | None,
                 workers: int | None, provider: str | None) -> str: ...
    def start_down(self, name: str) -> str: ...
    def start_scale(self, name: str, workers: int, node_type: str | None) -> str: ...
    def operation(self, op_id: str) -> OperationInfo: ...
    def events(self, op_id: str, after: int = 0) -> Iterator[Event]: ...
    def wait(self, op_id: str) -> Any: ...
    def cancel(self, op_id: str) -> OperationInfo: ...
    def operations(self, cluster: str | None = None) -> list[OperationInfo]: ...
    def status(self, name: str) -> ClusterInfo: ...
    def get(self, name: str) -> ClusterInfo: ...
    def list(self, include_stopped: bool = False) -> list[ClusterInfo]: ...
    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]: ...
    def connect_info(self, name: str) -> tuple[str, ConnectInfo]: ...
    def providers(self) -> list[dict[str, Any]]: ...


class CoreBackend:
    """The core in this process."""

    kind = "core"

    def __init__(self, settings=None, manager=None) -> None:
        from .core.cluster_manager import ClusterManager

        self.runner = LoopThread()
        self.manager = manager or ClusterManager(settings=settings)

    def _start(self, coro) -> str:
        return self.runner.run(coro).op_id

    def start_up(self, config=None, *, name=None, workers=None, provider=None) -> str:
        op_id = self._start(self.manager.start_up(
            config, name=name, workers=workers, provider=provider))
        self._maybe_start_reaper(op_id)
        return op_id

    def start_down(self, name: str) -> str:
        return self._start(self.manager.start_down(name))

    def start_scale(self, name: str, workers: int, node_type: str | None = None) -> str:
        return self._start(self.manager.start_scale(name, workers, node_type))

    def operation(self, op_id: str) -> OperationInfo:
        return self.manager.ops.get(op_id)

    def events(self, op_id: str, after: int = 0) -> Iterator[Event]:
        """Events of an operation as they happen, until it is final (blocking iterator)."""
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for ev in self.manager.ops.watch(op_id, after=after):
                    q.put(ev)
            except BaseException as e:  # surface it in the caller's thread
                q.put(e)
            finally:
                q.put(done)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.runner.loop)
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

    def wait(self, op_id: str) -> Any:
        if getattr(self, "_workspaces", None) is not None and op_id in self._workspaces._tasks:
            return self.runner.run(self._workspaces.wait(op_id))
        return self.runner.run(self.manager.wait(op_id))

    def cancel(self, op_id: str) -> OperationInfo:
        return self.runner.run(self.manager.cancel(op_id))

    def operations(self, cluster: str | None = None, limit: int = 50) -> list[OperationInfo]:
        return self.manager.ops.list(
            target=f"cluster:{cluster}" if cluster else None, limit=limit)

    def status(self, name: str) -> ClusterInfo:
        return self.runner.run(self.manager.status(name))

    def get(self, name: str) -> ClusterInfo:
        return self.manager.get(name)

    def list(self, include_stopped: bool = False) -> list[ClusterInfo]:
        return self.manager.list(include_stopped=include_stopped)

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        return self.manager.logs(name, node_id, tail)

    def connect_info(self, name: str) -> tuple[str, ConnectInfo]:
        return self.manager.connect_info(name)

    def providers(self) -> list[dict[str, Any]]:
        return self.manager.providers()

    # workspaces (same store, same operations and events) -------------------------------
    @property
    def workspaces(self):
        if getattr(self, "_workspaces", None) is None:
            from .core.workspace_manager import WorkspaceManager

            self._workspaces = WorkspaceManager(settings=self.manager.settings,
                                                store=self.manager.store,
                                                user=self.manager.user)
        return self._workspaces

    def start_workspace_create(self, name: str, config: dict[str, Any] | None = None,
                               provider: str | None = None) -> str:
        return self._start(self.workspaces.start_create(name, config, provider))

    def start_workspace_delete(self, name: str, delete_storage: bool = True) -> str:
        return self._start(self.workspaces.start_delete(name, delete_storage))

    def workspace_get(self, name: str):
        return self.workspaces.get(name)

    def workspace_list(self, include_deleted: bool = False):
        return self.workspaces.list(include_deleted)

    def workspace_status(self, name: str) -> dict[str, Any]:
        return self.runner.run(self.workspaces.status(name))

    def _maybe_start_reaper(self, op_id: str) -> None:
        from .core.reaper import ensure_reaper

        try:
            ensure_reaper(self.manager.settings, self.manager.store)
        except Exception as e:  # the cluster still works; only idle shutdown is missing
            self.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                  level="warning")


_backends: dict[tuple[str, str], Backend] = {}
_backends_lock = threading.Lock()


def get_backend(settings=None) -> Backend:
    """The backend for this process: the server's REST API inside a Jupyter server kernel
    (``CLOUDTIK_API_URL`` set), else the core in process.  Cached per state folder."""
    url = os.environ.get(API_URL_ENV)
    if url and settings is None:
        key = ("rest", url)
        with _backends_lock:
            if key not in _backends:
                from .rest_client import RestBackend

                _backends[key] = RestBackend.from_environment()
            return _backends[key]
    from .core.settings import default_settings

    settings = settings or default_settings()
    key = ("core", settings.state_dir)
    with _backends_lock:
        if key not in _backends:
            _backends[key] = CoreBackend(settings=settings)
        return _backends[key]


def resolve_name(backend: Backend, name: str | None) -> str:
    """The cluster a command means when no name was given: the only running one."""
    if name:
        return name
    clusters = backend.list()
    if len(clusters) == 1:
        return clusters[0].name
    if not clusters:
        raise ConflictError("there are no clusters; start one with `up`", field="name")
    raise ConflictError(
        f"there are {len(clusters)} clusters ({', '.join(c.name for c in clusters)}); "
        "say which one", field="name")
