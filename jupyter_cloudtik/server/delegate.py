"""Delegation to the hub sidekick, from a user's single-user Jupyter server.

When ``c.CloudTikServer.hub_service_url`` (or ``$CLOUDTIK_HUB_SERVICE_URL``, which the
hub's spawner sets) names the sidekick, this server's cluster, operation, storage and job
routes — and the sidekick's own ``hub/`` routes — are answered by the sidekick: each
request is checked here as usual (the user's cookie/token or the kernel token), then sent
on with this server's hub token (``$JUPYTERHUB_API_TOKEN``), which the sidekick resolves to
the user.  The sidekick does the work with the credentials its admins hold, so none of
them ever reaches this server, its kernels or its files.  Event streams are passed through
as they arrive.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import httpclient, web

from .base import CloudTikHandler

HUB_SERVICE_ENV = "CLOUDTIK_HUB_SERVICE_URL"
DELEGATED = ("clusters", "operations", "events", "providers", "storages", "storage-transfers",
             "storage-backends", "jobs", "hpc", "hub")
_SKIP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
         "trailer", "transfer-encoding", "upgrade", "host", "content-length", "cookie",
         "authorization", "x-xsrftoken", "origin", "referer"}


def hub_service_url(configured: str) -> str | None:
    url = configured or os.environ.get(HUB_SERVICE_ENV, "")
    if not url:
        return None
    return url if url.endswith("/") else url + "/"


class DelegatingHandler(CloudTikHandler):
    """Any method on a delegated path: authorize here, answer from the sidekick."""

    def initialize(self, target: str) -> None:
        self.target = target

    async def _forward(self, path: str) -> None:
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        url = f"{self.target}cloudtik/api/{path}"
        if self.request.query:
            url += "?" + self.request.query
        headers = {k: v for k, v in self.request.headers.get_all()
                   if k.lower() not in _SKIP}
        headers["Authorization"] = f"token {token}"
        streaming = "text/event-stream" in self.request.headers.get("Accept", "")
        started = False

        def on_chunk(chunk: bytes) -> None:
            nonlocal started
            started = True
            self.write(chunk)
            self.flush()

        def on_header(line: str) -> None:
            line = line.strip()
            if line.startswith("HTTP/"):
                parts = line.split(" ", 2)
                self.set_status(int(parts[1]), parts[2] if len(parts) > 2 else None)
            elif ":" in line:
                k, _, v = line.partition(":")
                if k.strip().lower() not in _SKIP | {"set-cookie", "server", "date"}:
                    self.set_header(k.strip(), v.strip())

        body = self.request.body if self.request.method in ("POST", "PUT", "PATCH") else None
        req = httpclient.HTTPRequest(
            url, method=self.request.method, headers=headers, body=body,
            follow_redirects=False, allow_nonstandard_methods=True,
            request_timeout=0 if streaming else 600, connect_timeout=20,
            streaming_callback=on_chunk if streaming else None,
            header_callback=on_header if streaming else None)
        try:
            resp = await httpclient.AsyncHTTPClient().fetch(req, raise_error=False)
        except Exception:
            resp = None
        if resp is None or resp.code == 599:
            if started:
                self.finish()
                return
            raise web.HTTPError(502, "the hub's cloudtik sidekick did not answer")
        if streaming:
            self.finish()
            return
        self.set_status(resp.code, resp.reason)
        for k, v in resp.headers.get_all():
            if k.lower() not in _SKIP | {"set-cookie", "server", "date"}:
                if k.lower() == "location":
                    v = v.replace(self.target, self.base_url, 1)
                self.set_header(k, v)
        self.finish(resp.body or b"")

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def put(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def patch(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        await self._forward(path)


def delegated_routes(prefix: str, target: str) -> list[tuple[str, Any, dict[str, Any]]]:
    pattern = prefix + r"/(?P<path>(?:" + "|".join(DELEGATED) + r")(?:/.*)?)"
    return [(pattern, DelegatingHandler, {"target": target})]


def stop_my_sidekicks(target: str | None) -> None:
    """The server is stopping: the user's side-kicks end with their session."""
    if not target:
        return
    import requests

    try:
        requests.post(f"{target}cloudtik/api/hub/sidekicks/_stop-mine", timeout=10,
                      headers={"Authorization": "token "
                               + os.environ.get("JUPYTERHUB_API_TOKEN", "")})
    except requests.RequestException:
        pass  # the sidekick stops idle side-kicks by itself
