"""Credential-injection rules: "requests of these users to this host/path get this header".

A rule's value is a secret.  It is shown by nothing but the proxy's outbound request: not by
``repr``, ``str``, ``to_public()``, logs or error messages, so a rule can be printed, logged
or returned by an API without leaking it.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EVERYONE", "Decision", "PathReading", "Rule", "RuleSet", "normalize_host",
           "read_path"]

EVERYONE = "*"

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# a rule's reference: its namespace and id (``admin/ID``, ``user/NAME/ID``, the user's name
# percent-encoded: hub/egress_consent.py), or a plain id (a rules file of the proxy's own)
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


# How servers read the bytes of a request path differently from a plain RFC 3986 reading.
# Each is a way a path our matcher reads as inside a rule's prefix could be served from
# outside it (the sources are in docs/hub-egress.md, "Path rules: the readings considered"):
#   dot segments, literal or encoded (%2e, %2E): RFC 3986 5.2.4; CVE-2021-41773 (Apache
#       httpd 2.4.49, ".%2e/"); nginx decodes before it resolves them;
#   double encoding (%25xx) and malformed escapes: CVE-2021-42013 (Apache 2.4.50,
#       "%%32%65"), CVE-2001-0333 (IIS decodes twice);
#   encoded slash and backslash (%2f, %5c) and literal backslash: Tomcat's
#       ALLOW_ENCODED_SLASH / ALLOW_BACKSLASH, Apache's AllowEncodedSlashes, IIS and every
#       Windows file system (CVE-2007-0450: Tomcat's "\", "%2F", "%5C");
#   path parameters (";"): the Servlet spec's path parameters, stripped by Tomcat and Jetty
#       before mapping ("/api/..;/admin" is "/admin": CVE-2020-1957 and Orange Tsai,
#       "Breaking Parser Logic", Black Hat USA 2018);
#   overlong or invalid UTF-8 and %u escapes: CVE-2008-2938 (Tomcat), CVE-2000-0884 (IIS
#       "%c0%af"), IIS's %uXXXX; compatibility forms (U+FF0E, U+FF0F) that NFKC turns into
#       "." and "/" (frameworks that normalize Unicode);
#   segments of dots and spaces ("...", ".. "): Windows drops trailing dots and spaces;
#   a "#" in the request target: not part of it (RFC 9112 3.2); some servers keep it in
#       the path (nginx), others cut there;
#   NUL and other control bytes, encoded: C string ends (truncation).
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_OVERLONG = re.compile(r"%(?:c[01]|e0%[89][0-9a-f]|f0%8[0-9a-f])", re.IGNORECASE)
_PREFIX = re.compile(r"^/[A-Za-z0-9\-._~!$&'()*+,=:@/]*$")
_CONTROL_ESCAPE = re.compile(r"%(?:[01][0-9a-f]|7f)", re.IGNORECASE)
_DOUBLE_ESCAPE = re.compile(r"%25", re.IGNORECASE)


def _decode(text: str) -> str:
    """One round of percent-decoding, the bytes read as UTF-8 (latin-1 where that fails)."""
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                 text.encode("utf-8", "surrogateescape"))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _dot_like(segment: str) -> bool:
    # ".", "..", and what Windows makes of "...", ".. " and friends
    return "." in segment and not segment.strip(". ")


def _resolve(path: str) -> str:
    """RFC 3986 5.2.4 on a path (dot-like segments count as dots)."""
    segments: list[str] = []
    parts = path.split("/")
    for i, seg in enumerate(parts):
        if _dot_like(seg):
            if seg.strip() == ".." and len(segments) > 1:
                segments.pop()
            if i == len(parts) - 1:
                segments.append("")
        else:
            segments.append(seg)
    out = "/".join(segments)
    return out if out.startswith("/") else "/" + out


@dataclass(frozen=True)
class PathReading:
    """A request path as servers may read it: ``path`` (what an RFC 3986 server serves),
    ``why`` another server family could serve other bytes (None: no reading we know
    differs) and ``readings``, the paths those servers could serve."""

    path: str
    why: str | None
    readings: tuple[str, ...]


def read_path(path: str) -> PathReading:
    # with a "#", one server cuts the path there and another keeps it: both are readings
    target = path.split("?", 1)[0] or "/"
    cut = target.split("#", 1)[0] or "/"
    why: str | None = None
    if "#" in path:
        why = "a '#' in the request target"
    elif _BAD_ESCAPE.search(target):
        why = "a malformed percent escape (or an IIS %u escape)"
    elif _OVERLONG.search(target):
        why = "an overlong UTF-8 escape"
    elif _CONTROL_ESCAPE.search(target):
        why = "an encoded control character"
    elif _DOUBLE_ESCAPE.search(target):
        why = "a double-encoded escape (%25)"
    once = _decode(target)
    twice = _decode(once)
    variants: list[tuple[str, str]] = []
    for reading in dict.fromkeys((cut, target, once, twice)):
        flat = reading.replace("\\", "/")
        no_params = "/".join(seg.split(";", 1)[0] for seg in flat.split("/"))
        variants += [(reading, "a dot segment (literal or percent-encoded)"),
                     (flat, "a backslash (literal or %5c) next to a dot segment"),
                     (no_params, "a dot segment behind a path parameter (';')"),
                     (unicodedata.normalize("NFKC", no_params),
                      "a dot or slash in Unicode compatibility form")]
    if why is None:
        why = next((cause for v, cause in variants
                    if any(_dot_like(seg) for seg in v.split("/"))), None)
    readings = tuple(dict.fromkeys(_resolve(v) for v, _ in variants))
    return PathReading(_resolve(cut), why, readings)


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
        if not _PREFIX.match(self.path_prefix) or read_path(self.path_prefix).why or \
                "//" in self.path_prefix:
            raise ValueError(f"rule {rid!r}: field 'path_prefix' is {self.path_prefix!r}; "
                             "expected a plain path: '/' then letters, digits and "
                             "-._~!$&'()*+,=:@/ (no dot segments, '//', '%' escapes, ';', "
                             "'\\', '?' or '#': servers read those differently)")
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

    def matches_path(self, path: str) -> bool:
        """Prefixes match whole segments: ``/api`` covers ``/api`` and ``/api/x``, not
        ``/apix``; a prefix ending in ``/`` covers what starts with it; byte for byte
        (case counts)."""
        p = self.path_prefix
        if p == "/":
            return True
        if p.endswith("/"):
            return path.startswith(p)
        return path == p or path.startswith(p + "/")


@dataclass(frozen=True)
class Decision:
    """What a request gets: ``rules`` to apply, or ``refused_by`` (rules some server's
    reading of the path falls under while another's does not) with ``why``."""

    rules: tuple[Rule, ...] = ()
    refused_by: tuple[Rule, ...] = ()
    why: str | None = None

    def refusal(self) -> str:
        ids = ", ".join(r.id for r in self.refused_by)
        return (f"the path has {self.why}: servers read it differently, so rule(s) {ids} "
                "(which cover only part of this host) cannot be applied; send the path "
                "without it")


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

    def decide(self, user: str | None, groups: Iterable[str], host: str, port: int,
               path: str) -> Decision:
        """Rules to apply to one request, one per header name: the longest path prefix
        wins, then the earlier rule.  A path that some server family could serve from
        elsewhere gets only rules for the whole host (``/``); if a narrower rule covers any
        reading of it, the request is refused rather than sent without its credential."""
        reading = read_path(path)
        candidates = self.for_host(user, groups, host, port)
        if reading.why is not None:
            narrow = tuple(r for r in candidates if r.path_prefix != "/" and any(
                r.matches_path(p) for p in reading.readings))
            if narrow:
                return Decision(refused_by=narrow, why=reading.why)
            found = [r for r in candidates if r.path_prefix == "/"]
        else:
            found = [r for r in candidates if r.matches_path(reading.path)]
        found.sort(key=lambda r: -len(r.path_prefix))
        chosen: dict[str, Rule] = {}
        for r in found:
            chosen.setdefault(r.header.lower(), r)
        return Decision(rules=tuple(chosen.values()))

    def match(self, user: str | None, groups: Iterable[str], host: str, port: int,
              path: str) -> list[Rule]:
        """The rules of ``decide`` (none for a refused request)."""
        return list(self.decide(user, groups, host, port, path).rules)
