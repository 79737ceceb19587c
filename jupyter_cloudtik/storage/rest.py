"""The storage calls over the Jupyter server's REST API (kernels started by the server).

Same methods as :class:`~jupyter_cloudtik.storage.client.StorageClient`, so the magics do
not care: the server then owns transfers and mounts (they survive kernel restarts) and
mount paths live in the server's root folder.  Relative local paths are made absolute
here, from the kernel's working folder (the notebook's), before they travel.
"""

from __future__ import annotations

import os
from typing import Any

from ..api.client import RestClient, _seg
from ..core.errors import ConfigError, error_from_dict
from .catalog import NAME_RE, StorageInfo, check_name
from .manager import Location


def _where(where: str | Location) -> str:
    if isinstance(where, Location):
        return str(where) if where.storage else os.path.abspath(where.path)
    head, sep, _rest = where.partition(":")
    if sep and NAME_RE.match(head):
        return where
    return os.path.abspath(os.path.expanduser(where))


def add_body(name: str, backend: str | None = None, options: dict[str, Any] | None = None,
             *, url: str | None = None, source: str | None = None, read_only: bool = True,
             mount_path: str | None = None, vfs_cache_mode: str | None = None,
             description: str = "", replace: bool = False) -> dict[str, Any]:
    """The body of ``POST storages`` (openapi.yaml's StorageCreate)."""
    return {"name": name, "backend": backend, "options": options or {}, "url": url,
            "source": source, "read_only": read_only, "mount_path": mount_path,
            "vfs_cache_mode": vfs_cache_mode, "description": description, "replace": replace}


class RestStorageClient(RestClient):
    """StorageClient's calls, answered by a Jupyter server with the extension."""

    def add(self, name: str, backend: str | None = None, options: dict[str, Any] | None = None,
            **kw: Any) -> StorageInfo:
        body = add_body(name, backend, options, **kw)
        return StorageInfo.from_dict(self._json("POST", "storages", body=body))

    def check_add(self, name: str, backend: str | None = None,
                  options: dict[str, Any] | None = None, *, ask: list[str] | None = None,
                  **kw: Any) -> StorageInfo:
        """``POST storage-checks``: what ``add`` would record, checked by the server the
        same way and saved nowhere.  Values of asked options are not sent (the add has
        them); secret values given are refused by the server (a notebook asks for them)."""
        check_name(name)  # the core's message (the server's schema has its own wording)
        ask = list(dict.fromkeys(ask or []))
        given = {k: v for k, v in (options or {}).items() if k not in ask}
        body = {"storage": add_body(name, backend, given, **kw), "ask": ask}
        return StorageInfo.from_dict(self._json("POST", "storage-checks", body=body)["storage"])

    def get(self, name: str) -> StorageInfo:
        return StorageInfo.from_dict(self._json("GET", f"storages/{_seg(name)}"))

    def list(self) -> list[StorageInfo]:  # type: ignore[override]
        return [StorageInfo.from_dict(s) for s in self._json("GET", "storages")["storages"]]

    def remove(self, name: str) -> None:
        self._json("DELETE", f"storages/{_seg(name)}")

    def backends(self) -> list[dict[str, Any]]:
        return self._json("GET", "storage-backends")["backends"]

    def backend_schema(self, backend: str, provider: str | None = None) -> dict[str, Any]:
        return self._json("GET", f"storage-backends/{_seg(backend)}",
                          params={"provider": provider})

    def mounts(self) -> list[dict[str, Any]]:
        return [{"name": s.name, **s.mount} for s in self.list() if s.mount]

    def test(self, name: str) -> dict[str, Any]:
        result = self._json("POST", f"storages/{_seg(name)}/test")
        if not result.get("ok"):
            raise error_from_dict(result.get("error") or {"message": "the test failed"})
        return result

    def ls(self, where: str | Location, *, offset: int = 0, limit: int = 200,
           recursive: bool = False) -> dict[str, Any]:
        text = str(where)
        name, sep, path = text.partition(":")
        if not sep:
            raise ConfigError(f"ls: {text!r} is not a storage path; use NAME:path",
                              field="location")
        return self._json("GET", f"storages/{_seg(name)}/ls",
                          params={"path": path, "offset": offset, "limit": limit,
                                  "recursive": "true" if recursive else None})

    def start_copy(self, src: str | Location, dst: str | Location, mode: str = "copy") -> str:
        body = {"src": _where(src), "dst": _where(dst), "mode": mode}
        return self._json("POST", "storage-transfers", body=body)["operation"]["id"]

    def start_mount(self, name: str, mode: str = "fuse") -> str:
        return self._json("POST", f"storages/{_seg(name)}/mount",
                          body={"mode": mode})["operation"]["id"]

    def start_unmount(self, name: str) -> str:
        return self._json("DELETE", f"storages/{_seg(name)}/mount")["operation"]["id"]

    def close(self) -> None:
        self.session.close()
