"""A synchronous face on the storage core, for magics, the CLI, widgets and scripts.

It runs :class:`~jupyter_cloudtik.storage.manager.StorageManager` on the process's one
loop thread (``core.bridge``, shared with ``clusters.client.CoreBackend`` and the jobs client),
and offers the ``events`` / ``wait`` / ``cancel`` trio that ``progress.follow`` needs to
draw bars and turn Ctrl-C into a cancel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..core.bridge import blocking, bridge, choose_client, handle_id
from ..core.operations import Event, OperationInfo
from .catalog import StorageInfo
from .manager import Location, StorageManager


class StorageClient:
    """The storage manager's calls, blocking (twins generated on the process's bridge)."""

    kind = "core"

    def __init__(self, settings=None, manager: StorageManager | None = None) -> None:
        self.runner = bridge()
        self.manager = manager or StorageManager(settings=settings)

    # catalog
    def add(self, name: str, backend: str | None = None, options: dict[str, Any] | None = None,
            **kw: Any) -> StorageInfo:
        return self.manager.add(name, backend, options, **kw)

    def check_add(self, name: str, backend: str | None = None,
                  options: dict[str, Any] | None = None, *, ask: list[str] | None = None,
                  **kw: Any) -> StorageInfo:
        """What ``add`` would record, checked the same way, saved nowhere; ``ask``: the
        options whose values are not known yet."""
        return self.manager.add(name, backend, options, dry_run=True, ask=ask, **kw)

    def get(self, name: str) -> StorageInfo:
        return self.manager.get(name)

    def list(self) -> list[StorageInfo]:
        return self.manager.list()

    remove = blocking("remove")

    def backends(self) -> list[dict[str, Any]]:
        return self.manager.backends()

    def backend_schema(self, backend: str, provider: str | None = None) -> dict[str, Any]:
        return self.manager.backend_schema(backend, provider)

    def mounts(self) -> list[dict[str, Any]]:
        return self.manager.mounts()

    # short commands
    test = blocking("test")
    ls = blocking("ls")

    # operations
    def start_copy(self, src: str | Location, dst: str | Location, mode: str = "copy") -> str:
        return self.runner.run(self.manager.start_copy(src, dst, mode=mode)).op_id

    def start_mount(self, name: str, mode: str = "fuse") -> str:
        return self.runner.run(self.manager.start_mount(name, mode=mode)).op_id

    start_unmount = blocking("start_unmount", then=handle_id)

    def operation(self, op_id: str) -> OperationInfo:
        return self.manager.ops.get(op_id)

    def events(self, op_id: str, after: int = 0) -> Iterator[Event]:
        return self.runner.iterate(lambda: self.manager.ops.watch(op_id, after=after))

    wait = blocking("wait")
    cancel = blocking("cancel")

    def close(self) -> None:
        """Nothing to stop: the bridge is the process's (kept for callers that close)."""


def get_storage_client(settings=None) -> StorageClient:
    """The storage client of this process: the server's REST API inside a kernel started by
    a Jupyter server with the extension (``CLOUDTIK_API_URL``), else the core in process,
    for this state folder (cached)."""

    def rest():
        # deferred: start-up (storage.rest ~37 ms, loads requests, urllib3)
        from .rest import RestStorageClient

        return RestStorageClient.from_environment()

    return choose_client("storage", rest, lambda s: StorageClient(settings=s), settings)
