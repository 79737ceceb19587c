"""Plugins are found through entry points and chosen by short name.

Groups: ``jupyter_cloudtik.providers`` (node providers), and the groups later features add
(HPC backends, placement filters and weighers).  A third-party package adds a plugin by
declaring an entry point in its own ``pyproject.toml``; nothing here needs to change.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from .errors import ConfigError

PROVIDERS = "jupyter_cloudtik.providers"
WORKSPACE_PROVIDERS = "jupyter_cloudtik.workspace_providers"


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def load_all(group: str) -> list[tuple[str, Any]]:
    """Every plugin of ``group``, loaded, by name (a broken one is a ``ConfigError``)."""
    return [(name, load(group, name)) for name in installed(group)]


def installed(group: str) -> list[str]:
    """Names of the plugins installed for ``group``, sorted."""
    return sorted(_entry_points(group))


def load(group: str, name: str, *, field: str = "type", what: str = "plugin") -> Any:
    """The object behind plugin ``name``; a clear ``ConfigError`` if it is unknown."""
    eps = _entry_points(group)
    if name not in eps:
        names = ", ".join(sorted(eps)) or "none"
        raise ConfigError(
            f"{field}: unknown {what} '{name}'; installed: {names}", field=field, value=name
        )
    try:
        return eps[name].load()
    except ImportError as e:
        raise ConfigError(
            f"{field}: the {what} '{name}' is installed but cannot be imported: {e}",
            field=field,
        ) from e
