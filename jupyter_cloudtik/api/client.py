"""``RestClient``: the Jupyter server's (or the sidekick's) cloudtik REST API as Python
calls, shared by every feature's REST client (clusters, storage, hpc, the hub's).

It holds what is the same for all of them: the session with the kernel's token and CA
bundle, errors rebuilt into the core's ``CloudTikError`` subclasses (so a caller cannot
tell a REST answer from a core call), and operations followed through their event stream
with resumption after a dropped connection.  Each feature adds its own calls in its own
``rest`` module.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any, Self
from urllib.parse import quote

import requests

from ..core import env
from ..core.errors import CloudTikError, PermissionDeniedError, error_from_dict
from ..core.operations import Event, OperationInfo, StartedOperation
from ..core.runner import result_of


class ApiUnavailable(CloudTikError):
    """The Jupyter server did not answer (stopped, restarting, unreachable)."""

    http_status = 503
    reason = "unavailable"


class RestClient:
    """A client of the cloudtik REST API: HTTP, errors and operations."""

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
    def from_environment(cls) -> Self:
        url = os.environ.get(env.API_URL)
        if not url:
            raise CloudTikError(f"{env.API_URL} is not set", field=env.API_URL)
        verify: bool | str = os.environ.get(env.API_CA_BUNDLE) or True
        return cls(url, os.environ.get(env.API_TOKEN), verify=verify)

    def __repr__(self) -> str:  # never show the token
        return f"<{type(self).__name__} {self.url}>"

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
