"""Staging through the storage feature: inputs from ``NAME:path`` of a storage, results to one.

The storage feature (``jupyter_cloudtik.storage``) keeps rclone remotes by name with their
credentials in the secret store; its ``StorageManager`` copies between a storage and local
folders with progress.  Here that becomes a stager: an input ``mydata:runs/in.csv`` is
downloaded into the job's staging folder and uploaded by the backend; results go to an
output location ``mydata:results/run7`` after the job.  The copies report into the job's
own operation (``stage-in`` / ``stage-out`` events with rclone's byte counts), and a cancel
of the job stops them.
"""

from __future__ import annotations

import posixpath
import shutil
import threading
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, NotFoundError, PermissionDeniedError


class StorageStager:
    def __init__(self, settings: Any, store: Any) -> None:
        self._settings, self._store = settings, store
        self._manager = None
        self._lock = threading.Lock()

    @property
    def manager(self):
        with self._lock:
            if self._manager is None:
                # deferred: start-up (core.features ~27 ms, loads importlib.metadata)
                from ..core.features import feature_service

                # storage's manager decides who may read which storage (one decision
                # point); hpc reaches it through the registry, not an import
                manager = feature_service("storage_manager")
                self._manager = manager(settings=self._settings, store=self._store,
                                        supervise=False)
            return self._manager

    def handles(self, location: str) -> bool:
        if "://" in location:
            return False
        head, sep, _rest = location.partition(":")
        if not sep or not head or "/" in head:
            return False
        try:
            return self.manager.catalog.exists(head)
        except Exception as e:
            # never "not a storage": NAME:path would then be read as a local file of that
            # name (staged instead), or refused as "no storage named" for the wrong reason
            detail = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            raise ConfigError(
                f"storage {head!r}: cannot tell whether '{head}:...' names a storage: the "
                f"storages here cannot be read ({detail})", field="storage",
                value=head) from None

    async def _entry(self, location: str) -> tuple[Any, dict[str, Any] | None]:
        loc = self.manager.location(location)
        path = loc.path.strip("/")
        if not path:
            return loc, {"is_dir": True, "name": "", "size": None}
        parent, name = posixpath.split(path)
        listing = await self.manager.ls(f"{loc.storage}:{parent}", limit=1 << 30)
        for e in listing["entries"]:
            if e["name"] == name:
                return loc, e
        return loc, None

    async def acheck(self, location: str, *, for_output: bool = False) -> None:
        loc = self.manager.location(location)
        info = self.manager.get(loc.storage)
        field = "output" if for_output else "inputs"
        if for_output:
            if info.read_only:
                raise PermissionDeniedError(
                    f"output: storage '{loc.storage}' is read-only; add it again read-write to "
                    "write results to it", field="output", value=location)
            return
        _loc, entry = await self._entry(location)
        if entry is None:
            raise NotFoundError(f"{field}: {location!r} does not exist (no '{loc.path}' in "
                                f"storage '{loc.storage}')", field=field, value=location)

    async def adownload(self, location: str, dest: Path, ctx, fraction: tuple[float, float]
                        ) -> Path:
        loc, entry = await self._entry(location)
        if entry is None:
            raise NotFoundError(f"inputs: {location!r} does not exist", field="inputs")
        tmp = dest.parent / f".{dest.name}.staging"
        shutil.rmtree(tmp, ignore_errors=True)
        await self.manager.download(loc.storage, loc.path, tmp, ctx=ctx, fraction=fraction,
                                    step="stage-in")
        if entry["is_dir"]:
            tmp.replace(dest)
        else:
            got = tmp / posixpath.basename(loc.path.rstrip("/"))
            if not got.is_file():
                raise ConfigError(f"inputs: copying {location!r} brought no file", field="inputs")
            got.replace(dest)
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    async def aupload(self, src: Path, location: str, ctx, fraction: tuple[float, float]) -> None:
        loc = self.manager.location(location)
        target = loc.path.rstrip("/")
        if src.is_dir():
            target = f"{target}/{src.name}" if target else src.name
        await self.manager.upload(src, loc.storage, target, ctx=ctx, fraction=fraction,
                                  step="stage-out")


def storage_stager(settings: Any, store: Any) -> StorageStager | None:
    """A stager for the storage feature, if it is installed here."""
    # deferred: start-up (core.features ~27 ms, loads importlib.metadata)
    from ..core.features import features

    # only "nobody offers storage" means paths only: a storage feature that is installed
    # but broken fails loudly when the stager first loads its manager
    if not any(name == "storage_manager" for f in features() for name, _ref in f.services):
        return None
    return StorageStager(settings, store)
