"""JSON from outside (REST bodies, query text): parsed into a 400, never a 500.

``json.loads`` alone lets three things through that break later, as a 500 or worse: nesting
deep enough for a ``RecursionError`` (in the decoder, or afterwards in the schema check or a
``deepcopy``), ``NaN``/``Infinity`` (Python's extensions, not JSON: stored, they make
records no other JSON reader accepts) and bytes that are not UTF-8.  :func:`loads` refuses
each with a ``ConfigError`` naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ConfigError

MAX_DEPTH = 64  # of arrays and objects; a cluster config or a filter query needs ~10
# values in all: JSON text is bounded by its length, YAML is not (aliases share a node, so
# ten aliases of ten aliases of ... is a billion values in a few hundred bytes)
MAX_VALUES = 1_000_000


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(raw: bytes | str, field: str = "body") -> Any:
    """``raw`` as JSON, refusing what is not plain JSON (``NaN``, lone surrogates such as
    ``"\\ud800"``, which no UTF-8 encoder writes) or is nested deeper than ``MAX_DEPTH``
    (``ConfigError`` naming ``field``)."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{field}: not valid JSON ({e.msg} at line {e.lineno}, column "
                          f"{e.colno})", field=field) from None
    except RecursionError:
        problem: str | None = f"JSON nested more than {MAX_DEPTH} levels deep"
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{field}: not valid JSON ({e})", field=field) from None
    else:
        problem = check(data)
    if problem:
        raise ConfigError(f"{field}: {problem}", field=field)
    return data


def check(value: Any) -> str | None:
    """What makes ``value`` (parsed JSON) unfit, or None: nesting deeper than
    ``MAX_DEPTH``, more than ``MAX_VALUES`` values, a string that is not Unicode text.
    Iterative: any depth is measured without a ``RecursionError``."""
    stack = [(value, 0)]
    seen = 0
    while stack:
        v, d = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            return f"more than {MAX_VALUES} values (YAML aliases of aliases?)"
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return f"the text {v[:40]!r} holds a lone surrogate, which is no character"
            continue
        if isinstance(v, dict):
            items = [*v.keys(), *v.values()]
        elif isinstance(v, list):
            items = v
        else:
            continue
        if d + 1 > MAX_DEPTH:
            return f"JSON nested more than {MAX_DEPTH} levels deep"
        stack.extend((x, d + 1) for x in items)
    return None
