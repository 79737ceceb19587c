"""Credential-injection rules: "requests of these users to this host/path get this header".

A rule's value is a secret.  It is shown by nothing but the proxy's outbound request: not by
``repr``, ``str``, ``to_public()``, logs or error messages, so a rule can be printed, logged
or returned by an API without leaking it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EVERYONE", "Rule", "RuleSet", "normalize_host", "normalize_path"]

EVERYONE = "*"

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# a rule's reference: its namespace and id (``admin/ID``, ``user/NAME/ID``, the user's name
# percent-encoded: hub/egress_rules.py), or a plain id (a rules file of the proxy's own)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:%/-]{0,500}$")
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# headers the proxy owns: framing, routing and its own authentication
_REFUSED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
            "trailer", "upgrade"}
_FIELDS = {"id", "host", "port", "path_prefix", "header", "value", "users", "groups", "owner"}


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets: the form rules and requests compare in."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def normalize_path(path: str) -> tuple[str, bool]:
    """The path a server will see (query dropped, dot segments removed), and whether it is
    ambiguous (an encoded slash or dot segment).  Ambiguous paths match only ``/`` rules, so
    ``/public/..%2Fprivate`` cannot carry the credential of a ``/public`` rule elsewhere."""
    path = path.split("?", 1)[0].split("#", 1)[0] or "/"
    lowered = path.lower()
    ambiguous = "%2f" in lowered or "%5c" in lowered or "\\" in path
    decoded = re.sub("%2e", ".", path, flags=re.IGNORECASE)
    segments: list[str] = []
    parts = decoded.split("/")
    for i, seg in enumerate(parts):
        if seg == ".":
            ambiguous = True
            if i == len(parts) - 1:
                segments.append("")
        elif seg == "..":
            ambiguous = True
            if len(segments) > 1:
                segments.pop()
            if i == len(parts) - 1:
                segments.append("")
        else:
            segments.append(seg)
    out = "/".join(segments)
    if not out.startswith("/"):
        out = "/" + out
    return out, ambiguous


def _names(value: Any, field_name: str, rule_id: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"rule {rule_id!r}: field {field_name!r} must be a list of names, "
                         f"got {type(value).__name__}")
    out = []
    for v in value:
        if not isinstance(v, str) or not v:
            raise ValueError(f"rule {rule_id!r}: field {field_name!r} has {v!r}; "
                             "names are non-empty strings ('*' for everyone)")
        out.append(v)
    return tuple(out)


def _check_host(host: Any, rule_id: str) -> str:
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"rule {rule_id!r}: field 'host' is {host!r}; expected a host name "
                         "('api.example.org'), a wildcard ('*.example.org') or an IP address")
    h = normalize_host(host)
    try:
        ipaddress.ip_address(h)
        return h
    except ValueError:
        pass
    name = h[2:] if h.startswith("*.") else h
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels) or (h.startswith("*.")
                                                            and len(labels) < 2):
        raise ValueError(f"rule {rule_id!r}: field 'host' is {host!r}; expected a host name "
                         "('api.example.org'), a wildcard over at least two labels "
                         "('*.example.org') or an IP address")
    return h


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Inject ``header: value`` into requests of allowed users to ``host[:port]/path_prefix``.

    ``users``/``groups`` empty means the owner only; ``"*"`` in either means everyone,
    anonymous sessions included (the point: a project owner may let anonymous sessions read
    restricted data without handing them the secret).
    """

    id: str
    host: str
    header: str
    value: str = field(repr=False)
    port: int | None = None
    path_prefix: str = "/"
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    owner: str | None = None

    def __post_init__(self) -> None:
        rid = self.id
        if not isinstance(rid, str) or not _ID.match(rid):
            raise ValueError(f"rule field 'id' is {rid!r}; expected letters, digits, '_', "
                             "'.', ':', '-' (and '/' between a namespace and an id)")
        object.__setattr__(self, "host", _check_host(self.host, rid))
        if self.port is not None and (isinstance(self.port, bool)
                                      or not isinstance(self.port, int)
                                      or not 0 < self.port < 65536):
            raise ValueError(f"rule {rid!r}: field 'port' is {self.port!r}; expected an "
                             "integer 1-65535 or null (any port)")
        if not isinstance(self.path_prefix, str) or not self.path_prefix.startswith("/"):
            raise ValueError(f"rule {rid!r}: field 'path_prefix' is {self.path_prefix!r}; "
                             "expected a path starting with '/'")
        prefix, ambiguous = normalize_path(self.path_prefix)
        if ambiguous or "?" in self.path_prefix:
            raise ValueError(f"rule {rid!r}: field 'path_prefix' is {self.path_prefix!r}; "
                             "dot segments, encoded slashes and queries are not allowed")
        object.__setattr__(self, "path_prefix", prefix)
        h = self.header
        if not isinstance(h, str) or not _TOKEN.match(h):
            raise ValueError(f"rule {rid!r}: field 'header' is {h!r}; expected an HTTP "
                             "header name (RFC 7230 token: letters, digits and !#$%&'*+-.^_`|~)")
        if h.lower() in _REFUSED or h.lower().startswith("proxy-"):
            raise ValueError(f"rule {rid!r}: field 'header' is {h!r}; the proxy owns that "
                             "header (Host, Content-Length, Transfer-Encoding, Connection, "
                             "hop-by-hop and Proxy-* headers cannot be injected)")
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"rule {rid!r}: field 'value' must be a non-empty string "
                             "(the value is not shown)")
        if any(c in self.value for c in "\r\n\0") or not self.value.isprintable():
            raise ValueError(f"rule {rid!r}: field 'value' contains a line break or control "
                             "character (the value is not shown)")
        try:
            self.value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"rule {rid!r}: field 'value' has characters outside "
                             "ISO-8859-1 (the value is not shown)") from None
        object.__setattr__(self, "users", _names(self.users, "users", rid))
        object.__setattr__(self, "groups", _names(self.groups, "groups", rid))
        if self.owner is not None and (not isinstance(self.owner, str) or not self.owner):
            raise ValueError(f"rule {rid!r}: field 'owner' is {self.owner!r}; expected a "
                             "user name or null")

    def __repr__(self) -> str:
        where = f"{self.host}{'' if self.port is None else f':{self.port}'}{self.path_prefix}"
        return (f"Rule(id={self.id!r}, {where!r}, header={self.header!r}, value=<hidden>, "
                f"users={list(self.users)!r}, groups={list(self.groups)!r}, "
                f"owner={self.owner!r})")

    __str__ = __repr__

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        """A rule from its JSON form; unknown fields are refused so typos do not pass."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a rule must be an object, got {type(data).__name__}")
        rid = data.get("id", "?")
        unknown = set(data) - _FIELDS
        if unknown:
            raise ValueError(f"rule {rid!r}: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{sorted(_FIELDS)}")
        missing = [k for k in ("id", "host", "header", "value") if k not in data]
        if missing:
            raise ValueError(f"rule {rid!r}: missing field(s) {missing}")
        return cls(id=data["id"], host=data["host"], header=data["header"],
                   value=data["value"], port=data.get("port"),
                   path_prefix=data.get("path_prefix", "/"),
                   users=data.get("users") or (), groups=data.get("groups") or (),
                   owner=data.get("owner"))

    def to_public(self) -> dict[str, Any]:
        """Everything but the value: safe to show in APIs and logs."""
        return {"id": self.id, "host": self.host, "port": self.port,
                "path_prefix": self.path_prefix, "header": self.header,
                "users": list(self.users), "groups": list(self.groups), "owner": self.owner}

    def to_config(self) -> dict[str, Any]:
        """The full form, value included: only for the pipe to the proxy process."""
        return {**self.to_public(), "value": self.value}

    def allows(self, user: str | None, groups: Iterable[str] = ()) -> bool:
        """``user`` None is an anonymous session: only ``"*"`` rules apply to it."""
        if EVERYONE in self.users or EVERYONE in self.groups:
            return True
        if user is None:
            return False
        if user == self.owner or user in self.users:
            return True
        return bool(set(groups) & set(self.groups))

    def matches_host(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        host = normalize_host(host)
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def matches_path(self, path: str, ambiguous: bool = False) -> bool:
        """Prefixes match whole segments: ``/api`` covers ``/api`` and ``/api/x``, not
        ``/apix``; a prefix ending in ``/`` covers what starts with it."""
        p = self.path_prefix
        if p == "/":
            return True
        if ambiguous:
            return False
        if p.endswith("/"):
            return path.startswith(p)
        return path == p or path.startswith(p + "/")


class RuleSet:
    """An immutable set of rules; a new config builds a new set (swapped atomically)."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        seen: set[str] = set()
        for r in self.rules:
            if r.id in seen:
                raise ValueError(f"rules: id {r.id!r} is used twice; rule ids must be unique")
            seen.add(r.id)

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"RuleSet({[r.id for r in self.rules]!r})"

    @classmethod
    def from_config(cls, items: Sequence[Mapping[str, Any] | Rule]) -> RuleSet:
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise ValueError("'rules' must be a list of rule objects")
        return cls(r if isinstance(r, Rule) else Rule.from_dict(r) for r in items)

    def for_host(self, user: str | None, groups: Iterable[str], host: str,
                 port: int) -> list[Rule]:
        """Rules that may apply to some path of ``host:port`` for this user: decides whether
        a CONNECT is intercepted (any) or tunnelled untouched (none)."""
        groups = tuple(groups)
        return [r for r in self.rules if r.matches_host(host, port) and r.allows(user, groups)]

    def match(self, user: str | None, groups: Iterable[str], host: str, port: int,
              path: str) -> list[Rule]:
        """Rules to apply to one request, one per header name: the longest path prefix wins,
        then the earlier rule."""
        norm, ambiguous = normalize_path(path)
        found = [r for r in self.for_host(user, groups, host, port)
                 if r.matches_path(norm, ambiguous)]
        found.sort(key=lambda r: -len(r.path_prefix))
        chosen: dict[str, Rule] = {}
        for r in found:
            chosen.setdefault(r.header.lower(), r)
        return list(chosen.values())
