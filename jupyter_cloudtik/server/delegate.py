"""Delegation to the hub sidekick, from a user's single-user Jupyter server.

When ``c.CloudTikServer.hub_service_url`` (or ``$CLOUDTIK_HUB_SERVICE_URL``, which the
hub's spawner sets) names the sidekick, this server's cluster, operation, storage and job
routes — and the sidekick's own ``hub/`` routes — are answered by the sidekick: each
request is checked here as usual (the user's cookie/token or the kernel token), then sent
on with this server's hub token (``$JUPYTERHUB_API_TOKEN``), which the sidekick resolves to
the user.  The sidekick does the work with the credentials its admins hold, so none of
them ever reaches this server, its kernels or its files.  Event streams are passed through
as they arrive.

The sidekick never reads a path of its own disk for a user.  A job's notebook and local
inputs are this server's files: they are resolved here, with this server's location policy
(inside its root folder), read, and sent along as content (``files``, base64, at most
``c.CloudTikServer.max_upload_bytes``), which the sidekick writes only into the job's own
folder.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from ..api.forward import forward, request_headers
from ..core import env
from ..core.errors import ConfigError, PermissionDeniedError
from ..core.locations import check_file_name, resolve, split_named

HUB_SERVICE_ENV = env.HUB_SERVICE_URL
log = logging.getLogger("jupyter_cloudtik.server")
DELEGATED = ("clusters", "operations", "events", "providers", "storages", "storage-checks",
             "storage-transfers", "storage-backends", "jobs", "hpc", "hub")
#: under a delegated path, this server's own: its interactive HPC kernels run here, with
#: this server's kernel spec manager (the sidekick runs none: it would answer an empty list
#: and refuse every size, hub.views.NoKernelsView)
OWN = ("hpc/kernels", "hpc/kernel-sizes")

def hub_service_url(configured: str) -> str | None:
    url = configured or os.environ.get(HUB_SERVICE_ENV, "")
    if not url:
        return None
    return url if url.endswith("/") else url + "/"


class DelegatingHandler(CloudTikHandler):
    """Any method on a delegated path: authorize here, answer from the sidekick."""

    def initialize(self, target: str) -> None:
        self.target = target

    def body_limit(self) -> int:
        limit = super().body_limit()
        if self.request.method == "POST" and self.api_subpath().rstrip("/") == "jobs":
            return limit + self.settings["cloudtik"].server.max_upload_bytes * 4 // 3
        return limit

    async def _forward(self, path: str) -> None:
        body = None
        if self.request.method == "POST" and path.rstrip("/") == "jobs":
            body = job_with_content(self.json_body("JobSubmit"), self.settings["cloudtik"])
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        theirs = urlparse(self.target).path  # the sidekick's base URL, e.g. /services/x/

        def here(name: str, value: str) -> str:
            return value.replace(theirs, self.base_url, 1) if name.lower() == "location" \
                else value

        await forward(self, f"{self.target}cloudtik/api/{path}",
                      request_headers(self, {"Authorization": f"token {token}"},
                                      drop=frozenset({"origin", "referer"})),
                      unavailable="the hub's cloudtik sidekick did not answer",
                      header_value=here, body=body)

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


def job_with_content(body: dict[str, Any], ctx: Any) -> bytes:
    """A job submission for the sidekick: the notebook and local inputs, resolved under
    this server's root by its location policy, travel as content; what names a storage,
    a URL or an HPC system stays a name (the sidekick checks it for the user)."""
    policy = ctx.locations
    limit = ctx.server.max_upload_bytes
    files: dict[str, str] = {}
    total = [sum(len(v) * 3 // 4 for v in (body.get("files") or {}).values())]

    def is_name(text: str) -> bool:
        return True  # NAME:path is for the sidekick (a hub storage or system) to check

    def add(name: str, path: Path) -> None:
        check_file_name(name, "files")
        if name in files or name in (body.get("files") or {}):
            raise ConfigError(f"inputs: two inputs are named {name!r}; rename one with "
                              "NAME=LOCATION", field="inputs")
        total[0] += path.stat().st_size
        if total[0] > limit:
            raise ConfigError(
                f"inputs: the notebook and inputs sent to the hub are larger than {limit} "
                "bytes (c.CloudTikServer.max_upload_bytes); put large data in a storage and "
                "name it as STORAGE:path", field="inputs")
        files[name] = base64.b64encode(path.read_bytes()).decode("ascii")

    def add_local(field: str, name: str, path: Path) -> None:
        if not path.exists():
            raise ConfigError(f"{field}: {policy.relative(path)!r} does not exist",
                              field=field)
        policy.check_tree(path, field)
        if path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                add(f"{name}/{f.relative_to(path).as_posix()}", f)
        else:
            add(name, path)

    out = dict(body)
    notebook = body.get("notebook")
    if notebook:
        where = resolve(notebook, "notebook", policy, is_storage=is_name)
        if where.is_local:
            path = Path(where.text)
            if not path.is_file():
                raise ConfigError(f"notebook: {notebook!r} is not a notebook file here",
                                  field="notebook")
            add_local("notebook", path.name, path)
            out["notebook"] = policy.relative(path)
    remaining = []
    for item in body.get("inputs") or []:
        given, loc = split_named(item)
        where = resolve(loc, "inputs", policy, is_storage=is_name)
        if not where.is_local:
            remaining.append(item)
            continue
        path = Path(where.text)
        add_local("inputs", given or path.name, path)
    out["inputs"] = remaining
    if body.get("output"):
        where = resolve(body["output"], "output", policy, is_storage=is_name, write=True)
        if where.is_local:
            raise PermissionDeniedError(
                "output: jobs run through the hub write their results to a storage "
                "(NAME:path) or keep them in the job's folder (jobs/{id}/files); a folder "
                "of this server is not reachable from the sidekick", field="output")
    if files:
        out["files"] = {**(body.get("files") or {}), **files}
    return json.dumps(out).encode()


def delegated_routes(prefix: str, target: str) -> list[tuple[str, Any, dict[str, Any]]]:
    own = "|".join(OWN)
    pattern = (prefix + r"/(?!(?:" + own + r")(?:/|$))(?P<path>(?:" + "|".join(DELEGATED)
               + r")(?:/.*)?)")
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
