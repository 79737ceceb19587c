"""The egress proxy's configuration: who may use it (clients), what it adds (rules), where it
never connects (deny networks) and the bounds that keep one client from starving the others.
The proxy itself is mitmproxy with our add-on (``addon.py``, started by ``mitm.py``).

Sessions use it as ``HTTP(S)_PROXY``.  Plain HTTP requests are forwarded with the headers of
matching rules.  ``CONNECT`` to a host without a rule for the user is a blind TCP tunnel (the
session sees the real certificate); ``CONNECT`` to a host with a rule is intercepted: the
session gets a leaf certificate of the deployment CA, each request inside is read, given its
rule headers per path and sent on over a fresh TLS connection that verifies the real upstream.

A rule never replaces a header the client sent: when the request already carries the rule's
header, the client's value goes out, the rule is not applied, and the response says so in
``X-CloudTik-Egress: not-applied rule=ID reason=client-sent-header`` (and the log line in
``not-applied=ID(client-sent-header)``).  Which users a rule reaches is decided before the
proxy sees it (consent between users: ``hub/egress_consent.py``).

Secrets (rule values, client tokens) appear in nothing but outbound request heads: not in
logs, not in error responses, not in exceptions.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .rules import RuleSet

__all__ = ["DEFAULT_DENY_NETWORKS", "EGRESS_HEADER", "Client", "Identity", "Limits",
           "ProxyConfig"]

log = logging.getLogger("jupyter_cloudtik.egress")

# the hub host's own loopback and the cloud metadata service are not the sessions' business:
# loopback and "this host" (0.0.0.0, ::, which reach the host's own services), link-local
# (169.254.169.254 and friends), IPv4-compatible and IPv4-mapped forms of them, NAT64 and
# 6to4 forms of loopback and link-local, and the metadata addresses outside those ranges
DEFAULT_DENY_NETWORKS = ("127.0.0.0/8", "::1/128", "::/96", "169.254.0.0/16", "fe80::/10",
                         "0.0.0.0/8", "::ffff:127.0.0.0/104", "::ffff:0.0.0.0/104",
                         "64:ff9b::7f00:0/104", "64:ff9b::a9fe:0/112", "2002:7f00::/24",
                         "2002:a9fe::/32", "2002::/24", "fd00:ec2::254/128",
                         "100.100.100.200/32")

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# on each response: which rules acted on the request ("applied rule=ID") and which were
# not applied because the client sent the header itself
# ("not-applied rule=ID reason=client-sent-header"); never a value
EGRESS_HEADER = "X-CloudTik-Egress"


@dataclass(frozen=True)
class Client:
    """A session's proxy credentials: ``Proxy-Authorization: Basic base64(user:token)``."""

    user: str
    token: str = field(repr=False)
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Identity:
    """Who a connection acts for; ``user`` None is an anonymous session."""

    user: str | None
    groups: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.user if self.user is not None else "anonymous"


@dataclass(frozen=True)
class Limits:
    """Bounds that keep one misbehaving client from slowing the others: time limits, and
    per-client shares of what is scarce (name look-ups, TLS set-ups, requests in flight,
    connections).  A client over its share waits for its own turn; the others do not."""

    max_header_bytes: int = 65536
    max_headers: int = 100
    connect_timeout: float = 10.0
    response_timeout: float = 60.0   # for the upstream's response head
    idle_timeout: float = 120.0      # no byte in either direction of a request/response
    tunnel_idle_timeout: float = 600.0
    handshake_timeout: float = 10.0
    # per client (one authenticated user; the peer address before it authenticated or when
    # it is anonymous): what one client may hold of what all share
    client_connections: int = 256    # open connections; more are answered 429 and closed
    client_requests: int = 16        # not enforced (kept for the CLI): an HTTP/1 connection
                                     # carries one request at a time, client_connections
                                     # bounds those; HTTP/2 streams inside an interception
                                     # are mitmproxy's (its own stream limits)
    client_lookups: int = 4          # name look-ups at once; more wait their turn
    client_handshakes: int = 4       # TLS set-ups (intercepted CONNECTs) at once
    lookup_timeout: float = 5.0      # one look-up (waiting for a slot included): then 504
    lookup_threads: int = 64         # the resolver's threads, shared by all clients
    lookup_cache_seconds: float = 5.0  # successful look-ups are reused this long
    min_body_rate: float = 1024.0    # bytes/s a request body must average after body_grace
    body_grace: float = 10.0         # seconds before min_body_rate applies
    client_loop_share: float = 0.5   # share of the proxy's loop one client may take while
                                     # other clients are active (its reads wait otherwise)
    # before a connection authenticates it is nobody's: on a single-host hub every user
    # server connects from 127.0.0.1, so a per-peer budget would be one budget for all users.
    # Pre-auth connections are counted per peer against this cap, far above what honest
    # clients need (they authenticate with their first request, within milliseconds); over
    # it, that peer's oldest pre-auth connection is closed (a new, honest one gets in).
    # Once authenticated a connection counts for its user only.
    preauth_connections: int = 1024
    client_forget_seconds: float = 60.0  # a client holding nothing, idle this long, is forgotten
    # each authenticated user is served by a process of its own (front.py), so one user's
    # load is the operating system's to share out, not our event loop's; at most this many
    # such processes (about 70 MB each), then users share them (least users first)
    workers: int = 16

    def __post_init__(self) -> None:
        for name in ("client_connections", "client_lookups", "client_handshakes",
                     "lookup_threads", "max_headers", "max_header_bytes",
                     "preauth_connections", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"egress limit {name} is {v!r}; expected an integer >= 1")
        for name in ("lookup_timeout", "connect_timeout", "handshake_timeout", "body_grace",
                     "client_forget_seconds"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"egress limit {name} is {v!r}; expected seconds > 0")
        if self.min_body_rate < 0:
            raise ValueError(f"egress limit min_body_rate is {self.min_body_rate!r}; "
                             "expected bytes/s >= 0 (0: no minimum)")
        if not 0 < self.client_loop_share <= 1:
            raise ValueError(f"egress limit client_loop_share is {self.client_loop_share!r};"
                             " expected a share in (0, 1]")


@dataclass(frozen=True)
class ProxyConfig:
    """One complete configuration; a new one replaces the old atomically."""

    clients: tuple[Client, ...] = ()
    rules: RuleSet = field(default_factory=RuleSet)
    allow_anonymous: bool = False
    deny_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
        ipaddress.ip_network(n) for n in DEFAULT_DENY_NETWORKS)

    def __repr__(self) -> str:
        return (f"ProxyConfig(clients={[c.user for c in self.clients]!r}, rules={self.rules!r}, "
                f"allow_anonymous={self.allow_anonymous})")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProxyConfig:
        """Validate a config line; errors name the field and never show a secret."""
        if not isinstance(data, Mapping):
            raise ValueError(f"config must be a JSON object, got {type(data).__name__}")
        allowed = {"clients", "rules", "allow_anonymous", "deny_networks", "seq"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"config: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{sorted(allowed)}")
        raw_clients = data.get("clients") or []
        if not isinstance(raw_clients, list):
            raise ValueError("config: 'clients' must be a list of "
                             "{'token', 'user', 'groups'} objects")
        clients = []
        for i, c in enumerate(raw_clients):
            if isinstance(c, Client):
                clients.append(c)
                continue
            if not isinstance(c, Mapping):
                raise ValueError(f"config: clients[{i}] must be an object")
            user, token, groups = c.get("user"), c.get("token"), c.get("groups") or []
            if not isinstance(user, str) or not user or ":" in user:
                raise ValueError(f"config: clients[{i}].user is {user!r}; expected a "
                                 "non-empty name without ':'")
            if not isinstance(token, str) or len(token) < 8:
                raise ValueError(f"config: clients[{i}].token (user {user!r}) must be a "
                                 "string of at least 8 characters (the value is not shown)")
            if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
                raise ValueError(f"config: clients[{i}].groups (user {user!r}) must be a "
                                 "list of group names")
            clients.append(Client(user=user, token=token, groups=tuple(groups)))
        anon = data.get("allow_anonymous", False)
        if not isinstance(anon, bool):
            raise ValueError(f"config: 'allow_anonymous' is {anon!r}; expected true or false")
        nets = data.get("deny_networks")
        if nets is None:
            deny = cls.deny_networks
        else:
            if not isinstance(nets, list):
                raise ValueError("config: 'deny_networks' must be a list of CIDRs")
            try:
                deny = tuple(ipaddress.ip_network(n, strict=False) for n in nets)
            except (ValueError, TypeError) as e:
                raise ValueError(f"config: 'deny_networks' has a bad network: {e}") from None
        return cls(clients=tuple(clients), rules=RuleSet.from_config(data.get("rules") or []),
                   allow_anonymous=anon, deny_networks=deny)

    def identify(self, user: str | None, token: str | None) -> Identity | None:
        """The client for these credentials, comparing every token in constant time."""
        if token is None:
            return Identity(None) if self.allow_anonymous else None
        found = None
        for c in self.clients:
            same_token = hmac.compare_digest(c.token.encode(), token.encode())
            same_user = hmac.compare_digest(c.user.encode(), (user or "").encode())
            if same_token and same_user:
                found = c
        return Identity(found.user, found.groups, token) if found else None

    def authenticate(self, header: str | None) -> Identity | None:
        if not header:
            return self.identify(None, None)
        scheme, _, cred = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, token = base64.b64decode(cred.strip(), validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return self.identify(user, token) if sep else None

    def claimed(self, head: bytes) -> Identity | None:
        """The client whose valid credentials the start of a request head carries: exactly
        one whole ``Proxy-Authorization`` line, checked as a request's own is; else None.
        Used where a connection is placed before its request is parsed (the front's
        choice of worker, the loop's first turn); the request is authenticated again."""
        low = head[:8192].lower()
        at = low.find(b"\r\nproxy-authorization:")
        if at < 0 or low.find(b"\r\nproxy-authorization:", at + 1) >= 0:
            return None
        start = at + len(b"\r\nproxy-authorization:")
        end = low.find(b"\r\n", start)
        if end < 0:
            return None
        return self.authenticate(head[start:end].decode("latin-1"))

    def denied(self, ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            mapped = addr.ipv4_mapped
            return any(addr in n or mapped in n for n in self.deny_networks)
        return any(addr in n for n in self.deny_networks)
