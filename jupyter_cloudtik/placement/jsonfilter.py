"""The JSON filter's query language: LISP-like lists over ``$``-variables.

A query is a JSON list ``[operator, arg, ...]``; arguments are literals, ``$variables``
or nested queries::

    ["and", [">=", "$free_ram_mb", 4096],
            ["in", "$capabilities.arch", "x86_64", "aarch64"],
            ["not", ["=", "$spot", true]]]

Operators: ``=``, ``<``, ``>``, ``<=``, ``>=`` (exactly two arguments), ``in`` (the first
argument is one of the others), ``not`` (one argument), ``and`` / ``or`` (one or more).
A query is compiled once per request into Python closures, so evaluating it on ten
thousand offers is cheap, and every mistake is reported at compile time with the path of
the bad sub-expression (``query[1][2]``) and what would be right.

Queries over free amounts (``$free_cpus`` ...) are checked again before every instance
placed on an offer, against the virtually depleted capacity; write them so that less free
room can only make them false (``>=``, not ``<``).

At evaluation a comparison between values that cannot be ordered (a number and a text,
or a missing capability) is false: filtering is absolute, an offer that cannot be shown
to qualify does not.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from typing import Any

from ..core import jsontext
from ..core.errors import ConfigError
from ..offers import Offer, VirtualState

Getter = Callable[[Offer, VirtualState], Any]
Compiled = Callable[[Offer, VirtualState], Any]

MIB = 1024 * 1024

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge,
}
OPERATORS = (*COMPARISONS, "in", "not", "and", "or")


def _free(dim: str, scale: float = 1.0) -> Getter:
    # a free amount of None is "no limit" (room_for counts it as math.inf): a query like
    # [">=", "$free_ram_mb", 8192] holds there (the local provider without overcommit)
    def get(o: Offer, s: VirtualState) -> Any:
        v = s.free(o, dim)
        return math.inf if v is None else v / scale
    return get


def _total(dim: str, scale: float = 1.0) -> Getter:
    def get(o: Offer, s: VirtualState) -> Any:
        v = o.total.get(dim)
        return None if v is None else v / scale
    return get


def _size(dim: str, scale: float = 1.0) -> Getter:
    def get(o: Offer, s: VirtualState) -> Any:
        v = (o.size or {}).get(dim)
        return None if v is None else v / scale
    return get


#: variable name (without ``$``) -> getter; ``$capabilities.X`` is open-ended
VARIABLES: dict[str, Getter] = {
    "free_cpus": _free("CPU"),
    "free_memory": _free("memory"),
    "free_ram_mb": _free("memory", MIB),
    "free_disk": _free("disk"),
    "free_disk_mb": _free("disk", MIB),
    "free_gpus": _free("GPU"),
    "free_instances": _free("instances"),
    "total_cpus": _total("CPU"),
    "total_memory": _total("memory"),
    "total_ram_mb": _total("memory", MIB),
    "total_gpus": _total("GPU"),
    "vcpus": _size("CPU"),
    "ram_mb": _size("memory", MIB),
    "gpus": _size("GPU"),
    "price_per_hour": lambda o, s: o.price_per_hour,
    "provider": lambda o, s: o.provider,
    "region": lambda o, s: o.region,
    "availability_zone": lambda o, s: o.availability_zone,
    "flavor": lambda o, s: o.flavor,
    "arch": lambda o, s: o.arch,
    "spot": lambda o, s: o.spot,
    "recent_failures": lambda o, s: o.recent_failures,
    "instances": lambda o, s: len(o.instances),
}


def _capability(path: list[str]) -> Getter:
    def get(o: Offer, s: VirtualState) -> Any:
        v: Any = o.capabilities
        for part in path:
            if not isinstance(v, dict) or part not in v:
                return None
            v = v[part]
        return v
    return get


def _variable(name: str, where: str) -> Getter:
    if name.startswith("capabilities."):
        parts = name.split(".")[1:]
        if not all(parts):
            raise ConfigError(f"{where}: '${name}' has an empty part; write "
                              "'$capabilities.NAME[.SUB...]'", field=where, value=f"${name}")
        return _capability(parts)
    if name in VARIABLES:
        return VARIABLES[name]
    raise ConfigError(
        f"{where}: unknown variable '${name}'; known: "
        f"{', '.join('$' + v for v in sorted(VARIABLES))}, $capabilities.NAME",
        field=where, value=f"${name}")


def _is_literal(x: Any) -> bool:
    return not isinstance(x, list | dict) and not (isinstance(x, str) and x.startswith("$"))


def _safe(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def cmp(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return op is operator.eq and a is b
        if isinstance(a, bool) != isinstance(b, bool):
            return False  # True is not 1 for a query author
        try:
            return bool(op(a, b))
        except TypeError:
            return False
    return cmp


def parse(query: Any, field: str = "query") -> Any:
    """A query given as JSON text is parsed; syntax errors say where."""
    if isinstance(query, str):
        return jsontext.loads(query, field)
    problem = jsontext.check(query)  # given as JSON already (a REST body's own part)
    if problem:
        raise ConfigError(f"{field}: {problem}", field=field)
    return query


def compile_query(query: Any, field: str = "query") -> Compiled:
    """Turn a query into a function ``(offer, state) -> bool``."""
    query = parse(query, field)
    if not isinstance(query, list):
        raise ConfigError(f"{field}: a query is a list [operator, argument, ...], not "
                          f"{_show(query)}", field=field, value=query)
    fn = _compile(query, field)
    return lambda o, s: bool(fn(o, s))


def depends_on_depletion(query: Any) -> bool:
    """Does the query read free amounts (``$free_*``), which change as instances are
    placed?  Then the JSON filter is re-checked before each placement on an offer."""
    def walk(x: Any) -> bool:
        if isinstance(x, list):
            return any(walk(y) for y in x)
        return isinstance(x, str) and x.startswith("$free_")

    return walk(parse(query))


def _show(x: Any) -> str:
    text = json.dumps(x) if not callable(x) else repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _compile(node: Any, where: str) -> Compiled:
    if isinstance(node, list):
        if not node:
            raise ConfigError(f"{where}: empty list; expected [operator, argument, ...] "
                              f"with an operator from {', '.join(OPERATORS)}", field=where)
        op, args = node[0], node[1:]
        if not isinstance(op, str) or op not in OPERATORS:
            raise ConfigError(f"{where}[0]: {_show(op)} is not an operator; use one of "
                              f"{', '.join(OPERATORS)} (in {_show(node)})",
                              field=f"{where}[0]", value=op)
        subs = [_compile(a, f"{where}[{i + 1}]") for i, a in enumerate(args)]
        if op in COMPARISONS:
            if len(subs) != 2:
                raise ConfigError(f"{where}: '{op}' takes exactly 2 arguments, got "
                                  f"{len(subs)} in {_show(node)}", field=where, value=node)
            a, b = subs
            cmp = _safe(COMPARISONS[op])
            if _is_literal(args[1]):
                lit = args[1]
                return lambda o, s: cmp(a(o, s), lit)
            return lambda o, s: cmp(a(o, s), b(o, s))
        if op == "in":
            if len(subs) < 2:
                raise ConfigError(f"{where}: 'in' needs a value and at least one candidate, "
                                  f"got {_show(node)}", field=where, value=node)
            first, rest = subs[0], subs[1:]
            eq = _safe(operator.eq)
            return lambda o, s: (lambda v: any(eq(v, r(o, s)) for r in rest))(first(o, s))
        if op == "not":
            if len(subs) != 1:
                raise ConfigError(f"{where}: 'not' takes exactly 1 argument, got {len(subs)} "
                                  f"in {_show(node)}", field=where, value=node)
            inner = subs[0]
            return lambda o, s: not inner(o, s)
        if not subs:
            raise ConfigError(f"{where}: '{op}' needs at least 1 argument", field=where,
                              value=node)
        if op == "and":
            def all_of(o: Offer, s: VirtualState) -> bool:
                for f in subs:  # noqa: SIM110 - a plain loop is faster than all(genexpr)
                    if not f(o, s):
                        return False
                return True
            return all_of

        def any_of(o: Offer, s: VirtualState) -> bool:
            for f in subs:  # noqa: SIM110
                if f(o, s):
                    return True
            return False
        return any_of
    if isinstance(node, str) and node.startswith("$"):
        return _variable(node[1:], where)
    if isinstance(node, dict):
        raise ConfigError(f"{where}: {_show(node)} is an object; arguments are numbers, "
                          "text, true/false, null, $variables or [operator, ...] lists",
                          field=where, value=node)
    if isinstance(node, bool | int | float | str) or node is None:
        return lambda o, s, v=node: v
    raise ConfigError(f"{where}: {_show(node)} is not a valid argument", field=where)
