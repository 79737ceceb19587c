"""Sizes as people write them (``2GiB``, ``512MB``) and as bytes."""

from __future__ import annotations

import re

from .errors import ConfigError

_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "KIB": 1024, "KI": 1024,
    "M": 1000**2, "MB": 1000**2, "MIB": 1024**2, "MI": 1024**2,
    "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "GI": 1024**3,
    "T": 1000**4, "TB": 1000**4, "TIB": 1024**4, "TI": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | float | str, field: str = "memory") -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{field}: {value!r} is not a size", field=field)
    if isinstance(value, (int, float)):
        if not value >= 0:  # also NaN (JSON's NaN, which Python's json reads)
            raise ConfigError(f"{field}: {value} is negative", field=field)
        return _bounded(value, value, field)
    text = str(value)
    m = _SIZE.match(text) if len(text) <= 40 else None
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise ConfigError(
            f"{field}: {shown!r} is not a size; use bytes or a number with a unit such as "
            "512MiB, 2GiB or 4GB",
            field=field,
        )
    return _bounded(float(m.group(1)) * _UNITS[unit], value, field)


MAX_BYTES = 2**63 - 1  # what the stores and the OS count in; more is a typo


def _bounded(n: float, value: object, field: str) -> int:
    if not n <= MAX_BYTES:  # also inf: 1e400 as a float
        raise ConfigError(f"{field}: {value!r} is more than {MAX_BYTES} bytes", field=field)
    return int(n)


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
