"""Storage routes of the server extension: catalog, test, browse, transfers, mounts.

One ``StorageManager`` per server (``ctx.feature("storage")``), its operations on the
server's loop, its mount supervisor started with the server (mounts wanted before a
restart come back) and told to unmount on shutdown.  Answers never carry secret values
(``"<secret>"`` instead); local paths (transfers, mount paths) are resolved by the
server's location policy (``core.locations``): inside its root folder.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from ..core.errors import ConfigError
from ..core.locations import check_text
from ..core.operations import OperationInfo
from .manager import Location, StorageManager
from .rclone import StorageError

NAME = r"(?P<name>[^/]+)"
BACKEND = r"(?P<backend>[^/]+)"


def _manager(ctx) -> Any:
    app = ctx.serverapp
    storage_config = getattr(getattr(app, "config", None), "Storage", {})
    manager = StorageManager(settings=ctx.settings, store=ctx.store)
    if "working_dir" not in storage_config and getattr(app, "root_dir", None):
        # mounts and local paths live in what the user sees in JupyterLab's file browser
        manager.storage_settings.working_dir = app.root_dir
    manager.locations = ctx.locations  # the server's root, as for every feature
    return manager


def startup(ctx) -> None:
    """Server start: mounts that were wanted before a restart are mounted again."""
    ctx.feature("storage", _manager)


def shutdown(ctx) -> None:
    """Server stop: unmount everything (still wanted: the next start brings them back)."""
    manager = ctx.started("storage")
    if manager is not None:
        manager.shutdown()


class _StorageHandler(CloudTikHandler):
    @property
    def storage(self):
        return self.ctx.feature("storage", _manager)

    def accepted(self, op: OperationInfo, storage: str | None) -> None:
        self.set_header("Location", self.api_path("operations", op.id))
        self.write_json({"operation": op.to_dict(), "storage": storage}, status=202)


class StoragesHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every storage (secret options as "<secret>") with its mount state."""
        self.write_json({"storages": [s.to_dict() for s in self.storage.list()]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Add a storage; options are checked against rclone's schema of the backend."""
        info = _add(self.storage, self.json_body("StorageCreate"))
        self.set_header("Location", self.api_path("storages", info.name))
        self.write_json(info.to_dict(), status=201)


def _add(storage: Any, body: dict[str, Any], *, dry_run: bool = False,
         ask: list[str] | None = None) -> Any:
    """A StorageCreate body, added (or, with ``dry_run``, checked the same way)."""
    extra = {"dry_run": True, "ask": ask} if dry_run else {}
    return storage.add(
        body["name"], body.get("backend"), body.get("options") or {}, url=body.get("url"),
        source=body.get("source"), read_only=body.get("read_only", True),
        mount_path=body.get("mount_path"), vfs_cache_mode=body.get("vfs_cache_mode"),
        description=body.get("description") or "", replace=bool(body.get("replace")),
        **extra)


class StorageChecksHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Check an add without making it: everything ``POST storages`` checks, by the same
        code, and nothing is saved.  It takes no secret values, only the names of the
        options that will be asked for (``ask``), so the kernel token may call it:
        ``%storage add`` in a notebook reports a typo before it shows the form in which
        the user types the secrets (which then go from the browser to ``POST storages``)."""
        body = self.json_body("StorageCheck")
        ask = body.get("ask") or []
        both = [k for k in ask if k in (body["storage"].get("options") or {})]
        if both:
            raise ConfigError(f"options.{both[0]}: asked for, so it takes no value here",
                              field=f"options.{both[0]}", value=both[0])
        info = _add(self.storage, body["storage"], dry_run=True, ask=ask)
        given = [k for k in info.secret_options if k not in ask]
        if given:
            key = given[0]
            raise ConfigError(
                f"options.{key}: a secret option; a check takes no secret values, only the "
                f"names of the options that will be asked for (in a notebook: --ask {key})",
                field=f"options.{key}", value=key)
        self.write_json({"storage": info.to_dict(), "ask": ask})


class StorageHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.write_json(self.storage.get(name).to_dict())

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        """Unmount (if mounted) and forget the storage and its credentials."""
        await self.storage.remove(name)
        self.write_json({"removed": name})


class StorageTestHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        """Connect with the credentials and list the source once.  A storage that does not
        answer is a result (``ok: false`` with the reason), not a server error."""
        self.storage.catalog.get(name)  # 404 for an unknown name
        try:
            self.write_json(await self.storage.test(name))
        except StorageError as e:
            self.write_json({"name": name, "ok": False, "error": e.to_dict()})


class StorageListHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        """One page of a folder of the storage: ``?path=&offset=&limit=&recursive=``."""
        path = self.get_argument("path", "")
        if path:
            check_text(path, "path", what="path")

        self.storage.catalog.get(name)
        self.write_json(await self.storage.ls(
            Location(name, path), offset=self.int_arg("offset", 0, 0, 10_000_000),
            limit=self.int_arg("limit", 200, 1, 5000), recursive=self.bool_arg("recursive")))


class StorageMountHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        """Mount (FUSE, supervised) or, with ``{"mode": "sync"}``, copy it to its mount path."""
        body = self.json_body("StorageMount", required=False)
        handle = await self.storage.start_mount(name, mode=body.get("mode") or "fuse")
        self.accepted(handle.info, name)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        handle = await self.storage.start_unmount(name)
        self.accepted(handle.info, name)


class StorageTransfersHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Copy or sync between storages (``NAME:path``) and local paths inside the
        server's root folder: 202 with the operation, whose events carry the progress."""
        body = self.json_body("StorageTransfer")
        s = self.storage.location(body["src"], "src")
        d = self.storage.location(body["dst"], "dst", write=True)
        handle = await self.storage.start_copy(s, d, mode=body.get("mode") or "copy")
        self.accepted(handle.info, d.storage or s.storage)


class StorageBackendsHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The rclone backends users may add here."""
        self.write_json({"backends": self.storage.backends()})


class StorageBackendHandler(_StorageHandler):
    @web.authenticated
    @authorized
    async def get(self, backend: str) -> None:
        """A backend's options as a form description (``?provider=`` for s3 providers)."""
        self.write_json(self.storage.backend_schema(backend, self.str_arg("provider")))


ROUTES = [
    (r"/storages", StoragesHandler),
    (r"/storage-checks", StorageChecksHandler),
    (rf"/storages/{NAME}", StorageHandler),
    (rf"/storages/{NAME}/test", StorageTestHandler),
    (rf"/storages/{NAME}/ls", StorageListHandler),
    (rf"/storages/{NAME}/mount", StorageMountHandler),
    (r"/storage-transfers", StorageTransfersHandler),
    (r"/storage-backends", StorageBackendsHandler),
    (rf"/storage-backends/{BACKEND}", StorageBackendHandler),
]
