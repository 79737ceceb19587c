"""``RestBackend``: the ``clusters.client.Backend`` calls over the server extension's REST API.

A kernel started by a Jupyter server with the extension has ``CLOUDTIK_API_URL`` and
``CLOUDTIK_API_TOKEN`` in its environment; ``clusters.client.get_backend()`` then returns this
backend, so the magics and the ``Cluster`` API ask the server, which owns every long
operation, and see the same clusters and events as the side panel.  Answers are rebuilt
into the core's own types (``ClusterInfo``, ``OperationInfo``, ``Event``) and errors into
the same ``CloudTikError`` subclasses, so callers cannot tell the difference.
"""

from __future__ import annotations

from typing import Any

from ..api.client import RestClient, _seg
from ..core.features import feature_service
from ..core.models import ClusterInfo, ConnectInfo


class RestBackend(RestClient):
    """The same calls as ``CoreBackend``, answered by a Jupyter server."""

    # starting operations -----------------------------------------------------------------
    def start_up(self, config: dict[str, Any] | None = None, *, name: str | None = None,
                 workers: int | None = None, provider: str | None = None) -> str:
        body = {"config": config, "name": name, "workers": workers, "provider": provider}
        return self._started(self._json("POST", "clusters", body=body))

    def start_down(self, name: str) -> str:
        return self._started(self._json("DELETE", f"clusters/{_seg(name)}"))

    def start_scale(self, name: str, workers: int, node_type: str | None = None) -> str:
        body = {"workers": workers, "node_type": node_type}
        return self._started(self._json("PATCH", f"clusters/{_seg(name)}", body=body))

    # clusters --------------------------------------------------------------------------
    def adapt(self, name: str, minimum: int | None, maximum: int | None,
              interval: float | None = None, wait_count: int | None = None) -> dict[str, Any]:
        body = {k: v for k, v in {"minimum": minimum, "maximum": maximum,
                                  "interval": interval, "wait_count": wait_count}.items()
                if v is not None}
        return self._json("PUT", f"clusters/{_seg(name)}/adapt", body=body)["adaptive"]

    def usage(self, name: str) -> dict[str, Any]:
        return self._json("GET", f"clusters/{_seg(name)}/usage")

    def adapt_off(self, name: str) -> None:
        self._json("DELETE", f"clusters/{_seg(name)}/adapt")

    def status(self, name: str) -> ClusterInfo:
        return ClusterInfo.from_dict(
            self._json("GET", f"clusters/{_seg(name)}", params={"refresh": "true"}))

    def get(self, name: str) -> ClusterInfo:
        return ClusterInfo.from_dict(self._json("GET", f"clusters/{_seg(name)}"))

    def list(self, include_stopped: bool = False) -> list[ClusterInfo]:
        data = self._json("GET", "clusters",
                          params={"all": "true" if include_stopped else None})
        return [ClusterInfo.from_dict(c) for c in data["clusters"]]

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        data = self._json("GET", f"clusters/{_seg(name)}/logs",
                          params={"node": node_id, "tail": tail})
        return data["logs"]

    def connect_info(self, name: str) -> tuple[str, ConnectInfo]:
        data = self._json("GET", f"clusters/{_seg(name)}/connect")
        return data["provider"], ConnectInfo.from_dict(data["connect_info"])

    # workspaces ------------------------------------------------------------------------
    def start_workspace_create(self, name: str, config: dict[str, Any] | None = None,
                               provider: str | None = None) -> str:
        body = {"name": name, "config": config, "provider": provider}
        return self._json("POST", "workspaces", body=body)["operation"]["id"]

    def start_workspace_delete(self, name: str, delete_storage: bool = True) -> str:
        return self._json("DELETE", f"workspaces/{_seg(name)}",
                          params={"keep_storage": str(not delete_storage).lower()}
                          )["operation"]["id"]

    def workspace_get(self, name: str):
        info = self._json("GET", f"workspaces/{_seg(name)}")
        return feature_service("workspace_info").from_dict(info)

    def workspace_list(self, include_deleted: bool = False):
        WorkspaceInfo = feature_service("workspace_info")
        data = self._json("GET", "workspaces", params={"all": str(include_deleted).lower()})
        return [WorkspaceInfo.from_dict(w) for w in data["workspaces"]]

    def workspace_status(self, name: str) -> dict[str, Any]:
        return self._json("GET", f"workspaces/{_seg(name)}", params={"refresh": "true"})

    def providers(self) -> list[dict[str, Any]]:
        return self._json("GET", "providers")["providers"]
