"""``RestBackend``: the ``clusters.client.Backend`` calls over the server extension's REST API.

A kernel started by a Jupyter server with the extension has ``CLOUDTIK_API_URL`` and
``CLOUDTIK_API_TOKEN`` in its environment; ``clusters.client.get_backend()`` then returns this
backend, so the magics and the ``Cluster`` API ask the server, which owns every long
operation, and see the same clusters and events as the side panel.  Answers are rebuilt
into the core's own types (``ClusterInfo``, ``OperationInfo``, ``Event``) and errors into
the same ``CloudTikError`` subclasses, so callers cannot tell the difference.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import requests

from ..core import env
from ..core.errors import CloudTikError, error_from_dict
from ..core.models import ClusterInfo
from ..core.operations import Event, OperationInfo, StartedOperation
from ..core.runner import result_of
from ..providers.base import ConnectInfo
from .client import API_URL_ENV

API_TOKEN_ENV = env.API_TOKEN


class ApiUnavailable(CloudTikError):
    """The Jupyter server did not answer (stopped, restarting, unreachable)."""

    http_status = 503
    reason = "unavailable"


class RestBackend:
    """The same calls as ``CoreBackend``, answered by a Jupyter server."""

    kind = "rest"

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 60.0,
                 stream_timeout: float = 60.0, reconnect_for: float = 30.0,
                 verify: bool | str = True) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.timeout = timeout
        self.stream_timeout = stream_timeout  # longer than the server's keep-alive period
        self.reconnect_for = reconnect_for
        self.session = requests.Session()
        self.session.verify = verify
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"token {token}"
        # final states the event streams ended with, for ``wait`` (one entry per stream
        # followed to its end, taken by the first ``wait``)
        self._final: dict[str, OperationInfo] = {}

    @classmethod
    def from_environment(cls) -> RestBackend:
        url = os.environ.get(API_URL_ENV)
        if not url:
            raise CloudTikError(f"{API_URL_ENV} is not set", field=API_URL_ENV)
        verify: bool | str = os.environ.get(env.API_CA_BUNDLE) or True
        return cls(url, os.environ.get(API_TOKEN_ENV), verify=verify)

    def __repr__(self) -> str:  # never show the token
        return f"<RestBackend {self.url}>"

    # HTTP ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                 body: Any = None, headers: dict[str, str] | None = None,
                 stream: bool = False, timeout: float | None = None) -> requests.Response:
        try:
            resp = self.session.request(
                method, self.url + path,
                params={k: v for k, v in (params or {}).items() if v is not None},
                data=None if body is None else json.dumps(body),
                headers={"Content-Type": "application/json", **(headers or {})},
                stream=stream, timeout=timeout or self.timeout)
        except requests.RequestException as e:
            raise ApiUnavailable(
                f"the Jupyter server's cloudtik API at {self.url} did not answer: "
                f"{type(e).__name__}") from None
        if resp.status_code >= 400:
            raise _error_from_response(resp)
        return resp

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

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

    @staticmethod
    def _started(answer: dict[str, Any]) -> StartedOperation:
        """The 202 answer names the operation and what it works on: keep it."""
        return StartedOperation(OperationInfo.from_dict(answer["operation"]))

    # operations ------------------------------------------------------------------------
    def operation(self, op_id: str) -> OperationInfo:
        return OperationInfo.from_dict(self._json("GET", f"operations/{_seg(op_id)}"))

    def operations(self, cluster: str | None = None, limit: int = 50) -> list[OperationInfo]:
        data = self._json("GET", "operations", params={"cluster": cluster, "limit": limit})
        return [OperationInfo.from_dict(o) for o in data["operations"]]

    def events(self, op_id: str, after: int = 0) -> Iterator[Event]:
        """Events of an operation as the server pushes them, until it is final.

        A dropped connection is resumed from the last event seen (``Last-Event-ID``), so
        no event is lost or repeated; the server is given ``reconnect_for`` seconds to
        come back.
        """
        last = after
        down_since: float | None = None
        while True:
            try:
                resp = self._request(
                    "GET", f"operations/{_seg(op_id)}/events",
                    headers={"Accept": "text/event-stream", "Last-Event-ID": str(last)},
                    stream=True, timeout=self.stream_timeout)
            except ApiUnavailable:
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > self.reconnect_for:
                    raise
                time.sleep(0.5)
                continue
            down_since = None
            ended = False
            try:
                for kind, _event_id, data in parse_sse(resp.iter_lines(decode_unicode=True)):
                    if kind == "progress":
                        ev = Event.from_dict(json.loads(data))
                        if ev.id <= last:
                            continue
                        last = ev.id
                        yield ev
                    elif kind == "end":
                        # the final state: ``wait`` needs no request of its own
                        # (under the id asked for: the server also resolves a prefix)
                        self._final[str(op_id)] = OperationInfo.from_dict(json.loads(data))
                        ended = True
                        break
            except (requests.RequestException, ValueError):
                pass  # the connection dropped mid-stream: resume after `last`
            finally:
                resp.close()
            if ended:
                return

    def wait(self, op_id: str) -> Any:
        """The operation's result (or its error), from the end of its event stream: a
        stream already followed to its end (``follow`` does) costs no request more."""
        op = self._final.pop(op_id, None)
        if op is None or not op.done:
            for _ in self.events(op_id):
                pass
            op = self._final.pop(op_id, None) or self.operation(op_id)
        return result_of(op)

    def cancel(self, op_id: str) -> OperationInfo:
        return OperationInfo.from_dict(self._json("DELETE", f"operations/{_seg(op_id)}"))

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
        from ..workspaces.manager import WorkspaceInfo

        return WorkspaceInfo.from_dict(self._json("GET", f"workspaces/{_seg(name)}"))

    def workspace_list(self, include_deleted: bool = False):
        from ..workspaces.manager import WorkspaceInfo

        data = self._json("GET", "workspaces", params={"all": str(include_deleted).lower()})
        return [WorkspaceInfo.from_dict(w) for w in data["workspaces"]]

    def workspace_status(self, name: str) -> dict[str, Any]:
        return self._json("GET", f"workspaces/{_seg(name)}", params={"refresh": "true"})

    def providers(self) -> list[dict[str, Any]]:
        return self._json("GET", "providers")["providers"]


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _error_from_response(resp: requests.Response) -> CloudTikError:
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or "message" not in data:
        return CloudTikError(f"the cloudtik API answered HTTP {resp.status_code}")
    if resp.status_code == 403 and data.get("reason") in ("forbidden", None):
        from ..core.errors import PermissionDeniedError

        return PermissionDeniedError(str(data["message"]), field=data.get("field"))
    return error_from_dict(data)


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str | None, str]]:
    """(event name, id, data) of each event in a Server-Sent Events line stream."""
    kind, event_id, data = "message", None, []
    for line in lines:
        if line == "":
            if data:
                yield kind, event_id, "\n".join(data)
            kind, event_id, data = "message", None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value
