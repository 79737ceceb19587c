"""Sizes and durations as people write them (``2GiB``, ``512MB``; ``30m``, ``1:30:00``)
and as bytes and seconds."""

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


_DURATION_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_duration(value: str | int | float | None, field: str = "time") -> float | None:
    """Seconds from what people write: ``90`` (minutes, as Slurm reads it), ``30m``,
    ``2h``, ``1:30:00``, ``2-00:00:00`` (days-hours:minutes:seconds); at most
    ``MAX_DURATION``."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{field}: {value!r} is not a duration", field=field)
    if isinstance(value, (int, float)):
        if not value > 0:  # also NaN (JSON's NaN, which Python's json reads)
            raise ConfigError(f"{field}: {value} is not a positive duration", field=field)
        return _bounded_duration(float(value) * 60, value, field)
    text = str(value).strip().lower()
    if len(text) > 40:  # no duration needs more; int() refuses 4300 digits with ValueError
        raise ConfigError(f"{field}: {_short(text)!r} is not a duration (too long)",
                          field=field)
    m = _UNIT.match(text)
    if m and m.group(2) in _DURATION_UNITS:
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        m = _CLOCK.match(text)
        if not m:
            raise ConfigError(
                f"{field}: {value!r} is not a duration; use minutes (90), 30m, 2h, 1:30:00 "
                "or 2-00:00:00", field=field)
        days, a, b, c = m.groups()
        parts = [int(x) for x in (a, b, c) if x is not None]
        if days is not None:  # D-HH[:MM[:SS]]
            parts += [0] * (3 - len(parts))
            seconds = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
        elif len(parts) == 1:
            seconds = parts[0] * 60  # minutes
        elif len(parts) == 2:
            seconds = parts[0] * 60 + parts[1]  # MM:SS, as Slurm reads it
        else:
            seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds <= 0:
        raise ConfigError(f"{field}: {value!r} is not a positive duration", field=field)
    return _bounded_duration(seconds, value, field)


MAX_DURATION = 3650 * 86400.0  # ten years: more is a typo (and overflows as a float)


def _bounded_duration(seconds: float, value: object, field: str) -> float:
    if not seconds <= MAX_DURATION:  # also inf and NaN
        raise ConfigError(f"{field}: {_short(str(value))!r} is longer than "
                          f"{MAX_DURATION / 86400:.0f} days, the longest duration allowed",
                          field=field)
    return float(seconds)


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "…"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    days, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{days}-" if days else "") + f"{h:02d}:{m:02d}:{s:02d}"
