"""Workspace routes of the server extension, beside the cluster routes.

``GET/POST workspaces``, ``GET/DELETE workspaces/{name}``: each parses the request, makes
one ``WorkspaceManager`` call and writes its answer.  Create and delete are operations
(``202 Accepted``), followed like any other at ``operations/{id}/events``.  Credentials in
a create body go to the secret store and are never part of an answer.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from ..core.operations import OperationInfo
from .manager import WorkspaceManager

NAME = r"(?P<name>[^/]+)"


def _manager(ctx) -> WorkspaceManager:
    return WorkspaceManager(settings=ctx.settings, store=ctx.store)


class _WorkspaceHandler(CloudTikHandler):
    @property
    def workspaces(self) -> WorkspaceManager:
        return self.ctx.feature("workspaces", _manager)

    def accepted(self, op: OperationInfo) -> None:
        self.set_header("Location", self.api_path("operations", op.id))
        self.write_json({"operation": op.to_dict(),
                         "workspace": op.resource.name}, status=202)


class WorkspacesHandler(_WorkspaceHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The recorded workspaces (no cloud calls)."""
        infos = self.workspaces.list(include_deleted=self.bool_arg("all"))
        self.write_json({"workspaces": [i.to_dict() for i in infos]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Create a workspace, or finish creating it: 202 with the operation."""
        body = self.json_body("WorkspaceCreate")
        handle = await self.workspaces.start_create(body["name"], body.get("config"),
                                                    body.get("provider"))
        self.accepted(handle.info)


class WorkspaceHandler(_WorkspaceHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        """One workspace; ``?refresh=true`` asks the cloud which resources exist."""
        if self.bool_arg("refresh"):
            self.write_json(await self.workspaces.status(name))
        else:
            self.write_json(self.workspaces.get(name).to_dict())

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        """Delete everything of the workspace (``?keep_storage=true`` keeps the bucket)."""
        handle = await self.workspaces.start_delete(
            name, delete_storage=not self.bool_arg("keep_storage"))
        self.accepted(handle.info)


ROUTES: list[tuple[str, Any]] = [
    (r"/workspaces", WorkspacesHandler),
    (rf"/workspaces/{NAME}", WorkspaceHandler),
]
