"""The Python API of workspaces: ``Workspace.create("demo", provider="huaweicloud", ...)``.

A workspace is the network, identity and storage that the clusters of a cloud account
share.  Like ``Cluster``, a ``Workspace`` is a name plus a backend; what it shows comes
from the state store, and long work (create, delete) is an operation whose progress every
face shows the same way.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from ..clusters.client import get_backend
from ..core.config import read_config_file
from ..progress import follow, make_view
from .manager import WorkspaceInfo


def workspace_backend() -> Any:
    """The backend workspace calls go through: the clusters' own for this process (one
    store, one operations table and one REST session serve ``%cluster`` and ``jupyter
    cloudtik workspace``), the one named edge from workspaces to clusters."""
    return get_backend()


class Workspace:
    def __init__(self, name: str, backend: Any = None, info: WorkspaceInfo | None = None) -> None:
        self.name = name
        self.backend = backend or workspace_backend()
        self._info = info

    @classmethod
    def create(cls, name: str, config: str | os.PathLike[str] | dict[str, Any] | None = None,
               *, provider: str | None = None, wait: bool = True,
               progress: str | bool = "auto", backend: Any = None,
               **provider_options: Any) -> Workspace:
        """Create (or finish creating) a workspace; ``provider_options`` go to ``provider:``.

        ``Workspace.create("demo", provider="huaweicloud", region="cn-north-4",
        allowed_ssh_sources=["203.0.113.7/32"])``
        """
        backend = backend or workspace_backend()
        if config is not None and not isinstance(config, dict):
            config = read_config_file(Path(config))
        config = dict(config or {})
        if provider_options:
            config["provider"] = {**(config.get("provider") or {}), **provider_options}
        op_id = backend.start_workspace_create(name, config, provider)
        if wait:
            follow(backend, op_id, make_view(f"workspace {name}: create", progress))
        return cls(name, backend)

    @classmethod
    def get(cls, name: str, backend: Any = None) -> Workspace:
        backend = backend or workspace_backend()
        return cls(name, backend, backend.workspace_get(name))

    @classmethod
    def list(cls, backend: Any = None) -> list[Workspace]:
        backend = backend or workspace_backend()
        return [cls(i.name, backend, i) for i in backend.workspace_list()]

    @property
    def info(self) -> WorkspaceInfo:
        self._info = self.backend.workspace_get(self.name)
        return self._info

    @property
    def state(self) -> str:
        return self.info.state

    def status(self) -> dict[str, Any]:
        """Ask the cloud which of the workspace's resources exist."""
        return self.backend.workspace_status(self.name)

    def delete(self, *, keep_storage: bool = False, wait: bool = True,
               progress: str | bool = "auto") -> None:
        op_id = self.backend.start_workspace_delete(self.name, not keep_storage)
        if wait:
            follow(self.backend, op_id, make_view(f"workspace {self.name}: delete", progress))

    def __repr__(self) -> str:
        i = self._info or self.info
        return f"<Workspace {self.name!r} {i.provider} {i.state}>"

    def _repr_html_(self) -> str:
        i = self._info or self.info
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td><code>{html.escape(str(v))}</code>"
                       "</td></tr>" for k, v in sorted(i.resources.items()))
        return (f"<b>Workspace {html.escape(self.name)}</b> ({html.escape(i.provider)}, "
                f"{html.escape(i.state)})<table>{rows}</table>")
