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
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join

from ..api.routes import API_PREFIX, build_routes, lifecycle_hooks
from ..api.settings import CloudTikServer
from ..clusters.client import API_URL_ENV
from ..clusters.manager import ClusterManager
from ..clusters.reaper import ensure_reaper
from ..core import env
from ..core.features import ensure_schemas
from ..core.locations import ServerRoot
from ..core.settings import CloudTik
from ..providers.local.prewarm import prewarm_in_background
from .delegate import delegated_routes, egress_session_env, hub_service_url, stop_my_sidekicks
from .kernels import use_cloudtik_provisioner

API_TOKEN_ENV = env.API_TOKEN
SETTINGS_KEY = "cloudtik"

log = logging.getLogger("jupyter_cloudtik.server")


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
        self._locations: Any = None

    @property
    def locations(self) -> Any:
        """The location policy of this server (``core.locations.ServerRoot``): every
        feature resolves the local paths it is given through it."""
        if self._locations is None:
            self._locations = ServerRoot(
                self.serverapp.root_dir,
                allow_hidden=bool(getattr(getattr(self.serverapp, "contents_manager", None),
                                          "allow_hidden", False)),
                refused=server_refused_folders(self.serverapp, self.settings),
                max_stage_bytes=self.server.max_stage_bytes)
        return self._locations

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
        target = hub_service_url(self.server.hub_service_url)
        if not target or not self.server.hub_egress:
            return {}
        if self._egress_env is None:
            self._egress_env = await egress_session_env(target)
        return self._egress_env

    def after_up(self, op_id: str) -> None:
        """Start the idle reaper when a cluster asks for idle shutdown."""
        try:
            ensure_reaper(self.settings, self.store)
        except Exception as e:  # the cluster still works; only idle shutdown is missing
            self.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                  level="warning")


def server_refused_folders(serverapp: Any, settings: CloudTik) -> list[tuple[str, str]]:
    """Folders never reachable through the API, even inside the root: the cloudtik state
    folder (the secret store's key, every record) and Jupyter's runtime folder (the
    server's connection file with its token, kernels' connection files)."""
    from jupyter_core.paths import jupyter_runtime_dir

    runtime = getattr(serverapp, "runtime_dir", "") or jupyter_runtime_dir()
    return [(str(settings.state_dir), "the cloudtik state folder"),
            (runtime, "Jupyter's runtime folder")]


class CloudTikExtension(ExtensionApp):
    """The server extension as jupyter_server intends one: the extension manager creates
    it, ``initialize_settings``/``initialize_handlers`` add the context and routes,
    ``_start_jupyter_server_extension`` runs once the loop runs and ``stop_extension`` on
    every orderly stop (``ServerApp.cleanup_extensions`` awaits it).  Kernels get the API
    URL and their token through ``server.kernels.CloudTikProvisioner``, a kernel
    provisioner, so nothing of the server is patched at run time."""

    name = "jupyter_cloudtik"

    ctx: ServerContext | None = None

    def initialize_settings(self) -> None:
        serverapp = self.serverapp
        ctx = ServerContext(serverapp)
        self.ctx = ctx
        web_app = serverapp.web_app
        web_app.settings[SETTINGS_KEY] = ctx
        # deferred: start-up (api.dashboard ~114 ms, loads jupyter_server_proxy; api.spark_ui ~115
        #   ms, loads jupyter_server_proxy)
        from ..api.dashboard import dashboard_prefix
        from ..api.spark_ui import spark_ui_prefix

        ctx.manager.dashboard_prefix = dashboard_prefix(web_app.settings["base_url"])
        ctx.manager.spark_ui_prefix = spark_ui_prefix(web_app.settings["base_url"])

        ensure_schemas(ctx.store)  # every feature's tables, before any request reads them
        if ctx.server.kernel_access:
            use_cloudtik_provisioner(serverapp)

    def initialize_handlers(self) -> None:
        """The routes relative to the server's root: ``_prepare_handlers`` puts the
        base URL in front of each."""
        assert self.ctx is not None
        target = hub_service_url(self.ctx.server.hub_service_url)
        delegated = delegated_routes(url_path_join("/", API_PREFIX), target) if target else []
        self.handlers.extend(delegated + build_routes("/"))
        if target:
            self.log.info("jupyter_cloudtik: clusters, storage and jobs are delegated to "
                          "the hub sidekick at %s", target)
        for hook in lifecycle_hooks("startup"):
            try:
                hook(self.ctx)
            except Exception:  # a feature that cannot start must not take the server down
                self.log.exception("jupyter_cloudtik: %s failed", hook.__module__)
        if not target:
            _tell_terminals(self.ctx, self.serverapp.base_url)
        if not target:  # clusters live here: the first `%cluster up` finds Dask imported

            prewarm_in_background(self.ctx.settings)
        self.log.info("jupyter_cloudtik: REST API at %scloudtik/api/ (state: %s)",
                      self.serverapp.base_url, self.ctx.settings.state_dir)

    async def stop_extension(self) -> None:
        """The features' shutdown hooks (unmount storages, ...) and this user's
        sidekicks on the hub: awaited by the server on every orderly stop."""
        ctx = self.ctx
        if ctx is None:
            return
        await stop_my_sidekicks(hub_service_url(ctx.server.hub_service_url))
        for hook in lifecycle_hooks("shutdown"):
            try:
                hook(ctx)
            except Exception:
                self.log.exception("jupyter_cloudtik: %s failed", hook.__module__)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": __name__, "app": CloudTikExtension}]


def _tell_terminals(ctx: ServerContext, base_url: str) -> None:
    """The CLI in a terminal of this server (its processes inherit the server's
    environment) shows dashboards and Spark UIs through this server, as the magics do: a
    browser of a remote JupyterLab reaches only the server, not a node's own port."""
    # deferred: start-up (api.dashboard ~114 ms, loads jupyter_server_proxy; api.spark_ui ~115 ms,
    #   loads jupyter_server_proxy)
    from ..api.dashboard import dashboard_prefix
    from ..api.spark_ui import spark_ui_prefix

    os.environ[env.SERVER_LINKS] = json.dumps({
        "state_dir": str(ctx.settings.state_dir), "dashboard": dashboard_prefix(base_url),
        "spark": spark_ui_prefix(base_url)})

