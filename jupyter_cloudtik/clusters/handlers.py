"""REST handlers for clusters, operations, providers and the API document.

Each method parses the request, makes one core call and writes what the core returned
(``ClusterInfo``, ``OperationInfo``, ``Event`` as ``to_dict()``).  Long work answers
``202 Accepted`` with the operation; its events are at ``operations/{id}/events``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api import openapi
from ..api.base import CloudTikHandler
from ..api.sse import stream_events
from ..core.errors import ConfigError
from ..core.models import ClusterInfo
from ..core.operations import OperationInfo, Target
from ..runtime.base import installed
from ..runtime.tls import as_client_dict

NAME = r"(?P<name>[^/]+)"
OP_ID = r"(?P<op_id>[^/]+)"


def _whole(value: Any) -> Any:
    """JSON has one number type: 2.0 is the whole number the schema allows as integer."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _cluster_of(op: OperationInfo) -> str:
    return op.resource.name


class ClustersHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The recorded clusters (reads the store only: cheap enough to poll)."""
        self.finish(self.ctx.cluster_list_json(self.bool_arg("all")))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Start a cluster (or repair one to match its config): 202 with the operation."""
        body = self.json_body("ClusterCreate")
        extra = {"template": body["template"]} if body.get("template") else {}
        handle = await self.manager.start_up(
            body.get("config"), name=body.get("name"), workers=_whole(body.get("workers")),
            provider=body.get("provider"), **extra)
        self.ctx.after_up(handle.op_id)
        _accepted(self, handle.info)


def _accepted(handler: CloudTikHandler, op: OperationInfo) -> None:
    handler.set_header("Location", handler.api_path("operations", op.id))
    handler.write_json({"operation": op.to_dict(), "cluster": _cluster_of(op)}, status=202)


class ClusterHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        """One cluster; ``?refresh=true`` asks the provider and the scheduler first."""
        if self.bool_arg("refresh"):
            info: ClusterInfo = await self.manager.status(name)
        else:
            info = self.manager.get(name)
        self.write_json(info.to_dict())

    @web.authenticated
    @authorized
    async def patch(self, name: str) -> None:
        """Scale: ``{"workers": N, "node_type": T}``."""
        body = self.json_body("ClusterScale")
        handle = await self.manager.start_scale(name, _whole(body["workers"]),
                                                body.get("node_type"))
        _accepted(self, handle.info)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        """Shut down: stop every node of the cluster."""
        handle = await self.manager.start_down(name)
        _accepted(self, handle.info)


class ClusterNodesHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        info = self.manager.get(name)
        self.write_json({"cluster": name, "nodes": [n.to_dict() for n in info.nodes]})


class ClusterLogsHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        node = self.str_arg("node")
        tail = self.int_arg("tail", 200, 0, 100_000)
        logs = await asyncio.to_thread(self.manager.logs, name, node, tail)
        self.write_json({"cluster": name, "logs": logs})


class ClusterConnectHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        """How a client reaches the cluster's scheduler (for ``cluster.client()``)."""
        provider, info = self.manager.connect_info(name)
        # the cluster's client certificate goes to its authenticated owner only, here
        self.write_json({"cluster": name, "provider": provider,
                         "connect_info": as_client_dict(info)})


class OperationsHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Recent operations, newest first; ``last_event_id`` is where a live view of
        everything that happens from now on should start (``events?after=``)."""
        last = self.manager.ops.last_event_id()
        cluster = self.str_arg("cluster")
        ops = self.manager.ops.list(
            target=str(Target("cluster", cluster)) if cluster else None,
            active_only=self.bool_arg("active"), limit=self.int_arg("limit", 50, 1, 1000))
        self.write_json({"operations": [o.to_dict() for o in ops], "last_event_id": last})


class OperationHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, op_id: str) -> None:
        self.write_json(self.manager.ops.get(op_id).to_dict())

    @web.authenticated
    @authorized
    async def delete(self, op_id: str) -> None:
        """Cancel: returns the operation as it is after the cancellation took effect."""
        op = await self.manager.cancel(op_id)
        self.write_json(op.to_dict())


class OperationCancelHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def post(self, op_id: str) -> None:
        op = await self.manager.cancel(op_id)
        self.write_json(op.to_dict())


class OperationEventsHandler(CloudTikHandler):
    """An operation's events: a Server-Sent Events stream (``Accept: text/event-stream``)
    that ends when the operation does, or the events so far as JSON."""

    @web.authenticated
    @authorized
    async def get(self, op_id: str) -> None:
        op = self.manager.ops.get(op_id)  # 404 for an unknown id; a prefix is resolved
        op_id = op.id
        after = self._resume_point()
        if not self.wants_event_stream():
            events = self.manager.ops.events(op_id, after=after)
            self.write_json({"operation": op.to_dict(),
                             "events": [e.to_dict() for e in events]})
            return
        await stream_events(
            self, self.manager.ops.watch(op_id, after=after),
            end=lambda: ("end", self.manager.ops.get(op_id).to_dict()))

    def _resume_point(self) -> int:
        """``after``, or the ``Last-Event-ID`` header (1 to 18 ASCII digits); both are
        checked whichever is used, and the header wins when both are sent."""
        import re

        after = self.int_arg("after", 0, 0, 2**62)
        header = self.request.headers.get("Last-Event-ID", "").strip()
        if header:
            if not re.fullmatch(r"[0-9]{1,18}", header, flags=re.ASCII):
                raise ConfigError(f"Last-Event-ID: {header[:40]!r} is not an event id "
                                  "(1 to 18 digits 0-9)", field="Last-Event-ID")
            return int(header)
        return after


class EventsHandler(OperationEventsHandler):
    """Every operation's events: a stream without end for live views (the side panel).

    Without ``after`` or ``Last-Event-ID`` the stream starts now."""

    @web.authenticated
    @authorized
    async def get(self) -> None:  # type: ignore[override]
        has_start = self.get_argument("after", None) is not None or bool(
            self.request.headers.get("Last-Event-ID"))
        after = self._resume_point() if has_start else self.manager.ops.last_event_id()
        if not self.wants_event_stream():
            limit = self.int_arg("limit", 500, 1, 5000)
            events = self.manager.ops.events(after=after, limit=limit)
            self.write_json({"events": [e.to_dict() for e in events],
                             "last_event_id": events[-1].id if events else after})
            return
        await stream_events(self, self.manager.ops.watch_all(after=after))


class ProvidersHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Installed providers with their config schemas and the installed runtimes (what
        the New form is made of)."""
        providers = self.manager.providers()
        default = self.ctx.settings.default_provider
        if any("kind" in p for p in providers):  # a hub user's catalogue entries
            default = next((p["name"] for p in providers if p["default"]), "")
        self.write_json({"providers": providers,
                         "default_provider": default,
                         "runtimes": installed(),
                         "limits": {
                             "max_clusters": self.ctx.settings.max_clusters,
                             "max_workers_per_cluster":
                                 self.ctx.settings.max_workers_per_cluster}})


class OpenAPIHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, fmt: str) -> None:
        if fmt == "json":
            self.finish(openapi.spec_json())
        else:
            self.finish(openapi.spec_text(), set_content_type="application/yaml")


ROUTES: list[tuple[str, Any]] = [
    (r"/clusters", ClustersHandler),
    (rf"/clusters/{NAME}", ClusterHandler),
    (rf"/clusters/{NAME}/nodes", ClusterNodesHandler),
    (rf"/clusters/{NAME}/logs", ClusterLogsHandler),
    (rf"/clusters/{NAME}/connect", ClusterConnectHandler),
    (r"/operations", OperationsHandler),
    (rf"/operations/{OP_ID}", OperationHandler),
    (rf"/operations/{OP_ID}/cancel", OperationCancelHandler),
    (rf"/operations/{OP_ID}/events", OperationEventsHandler),
    (r"/events", EventsHandler),
    (r"/providers", ProvidersHandler),
    (r"/openapi\.(?P<fmt>yaml|json)", OpenAPIHandler),
]
