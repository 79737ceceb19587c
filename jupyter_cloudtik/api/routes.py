"""Where the REST routes come from: the features' ``routes`` (``core/features.py``).

Each feature names modules with a ``ROUTES`` list (paths relative to
``{base_url}cloudtik/api``) and, optionally, ``startup(ctx)`` and ``shutdown(ctx)``,
called when the host loads and stops (by the single-user server; also by the hub's
sidekick when the module lists ``"hub"`` in ``HOOK_HOSTS``).  A feature (ours or a third
party's) adds its API by declaring a feature whose ``routes`` name such a module; both
hosts (the server extension and the hub's sidekick) mount the same table, so this layer
imports neither.  Handlers derive from ``base.CloudTikHandler``; the catch-all 404 stays last.
Modules load in the order of the features' entry point names (a number prefix keeps the
clusters' routes first).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from jupyter_server.utils import url_path_join

from ..core import features

API_PREFIX = "cloudtik/api"


def route_modules() -> list[ModuleType]:
    return features.route_modules()


def route_table() -> list[tuple[str, Any]]:
    """(path relative to the API prefix, handler class) of every feature, catch-all last."""
    # deferred: start-up (api.base ~64 ms, loads jupyter_server, jinja2)
    from .base import NotFoundHandler

    table: list[tuple[str, Any]] = []
    for module in route_modules():
        table.extend(module.ROUTES)
    table.append((r"(?:/.*)?", NotFoundHandler))
    return table


def lifecycle_hooks(name: str, host: str = "server") -> list[Any]:
    """The ``startup`` or ``shutdown`` functions for ``host``: route modules define them
    for the hosts in their ``HOOK_HOSTS`` (default ``("server",)``: the hub's context
    differs), features for the server."""
    return features.hooks(name, host)


def build_routes(base_url: str) -> list[tuple[str, Any]]:
    """The dashboard proxy (under ``{base_url}cloudtik/dashboard/``), the Spark UI proxy
    (``{base_url}cloudtik/spark/``) and the API."""
    # deferred: start-up (api.dashboard ~174 ms, loads jupyter_server_proxy, jupyter_server;
    #   api.spark_ui ~177 ms, loads jupyter_server_proxy, jupyter_server)
    from .dashboard import dashboard_routes
    from .spark_ui import spark_ui_routes

    prefix = url_path_join(base_url, API_PREFIX)
    return dashboard_routes(base_url) + spark_ui_routes(base_url) + [(prefix + path, handler)
                                         for path, handler in route_table()]
