"""Paths that people type: ``~`` expanded, with an error that names the field."""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError


def user_path(text: str, field: str = "path") -> Path:
    """``text`` with ``~`` / ``~/x`` as this account's home; ``~name/x`` must name an
    existing account (Python raises a bare RuntimeError for an unknown one)."""
    try:
        return Path(text).expanduser()
    except (RuntimeError, KeyError):
        account = text.split("/", 1)[0][1:]
        raise ConfigError(
            f"{field}: {text!r} starts with '~{account}', but there is no account "
            f"{account!r} whose home folder it could mean", field=field, value=text) from None
