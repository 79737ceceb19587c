"""The elements of a sweep: the grid, paired (zip) values or explicit elements, expanded
into one parameter dict per element, with bad input refused as one ``ConfigError`` naming
the field."""

from __future__ import annotations

import builtins
import itertools
from typing import Any

from ..core.errors import ConfigError


def expand(
    grid: dict[str, Any] | None = None,
    zip: dict[str, Any] | None = None,
    elements: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The elements of a sweep: the cartesian product of ``grid``'s values, times the
    rows of ``zip`` (paired values, all lists of one length), or ``elements`` (a list of
    parameter dicts) as given.  Bad input is one ``ConfigError`` naming the field."""
    if elements is not None:
        if grid or zip:
            raise ConfigError(
                "elements: give either elements (a list of parameter dicts) or grid/zip, not both",
                field="elements",
            )
        if not isinstance(elements, list) or not elements:
            raise ConfigError(
                f"elements: {_short(elements)} is not a non-empty list of parameter dicts",
                field="elements",
            )
        out = []
        for i, e in enumerate(elements):
            if not isinstance(e, dict) or not all(isinstance(k, str) for k in e):
                raise ConfigError(
                    f"elements[{i}]: {_short(e)} is not a dict of parameters",
                    field=f"elements[{i}]",
                )
            out.append(dict(e))
        return out
    grid, zip = grid or {}, zip or {}
    for what, given in (("grid", grid), ("zip", zip)):
        if not isinstance(given, dict):
            raise ConfigError(
                f"{what}: {_short(given)} is not a mapping of parameter names to lists of values",
                field=what,
            )
        for k, v in given.items():
            if not isinstance(v, (list, tuple)) or not v:
                raise ConfigError(
                    f"{what}.{k}: {_short(v)} is not a non-empty list of values",
                    field=f"{what}.{k}",
                )
    if not grid and not zip:
        raise ConfigError(
            "grid: the sweep is empty; give at least one parameter with its "
            "values (grid={'alpha': [0.1, 0.2]}, zip=... or elements=[...])",
            field="grid",
        )
    both = sorted(set(grid) & set(zip))
    if both:
        raise ConfigError(
            f"zip.{both[0]}: {both[0]!r} is in grid and zip; give it once", field=f"zip.{both[0]}"
        )
    rows: list[dict[str, Any]] = [{}]
    if zip:
        lengths = {k: len(v) for k, v in zip.items()}
        first = next(iter(zip))
        for k, n in lengths.items():
            if n != lengths[first]:
                raise ConfigError(
                    f"zip.{k}: {n} values, but zip.{first} has "
                    f"{lengths[first]}; paired values need lists of one "
                    "length",
                    field=f"zip.{k}",
                )
        rows = [
            dict(zip_row)
            for zip_row in ({k: zip[k][i] for k in zip} for i in range(lengths[first]))
        ]
    total = len(rows) * _product(len(v) for v in grid.values())
    if total > 10_000_000:  # never materialise an absurd product just to refuse it
        raise ConfigError(f"grid: {total} elements is far more than a sweep may have", field="grid")
    out = []
    for combo in itertools.product(*[list(v) for v in grid.values()]):
        for row in rows:
            out.append({**dict(builtins.zip(grid, combo, strict=True)), **row})
    return out


def _product(ns: Any) -> int:
    total = 1
    for n in ns:
        total *= n
    return total


def _short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "…"


def _source_field(
    key: str, grid: dict | None, zip: dict | None, index: int, from_elements: bool
) -> str:
    if from_elements:
        return f"elements[{index}].{key}"
    if zip and key in zip:
        return f"zip.{key}"
    if grid and key in grid:
        return f"grid.{key}"
    return f"parameters.{key}"
