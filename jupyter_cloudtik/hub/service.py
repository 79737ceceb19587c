"""``jupyter cloudtik hub-service``: the sidekick, a JupyterHub managed service.

It is a jupyter_server application (so the REST handlers of the server extension serve it
unchanged, with the same paths under the service's prefix) whose identity comes from the
hub (``auth.HubIdentityProvider``) and whose only authorized resource is ``cloudtik``.
Kernels, contents and terminals are not offered.  Its state (clusters, catalogue, secrets,
audit) is its own folder: ``c.CloudTik.state_dir`` or ``$CLOUDTIK_STATE_DIR`` in the
service's environment, never a user's.

Register it in ``jupyterhub_config.py`` (docs/hub.md has the whole snippet)::

    c.JupyterHub.services = [{
        "name": "cloudtik",
        "url": "http://127.0.0.1:10101",
        "command": ["jupyter-cloudtik", "hub-service", "--config", "/etc/cloudtik/hub.py"],
        "oauth_no_confirm": True,
    }]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyter_server.extension.application import ExtensionApp

from ..api.routes import build_routes, lifecycle_hooks
from ..core import env as envnames
from ..core.errors import ConfigError
from . import bootstrap
from .context import HubContext
from .handlers import hub_routes

log = logging.getLogger("jupyter_cloudtik.hub")
SETTINGS_KEY = "cloudtik"


class HubSidekickExtension(ExtensionApp):
    """The sidekick as a jupyter_server ``ExtensionApp``: routes and services start in
    ``initialize_handlers``; ``stop_extension`` (awaited on every orderly stop) stops
    them, so nothing of the server is patched at run time."""

    name = "jupyter_cloudtik.hub.service"

    ctx: HubContext | None = None

    def initialize_settings(self) -> None:
        ctx = HubContext(self.serverapp)
        self.ctx = ctx
        web_app = self.serverapp.web_app
        web_app.settings[SETTINGS_KEY] = ctx
        # deferred: start-up (api.dashboard ~121 ms, loads jupyter_server_proxy; api.spark_ui ~118
        #   ms, loads jupyter_server_proxy)
        from ..api.dashboard import dashboard_prefix
        from ..api.spark_ui import spark_ui_prefix

        # the sidekick serves them
        ctx.manager.dashboard_prefix = dashboard_prefix(web_app.settings["base_url"])
        ctx.manager.spark_ui_prefix = spark_ui_prefix(web_app.settings["base_url"])

    def initialize_handlers(self) -> None:
        """The routes relative to the root (``_prepare_handlers`` adds the base URL)."""
        ctx = self.ctx
        assert ctx is not None
        self.handlers.extend(hub_routes("/") + build_routes("/"))
        try:
            bootstrap.load_catalog_file(ctx)
            bootstrap.start_services(ctx)
        except ConfigError as e:  # a bad catalogue file or egress limit: say what is
            # wrong, do not serve
            self.log.critical("jupyter_cloudtik hub sidekick: %s", e.message)
            raise SystemExit(2) from None
        for hook in lifecycle_hooks("startup", host="hub"):  # e.g. resume adaptive loops
            try:
                hook(ctx)
            except Exception:  # a feature that cannot start must not take the sidekick down
                self.log.exception("jupyter_cloudtik hub sidekick: %s failed",
                                   hook.__module__)
        self.log.info("jupyter_cloudtik hub sidekick: API at %scloudtik/api/ (state: %s)",
                      self.serverapp.base_url, ctx.settings.state_dir)

    async def stop_extension(self) -> None:
        if self.ctx is None:
            return
        try:
            await bootstrap.stop_services(self.ctx)
        except Exception:
            self.log.exception("jupyter_cloudtik hub sidekick: stopping failed")
        for hook in lifecycle_hooks("shutdown", host="hub"):  # e.g. hand the lease back
            try:
                hook(self.ctx)
            except Exception:
                self.log.exception("jupyter_cloudtik hub sidekick: %s failed",
                                   hook.__module__)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "jupyter_cloudtik.hub.service", "app": HubSidekickExtension}]


def server_argv(config: str | None, env: dict[str, str] | None = None) -> list[str]:
    """The jupyter_server command line of the sidekick, from the hub's service env."""
    env = dict(os.environ if env is None else env)
    url = urlparse(env.get("JUPYTERHUB_SERVICE_URL") or "http://127.0.0.1:10101")
    prefix = env.get("JUPYTERHUB_SERVICE_PREFIX") or "/services/cloudtik/"
    argv = [
        f"--ServerApp.ip={url.hostname or '127.0.0.1'}",
        f"--ServerApp.port={url.port or 10101}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={prefix}",
        "--ServerApp.open_browser=False",
        "--ServerApp.terminals_enabled=False",
        "--ServerApp.identity_provider_class=jupyter_cloudtik.hub.auth.HubIdentityProvider",
        "--ServerApp.authorizer_class=jupyter_cloudtik.hub.auth.HubAuthorizer",
        # the hub's proxy is the only way in; its host name is not ours
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.trust_xheaders=True",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--ServerApp.allow_root=True")  # containers often run services as root
    if config:
        argv.append(f"--config={config}")
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jupyter cloudtik hub-service",
        description="Run the cloudtik sidekick as a JupyterHub managed service "
                    "(the hub sets JUPYTERHUB_* in its environment).")
    parser.add_argument("--config", help="a Python config file (c.CloudTikHub.*, "
                                         "c.CloudTik.*, c.HPC.*, c.Storage.*)")
    args = parser.parse_args(argv)
    if args.config and not Path(args.config).is_file():
        print(f"--config: {args.config!r} is not a file", file=sys.stderr)
        return 2
    if not os.environ.get("JUPYTERHUB_API_TOKEN"):
        print("JUPYTERHUB_API_TOKEN is not set: run this as a JupyterHub managed service "
              "(c.JupyterHub.services, see docs/hub.md)", file=sys.stderr)
        return 2
    from jupyter_server.serverapp import ServerApp

    root = Path(os.environ.get(envnames.STATE_DIR) or Path.cwd()) / "hub-root"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    app = ServerApp()
    # only the sidekick: no notebook UI or other server extensions in this process
    app.jpserver_extensions = {"jupyter_cloudtik.hub.service": True}
    app.initialize([*server_argv(args.config), f"--ServerApp.root_dir={root}"],
                   find_extensions=False)
    app.start()
    return 0
