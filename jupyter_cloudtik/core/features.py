"""Features register once: the ``jupyter_cloudtik.features`` entry point group.

Each feature (clusters, workspaces, storage, hpc, placement, the hub's own, or a third
party's) declares one entry point naming a ``Feature``; from it the faces find what the
feature adds, so none of them keeps a list of features:

- ``magics``: ``"module:Class"`` IPython ``Magics`` classes (``%load_ext jupyter_cloudtik``);
- ``cli``: modules with ``COMMANDS`` (top-level command names), ``add_commands(subparsers)``
  and ``run(args) -> exit code`` (``jupyter cloudtik ...``);
- ``routes``: modules with ``ROUTES`` (paths relative to ``{base_url}cloudtik/api``) and
  optionally ``startup(ctx)``/``shutdown(ctx)``, mounted by both hosts (server and sidekick);
- ``startup``/``shutdown``: more ``"module:function"`` hooks called with the host's context;
- ``node_runtime``: ``"module:function"`` contributions to every node's runtime config,
  ``contribute(manager, cluster_config, role) -> dict``;
- ``cluster_ready``: ``"module:function"`` coroutines awaited when a cluster's nodes are up,
  before it is reported running, ``await ready(manager, cluster_config, info)`` returning a
  ``(stage, message)`` progress line or None (storage hands its remotes to the workers);
- ``migrations``: ``(area, "module:LIST")`` store migrations, applied by ``ensure_schemas``
  when a host starts (each table owner still calls ``ensure_schema`` itself on first use);
- ``services``: ``(name, "module:attr")`` what a layer below may use of the feature without
  importing it, found with ``feature_service(name)`` (the Slurm node provider resolves an HPC
  backend's login node through hpc's ``slurm_login``).

References are strings, imported only by the face that needs them: the CLI never imports
IPython, a kernel never imports tornado handlers.  Features load in the order of their entry
point names (a number prefix keeps the clusters' routes first).  ``jupyter_cloudtik.features``
is the only group of features: a plugin adds routes or node-runtime parts through a Feature.

A third-party package adds a feature with, in its own ``pyproject.toml``::

    [project.entry-points."jupyter_cloudtik.features"]
    90-quotas = "my_quotas.feature:FEATURE"

where ``FEATURE = Feature("quotas", magics=("my_quotas.magics:QuotaMagics",), ...)``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

from . import plugins
from .errors import ConfigError

FEATURES = "jupyter_cloudtik.features"


@dataclass(frozen=True)
class Feature:
    """What one feature contributes to the faces and hosts (see the module docstring)."""

    name: str
    magics: tuple[str, ...] = ()
    cli: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    startup: tuple[str, ...] = ()
    shutdown: tuple[str, ...] = ()
    node_runtime: tuple[str, ...] = ()
    cluster_ready: tuple[str, ...] = ()
    migrations: tuple[tuple[str, str], ...] = ()
    services: tuple[tuple[str, str], ...] = ()


def resolve(ref: str) -> Any:
    """``"package.module"`` is the module, ``"package.module:attr"`` an attribute of it."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"feature part '{ref}' cannot be loaded: {e}",
                          field="feature", value=ref) from e


@cache
def features() -> tuple[Feature, ...]:
    """Every installed feature, in entry point name order."""
    found: list[tuple[str, Feature]] = []
    for name, feature in plugins.load_all(FEATURES):
        if not isinstance(feature, Feature):
            raise ConfigError(f"feature entry point '{name}' names {feature!r}, "
                              "not a jupyter_cloudtik.core.features.Feature",
                              field="feature", value=name)
        found.append((name, feature))
    found.sort(key=lambda item: item[0])
    return tuple(feature for _name, feature in found)


def _parts(field: str) -> list[str]:
    seen: list[str] = []
    for feature in features():
        for ref in getattr(feature, field):
            if ref not in seen:
                seen.append(ref)
    return seen


def magics_classes() -> list[Any]:
    return [resolve(ref) for ref in _parts("magics")]


def cli_modules() -> list[Any]:
    return [resolve(ref) for ref in _parts("cli")]


def route_modules() -> list[Any]:
    return [resolve(ref) for ref in _parts("routes")]


def node_runtime_contributors() -> list[Any]:
    return [resolve(ref) for ref in _parts("node_runtime")]


def cluster_ready_hooks() -> list[Any]:
    return [resolve(ref) for ref in _parts("cluster_ready")]


def hooks(name: str, host: str = "server") -> list[Any]:
    """The ``startup`` or ``shutdown`` hooks for ``host``: the route modules' functions of
    that name (for the hosts in the module's ``HOOK_HOSTS``, default the server only, since
    the hub's context differs), then, on the server, the features' explicit ones."""
    found = [getattr(m, name) for m in route_modules() if callable(getattr(m, name, None))
             and host in getattr(m, "HOOK_HOSTS", ("server",))]
    return found + ([resolve(ref) for ref in _parts(name)] if host == "server" else [])


def feature_service(name: str) -> Any:
    """The part some installed feature registers as service ``name``: how a plugin (a
    provider, say) uses a feature above it without importing it.  A ``ConfigError`` when
    no installed feature offers it (the caller cannot go on without it)."""
    for feature in features():
        for service_name, ref in feature.services:
            if service_name == name:
                return resolve(ref)
    raise ConfigError(f"service '{name}': no installed feature offers it",
                      field="service", value=name)


def ensure_schemas(store: Any) -> list[str]:
    """Apply every feature's store migrations; the areas migrated, in order."""
    areas = []
    for feature in features():
        for area, ref in feature.migrations:
            store.ensure_schema(area, resolve(ref))
            areas.append(area)
    return areas
