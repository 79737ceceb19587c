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

import logging
import os
from typing import Any
from urllib.parse import urlparse

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import CloudTikHandler
from .forward import forward, request_headers

HUB_SERVICE_ENV = "CLOUDTIK_HUB_SERVICE_URL"
log = logging.getLogger("jupyter_cloudtik.server")
DELEGATED = ("clusters", "operations", "events", "providers", "storages", "storage-transfers",
             "storage-backends", "jobs", "hpc", "hub")

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
        theirs = urlparse(self.target).path  # the sidekick's base URL, e.g. /services/x/

        def here(name: str, value: str) -> str:
            return value.replace(theirs, self.base_url, 1) if name.lower() == "location" \
                else value

        await forward(self, f"{self.target}cloudtik/api/{path}",
                      request_headers(self, {"Authorization": f"token {token}"},
                                      drop=frozenset({"origin", "referer"})),
                      unavailable="the hub's cloudtik sidekick did not answer",
                      header_value=here)

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


async def _hub_call(method: str, url: str, timeout: float) -> bytes | None:
    """A call to the sidekick with this server's hub token; None when it did not work."""
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    req = HTTPRequest(url, method=method, body=b"" if method == "POST" else None,
                      request_timeout=timeout,
                      headers={"Authorization": "token "
                               + os.environ.get("JUPYTERHUB_API_TOKEN", "")})
    try:
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    except OSError:
        return None
    return resp.body if resp.code < 300 else None


async def stop_my_sidekicks(target: str | None) -> None:
    """The server is stopping: the user's side-kicks end with their session (if the
    sidekick does not answer, its session watcher stops them)."""
    if target:
        await _hub_call("POST", f"{target}cloudtik/api/hub/sidekicks/_stop-mine", 10)


async def egress_session_env(target: str) -> dict[str, str]:
    """The egress proxy settings for this user's kernels, with a CA bundle file (this
    system's CAs + the deployment CA) written to the runtime folder; {} when the sidekick
    has no proxy or does not answer (kernels then go out directly)."""
    import json
    from pathlib import Path

    from jupyter_core.paths import jupyter_runtime_dir

    body = await _hub_call("GET", f"{target}cloudtik/api/hub/egress/session", 10)
    if body is None:
        log.warning("jupyter_cloudtik: no egress proxy settings from the hub sidekick")
        return {}
    data = json.loads(body)
    bundle = Path(jupyter_runtime_dir()) / "cloudtik-egress-ca-bundle.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    system = next((Path(p).read_text() for p in ("/etc/ssl/certs/ca-certificates.crt",
                                                  "/etc/pki/tls/certs/ca-bundle.crt")
                   if Path(p).exists()), "")
    bundle.write_text(system + "\n" + data["ca_pem"])
    theirs = data["env"].get("REQUESTS_CA_BUNDLE")
    env = {k: (str(bundle) if v == theirs else v) for k, v in data["env"].items()}
    env.pop("NODE_EXTRA_CA_CERTS", None)  # a path on the sidekick's machine
    return env
