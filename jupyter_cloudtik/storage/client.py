"""A synchronous face on the storage core, for magics, the CLI, widgets and scripts.

It runs :class:`~jupyter_cloudtik.storage.manager.StorageManager` on a background event
loop (as ``session.CoreBackend`` does for clusters), and offers the ``events`` / ``wait`` /
``cancel`` trio that ``progress.follow`` needs to draw bars and turn Ctrl-C into a cancel.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from typing import Any

from ..core.operations import Event, OperationInfo
from ..session import LoopThread
from .catalog import StorageInfo
from .manager import Location, StorageManager


class StorageClient:
    kind = "core"

    def __init__(self, settings=None, manager: StorageManager | None = None) -> None:
        self.runner = LoopThread(name="cloudtik-storage")
        self.manager = manager or StorageManager(settings=settings)

    def _run(self, coro) -> Any:
        return self.runner.run(coro)

    # catalog
    def add(self, name: str, backend: str | None = None, options: dict[str, Any] | None = None,
            **kw: Any) -> StorageInfo:
        return self.manager.add(name, backend, options, **kw)

    def get(self, name: str) -> StorageInfo:
        return self.manager.get(name)

    def list(self) -> list[StorageInfo]:
        return self.manager.list()

    def remove(self, name: str) -> None:
        self._run(self.manager.remove(name))

    def backends(self) -> list[dict[str, Any]]:
        return self.manager.backends()

    def backend_schema(self, backend: str, provider: str | None = None) -> dict[str, Any]:
        return self.manager.backend_schema(backend, provider)

    def mounts(self) -> list[dict[str, Any]]:
        return self.manager.mounts()

    # short commands
    def test(self, name: str) -> dict[str, Any]:
        return self._run(self.manager.test(name))

    def ls(self, where: str | Location, **kw: Any) -> dict[str, Any]:
        return self._run(self.manager.ls(where, **kw))

    # operations
    def start_copy(self, src: str | Location, dst: str | Location, mode: str = "copy") -> str:
        return self._run(self.manager.start_copy(src, dst, mode=mode)).op_id

    def start_mount(self, name: str, mode: str = "fuse") -> str:
        return self._run(self.manager.start_mount(name, mode=mode)).op_id

    def start_unmount(self, name: str) -> str:
        return self._run(self.manager.start_unmount(name)).op_id

    def operation(self, op_id: str) -> OperationInfo:
        return self.manager.ops.get(op_id)

    def events(self, op_id: str, after: int = 0) -> Iterator[Event]:
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for ev in self.manager.ops.watch(op_id, after=after):
                    q.put(ev)
            except BaseException as e:
                q.put(e)
            finally:
                q.put(done)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.runner.loop)
        try:
            while True:
                try:
                    item = q.get(timeout=0.1)
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
        return self._run(self.manager.wait(op_id))

    def cancel(self, op_id: str) -> OperationInfo:
        return self._run(self.manager.cancel(op_id))

    def close(self) -> None:
        self.runner.stop()


_clients: dict[Any, Any] = {}
_lock = threading.Lock()


def get_storage_client(settings=None) -> StorageClient:
    """The storage client of this process: the server's REST API inside a kernel started by
    a Jupyter server with the extension (``CLOUDTIK_API_URL``), else the core in process,
    for this state folder (cached)."""
    import os

    from ..core.settings import default_settings
    from ..session import API_URL_ENV

    url = os.environ.get(API_URL_ENV)
    if url and settings is None:
        with _lock:
            if ("rest", url) not in _clients:
                from .rest import RestStorageClient

                _clients[("rest", url)] = RestStorageClient.from_environment()
            return _clients[("rest", url)]
    settings = settings or default_settings()
    with _lock:
        if settings.state_dir not in _clients:
            _clients[settings.state_dir] = StorageClient(settings=settings)
        return _clients[settings.state_dir]
