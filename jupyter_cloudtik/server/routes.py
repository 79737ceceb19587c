"""Where the REST routes come from: one module per feature, each with a ``ROUTES`` list.

A route module may also define ``startup(ctx)`` and ``shutdown(ctx)``, called when the
server extension loads and when the server stops.

A feature adds its API by writing ``server/<feature>_handlers.py`` with
``ROUTES = [(r"/storage", StorageHandler), ...]`` (paths relative to
``{base_url}cloudtik/api``) and listing the module in ``ROUTE_MODULES``.  Handlers derive
from ``base.CloudTikHandler`` so they share authentication, authorization (resource
``cloudtik``), JSON errors and body checks; the catch-all 404 stays last.
"""

from __future__ import annotations

import importlib
from typing import Any

from jupyter_server.utils import url_path_join

API_PREFIX = "cloudtik/api"

ROUTE_MODULES: tuple[str, ...] = (
    "jupyter_cloudtik.server.handlers",
    "jupyter_cloudtik.server.placement_handlers",
    "jupyter_cloudtik.server.workspace_handlers",
    "jupyter_cloudtik.server.hpc_handlers",
    "jupyter_cloudtik.server.storage_handlers",
)


def route_table() -> list[tuple[str, Any]]:
    """(path relative to the API prefix, handler class) of every feature, catch-all last."""
    from .base import NotFoundHandler

    table: list[tuple[str, Any]] = []
    for name in ROUTE_MODULES:
        table.extend(importlib.import_module(name).ROUTES)
    table.append((r"(?:/.*)?", NotFoundHandler))
    return table


def lifecycle_hooks(name: str) -> list[Any]:
    """The ``startup`` or ``shutdown`` functions of the route modules that define one."""
    hooks = []
    for module in ROUTE_MODULES:
        fn = getattr(importlib.import_module(module), name, None)
        if callable(fn):
            hooks.append(fn)
    return hooks


def build_routes(base_url: str) -> list[tuple[str, Any]]:
    prefix = url_path_join(base_url, API_PREFIX)
    return [(prefix + path, handler) for path, handler in route_table()]
