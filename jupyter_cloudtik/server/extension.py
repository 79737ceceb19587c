"""The Jupyter server extension: one cluster manager per server, REST routes, kernel access.

The server is the one owner of long operations: the side panel and every notebook kernel
(through ``CLOUDTIK_API_URL`` and a token in its environment) ask the same
``ClusterManager``, whose operations run on the server's event loop.  Settings are
traitlets created with ``parent=serverapp``, so ``c.CloudTik.*`` and ``c.CloudTikServer.*``
in ``jupyter_server_config.py`` apply.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from jupyter_server.utils import url_path_join
from traitlets import Bool, Float, Int, Unicode
from traitlets.config import Configurable

from ..core.cluster_manager import ClusterManager
from ..core.settings import CloudTik
from ..session import API_URL_ENV
from .routes import build_routes, lifecycle_hooks

API_TOKEN_ENV = "CLOUDTIK_API_TOKEN"
SETTINGS_KEY = "cloudtik"

log = logging.getLogger("jupyter_cloudtik.server")


class CloudTikServer(Configurable):
    """Settings of the REST API (``c.CloudTikServer.*``)."""

    kernel_access = Bool(
        True,
        help="""Give kernels started by this server the API URL and a token that only the
        cloudtik routes accept (CLOUDTIK_API_URL, CLOUDTIK_API_TOKEN), so the %cluster
        magics and the Cluster API in notebooks use this server's clusters and operations.
        """,
    ).tag(config=True)

    max_body_bytes = Int(
        1024 * 1024, help="Largest request body the API accepts, in bytes (413 above)."
    ).tag(config=True)

    event_keepalive = Float(
        15.0, help="Seconds between keep-alive comments on idle event streams."
    ).tag(config=True)

    hub_service_url = Unicode(
        "",
        help="""URL of the JupyterHub cloudtik sidekick service (e.g.
        http://127.0.0.1:10101/services/cloudtik/); default $CLOUDTIK_HUB_SERVICE_URL.
        When set, clusters, operations, storage, jobs and hub/ routes are answered by the
        sidekick for this server's hub user (see docs/hub.md).""",
    ).tag(config=True)

    hub_egress = Bool(
        True,
        help="""With a hub sidekick: give kernels the sidekick's egress proxy settings
        (HTTP(S)_PROXY with this user's proxy credential, and a CA bundle that trusts the
        deployment CA), so requests to ruled hosts get their credentials injected.""",
    ).tag(config=True)


class ServerContext:
    """What the handlers share: settings, the cluster manager, the kernel token.

    Other features keep their managers here too (``feature(name, factory)``), created on
    first use with the same settings and store.
    """

    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp
        self.settings = CloudTik(parent=serverapp)
        self.server = CloudTikServer(parent=serverapp)
        self.manager = ClusterManager(settings=self.settings)
        self.store = self.manager.store
        self.kernel_token = secrets.token_urlsafe(32)
        self._features: dict[str, Any] = {}
        self._list_cache: dict[bool, tuple[Any, str]] = {}
        self._egress_env: dict[str, str] | None = None

    def feature(self, name: str, factory: Callable[[ServerContext], Any]) -> Any:
        if name not in self._features:
            self._features[name] = factory(self)
        return self._features[name]

    def started(self, name: str) -> Any | None:
        """A feature's manager if it was created, else None (for shutdown hooks)."""
        return self._features.get(name)

    def cluster_list_json(self, include_stopped: bool) -> str:
        """The body of GET clusters, re-rendered only when the store changed (or once a
        second, for the clusters' ages): the panel and every notebook poll it."""
        key = (self.store.change_token(), int(time.time()))
        cached = self._list_cache.get(include_stopped)
        if cached is not None and cached[0] == key:
            return cached[1]
        clusters = self.manager.list(include_stopped=include_stopped)
        body = json.dumps({"clusters": [c.to_dict() for c in clusters]}, default=str,
                          separators=(",", ":"))
        self._list_cache[include_stopped] = (key, body)
        return body

    def is_kernel_token(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(token.encode(), self.kernel_token.encode())

    def api_url(self) -> str | None:
        """The API as a kernel on this machine reaches it (None on a unix socket)."""
        app = self.serverapp
        if getattr(app, "sock", ""):
            return None
        scheme = "https" if getattr(app, "certfile", "") else "http"
        ip = app.ip or "localhost"
        if ip in ("0.0.0.0", "*", "localhost"):
            ip = "127.0.0.1"
        elif ip in ("::", "[::]"):
            ip = "[::1]"
        elif ":" in ip and not ip.startswith("["):
            ip = f"[{ip}]"
        return f"{scheme}://{ip}:{app.port}{app.base_url}cloudtik/api/"

    def kernel_env(self) -> dict[str, str]:
        url = self.api_url()
        if not self.server.kernel_access or url is None:
            return {}
        return {API_URL_ENV: url, API_TOKEN_ENV: self.kernel_token}

    async def egress_env(self) -> dict[str, str]:
        """The hub's egress proxy settings for kernels (asked once, then cached)."""
        from .delegate import egress_session_env, hub_service_url

        target = hub_service_url(self.server.hub_service_url)
        if not target or not self.server.hub_egress:
            return {}
        if self._egress_env is None:
            self._egress_env = await egress_session_env(target)
        return self._egress_env

    def after_up(self, op_id: str) -> None:
        """Start the idle reaper when a cluster asks for idle shutdown."""
        from ..core.reaper import ensure_reaper

        try:
            ensure_reaper(self.settings, self.store)
        except Exception as e:  # the cluster still works; only idle shutdown is missing
            self.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                  level="warning")


def _give_kernels_access(serverapp: Any, ctx: ServerContext) -> None:
    """Add the API URL and kernel token to the environment of every kernel started.

    The URL is computed at kernel start, after the server has bound its port.  The server's
    own environment is left alone, so terminals and other subprocesses get nothing.
    """
    km = serverapp.kernel_manager
    original = km.start_kernel

    async def start_kernel(*args: Any, **kwargs: Any) -> Any:
        extra = ctx.kernel_env()
        if extra:
            extra.update(await ctx.egress_env())
            import os

            env = dict(kwargs.get("env") or os.environ)
            env.update(extra)
            kwargs["env"] = env
        return await original(*args, **kwargs)

    km.start_kernel = start_kernel


def _load_jupyter_server_extension(serverapp: Any) -> None:
    ctx = ServerContext(serverapp)
    web_app = serverapp.web_app
    web_app.settings[SETTINGS_KEY] = ctx
    base_url = web_app.settings["base_url"]
    from .delegate import delegated_routes, hub_service_url
    from .routes import API_PREFIX

    target = hub_service_url(ctx.server.hub_service_url)
    delegated = delegated_routes(url_path_join(base_url, API_PREFIX), target) if target else []
    web_app.add_handlers(".*$", delegated + build_routes(base_url))
    if target:
        serverapp.log.info("jupyter_cloudtik: clusters, storage and jobs are delegated to "
                           "the hub sidekick at %s", target)
    if ctx.server.kernel_access:
        _give_kernels_access(serverapp, ctx)
    for hook in lifecycle_hooks("startup"):
        try:
            hook(ctx)
        except Exception:  # a feature that cannot start must not take the server down
            serverapp.log.exception("jupyter_cloudtik: %s failed", hook.__module__)
    _shutdown_features_on_stop(serverapp, ctx)
    serverapp.log.info(
        "jupyter_cloudtik: REST API at %scloudtik/api/ (state: %s)",
        web_app.settings["base_url"], ctx.settings.state_dir,
    )


def _shutdown_features_on_stop(serverapp: Any, ctx: ServerContext) -> None:
    """Run the features' shutdown hooks when the server stops (e.g. unmount storages).

    A function-style extension gets no stop call from jupyter_server, so this wraps the
    server's own extension cleanup, which runs on every orderly stop."""
    original = serverapp.cleanup_extensions

    async def cleanup_extensions(*args: Any, **kwargs: Any) -> Any:
        from .delegate import hub_service_url, stop_my_sidekicks

        await stop_my_sidekicks(hub_service_url(ctx.server.hub_service_url))
        for hook in lifecycle_hooks("shutdown"):
            try:
                hook(ctx)
            except Exception:
                serverapp.log.exception("jupyter_cloudtik: %s failed", hook.__module__)
        return await original(*args, **kwargs)

    serverapp.cleanup_extensions = cleanup_extensions
