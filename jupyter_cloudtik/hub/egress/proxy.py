"""The egress proxy: an HTTP/1.1 forward proxy that adds credentials to outbound requests.

Sessions use it as ``HTTP(S)_PROXY``.  Plain HTTP requests are forwarded with the headers of
matching rules.  ``CONNECT`` to a host without a rule for the user is a blind TCP tunnel (the
session sees the real certificate); ``CONNECT`` to a host with a rule is intercepted: the
session gets a leaf certificate of the deployment CA, each request inside is read, given its
rule headers per path and sent on over a fresh TLS connection that verifies the real upstream.

A rule never replaces a header the client sent: when the request already carries the rule's
header, the client's value goes out, the rule is not applied, and the response says so in
``X-CloudTik-Egress: not-applied rule=ID reason=client-sent-header`` (and the log line in
``not-applied=ID(client-sent-header)``).  Which users a rule reaches is decided before the
proxy sees it (consent between users: ``hub/egress_rules.py``).

Secrets (rule values, client tokens) appear in nothing but outbound request heads: not in
logs, not in error responses, not in exceptions.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import logging
import re
import socket
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from .ca import DeploymentCA
from .rules import Rule, RuleSet, normalize_host

__all__ = ["DEFAULT_DENY_NETWORKS", "EGRESS_HEADER", "Client", "EgressProxy", "Identity", "Limits",
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
_USERINFO = re.compile(r"://[^/]*@")
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]{0,252})$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
               "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
_NO_BODY_STATUS = {204, 304}
# on each response: which rules acted on the request ("applied rule=ID") and which were
# not applied because the client sent the header itself
# ("not-applied rule=ID reason=client-sent-header"); never a value
EGRESS_HEADER = "X-CloudTik-Egress"
_CHUNK = 65536


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
    """Bounds that keep one misbehaving session from exhausting the proxy."""

    max_connections: int = 512
    max_header_bytes: int = 65536
    max_headers: int = 100
    connect_timeout: float = 10.0
    response_timeout: float = 60.0   # for the upstream's response head
    idle_timeout: float = 120.0      # no byte in either direction of a request/response
    tunnel_idle_timeout: float = 600.0
    handshake_timeout: float = 10.0


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

    def denied(self, ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            mapped = addr.ipv4_mapped
            return any(addr in n or mapped in n for n in self.deny_networks)
        return any(addr in n for n in self.deny_networks)


class HTTPError(Exception):
    """An error we answer with ``status`` and ``text`` (our own words: never a secret)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status} {text}")
        self.status = status
        self.text = text


class _ClientGone(Exception):
    pass


class _Headers:
    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self.items = list(items)

    def get_all(self, name: str) -> list[str]:
        n = name.lower()
        return [v for k, v in self.items if k.lower() == n]

    def get(self, name: str) -> str | None:
        values = self.get_all(name)
        return values[0] if values else None

    def tokens(self, name: str) -> set[str]:
        return {t.strip().lower() for v in self.get_all(name) for t in v.split(",") if t.strip()}

    def without(self, names: Iterable[str]) -> _Headers:
        drop = {n.lower() for n in names}
        return _Headers((k, v) for k, v in self.items if k.lower() not in drop)

    def encode(self) -> bytes:
        return "".join(f"{k}: {v}\r\n" for k, v in self.items).encode("latin-1")


@dataclass
class _Message:
    start: tuple[str, str, str]
    headers: _Headers


def _parse_head(data: bytes, limits: Limits, *, request: bool) -> _Message:
    bad = 400 if request else 502
    what = "request" if request else "upstream response"
    text = data.decode("latin-1")
    lines = text[:-4].split("\r\n")
    while lines and lines[0] == "" and request:
        lines.pop(0)  # RFC 9112 2.2: ignore empty lines before a request line
    if not lines:
        raise HTTPError(bad, f"empty {what} head")
    start = lines[0].split(" ", 2)
    if len(start) != 3 or "\n" in lines[0]:
        raise HTTPError(bad, f"malformed {what} line")
    if len(lines) - 1 > limits.max_headers:
        raise HTTPError(431 if request else 502, f"{what} has more than "
                        f"{limits.max_headers} header fields")
    items = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name) or "\n" in line or "\r" in line or "\0" in line:
            raise HTTPError(bad, f"malformed header field in {what}")
        items.append((name, value.strip(" \t")))
    return _Message((start[0], start[1], start[2]), _Headers(items))


def _body_framing(headers: _Headers, *, request: bool) -> int | str:
    """Content-Length as an int, "chunked", or "close" (read until EOF, responses only)."""
    te = headers.tokens("transfer-encoding")
    cl = headers.get_all("content-length")
    if te:
        if cl:
            # RFC 9112 6.3: a smuggling vector; refuse rather than guess
            raise HTTPError(400 if request else 502, "both Transfer-Encoding and "
                            "Content-Length in one message")
        codings = [t.strip().lower() for v in headers.get_all("transfer-encoding")
                   for t in v.split(",") if t.strip()]
        if codings[-1] != "chunked":
            if request:
                raise HTTPError(400, "request Transfer-Encoding must end with chunked")
            return "close"
        if codings != ["chunked"]:
            raise HTTPError(400 if request else 502, "only Transfer-Encoding: chunked is "
                            "supported")
        return "chunked"
    if cl:
        values = {v.strip() for c in cl for v in c.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise HTTPError(400 if request else 502, "invalid Content-Length")
        return int(next(iter(values)))
    return 0 if request else "close"


def _parse_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` → (normalized host, port), refusing anything that is not a host."""
    a = authority.strip()
    if a.startswith("["):
        end = a.find("]")
        host, rest = a[1:end], a[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            raise HTTPError(400, "malformed IPv6 authority")
        port_s = rest[1:] if rest else ""
    else:
        host, _, port_s = a.partition(":")
    host = normalize_host(host)
    if port_s:
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise HTTPError(400, "invalid port in request target")
        port = int(port_s)
    elif default_port is None:
        raise HTTPError(400, "CONNECT needs host:port")
    else:
        port = default_port
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.match(host) or ".." in host:
            raise HTTPError(400, "invalid host in request target") from None
    return host, port


def _same_origin(host_header: str, host: str, port: int) -> bool:
    """The Host names the connected host; a port, if given, must be the connected port."""
    try:
        h, p = _parse_authority(host_header, port)
    except HTTPError:
        return False
    return h == host and p == port


def _host_header(host: str, port: int, default: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return h if port == default else f"{h}:{port}"


def _skipped_note(skipped: Sequence[Rule]) -> str:
    return " ".join(f"not-applied={r.id}(client-sent-header)" for r in skipped)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _error_bytes(status: int, text: str, extra: Sequence[tuple[str, str]] = ()) -> bytes:
    body = f"{status} {_reason(status)}: {text}\n".encode()
    head = (f"HTTP/1.1 {status} {_reason(status)}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in extra) + "\r\n")
    return head.encode("latin-1") + body


async def _start_tls(writer: asyncio.StreamWriter, ctx: ssl.SSLContext,
                     timeout: float) -> None:
    """Turn the accepted client connection into a TLS server connection."""
    if hasattr(writer, "start_tls"):  # Python 3.11+
        await writer.start_tls(ctx, ssl_handshake_timeout=timeout)
        return
    # Python 3.10: what 3.11's StreamWriter.start_tls does
    loop = asyncio.get_running_loop()
    protocol = writer._protocol  # type: ignore[attr-defined]
    await writer.drain()
    transport = await loop.start_tls(writer.transport, protocol, ctx, server_side=True,
                                     ssl_handshake_timeout=timeout)
    writer._transport = transport  # type: ignore[attr-defined]
    protocol._transport = transport
    protocol._over_ssl = True


class _Upstream:
    def __init__(self, key: tuple[str, int, bool], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.used = False

    def usable(self, key: tuple[str, int, bool]) -> bool:
        return (self.key == key and not self.writer.is_closing()
                and not self.reader.at_eof())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class EgressProxy:
    """The proxy server: ``await start()``, then ``set_config()`` whenever the rules change.

    Existing connections keep running across ``set_config``; each request is matched against
    the config current at the time it arrives.
    """

    def __init__(self, ca: DeploymentCA, *, host: str = "127.0.0.1", port: int = 0,
                 upstream_ca_bundle: str | None = None, limits: Limits | None = None) -> None:
        self.ca = ca
        self.host = host
        self.requested_port = port
        self.limits = limits or Limits()
        self.config = ProxyConfig()
        self.upstream_ssl = ssl.create_default_context(cafile=upstream_ca_bundle)
        self.upstream_ssl.set_alpn_protocols(["http/1.1"])
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()
        self.port: int | None = None

    def set_config(self, config: ProxyConfig) -> None:
        self.config = config  # one reference swap: requests see the old or the new, whole

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.requested_port,
            limit=self.limits.max_header_bytes, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._conns) >= self.limits.max_connections:
            with contextlib.suppress(Exception):
                writer.write(_error_bytes(503, "too many connections to the egress proxy"))
                await asyncio.wait_for(writer.drain(), 2)
            writer.close()
            return
        assert task is not None
        self._conns.add(task)
        conn = _Connection(self, reader, writer)
        try:
            await conn.run()
        except (asyncio.CancelledError, _ClientGone, ConnectionError, asyncio.TimeoutError,
                ssl.SSLError):
            pass
        except Exception as e:  # a bug must not take the server down; say what, not values
            log.error("connection failed: %s", type(e).__name__)
        finally:
            self._conns.discard(task)
            conn.close()


class _Connection:
    def __init__(self, proxy: EgressProxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.limits = proxy.limits
        self.reader = reader
        self.writer = writer
        self.upstream: _Upstream | None = None
        self.mode = "http"

    def close(self) -> None:
        if self.upstream:
            self.upstream.close()
        with contextlib.suppress(Exception):
            self.writer.close()

    # -- reading -------------------------------------------------------------------------
    async def _read_head(self, reader: asyncio.StreamReader, timeout: float, *,
                         request: bool) -> bytes | None:
        try:
            data = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.IncompleteReadError as e:
            if request and not e.partial.strip():
                return None
            raise HTTPError(400 if request else 502,
                            "connection closed in the middle of a message head"
                            if request or e.partial else
                            "upstream closed the connection without a response") from None
        except asyncio.LimitOverrunError:
            raise HTTPError(431 if request else 502, "message head larger than "
                            f"{self.limits.max_header_bytes} bytes") from None
        except asyncio.TimeoutError:
            if request:
                return None
            raise HTTPError(504, "upstream did not answer in "
                            f"{self.limits.response_timeout:g}s") from None
        return data

    async def _send(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), self.limits.idle_timeout)
        except (ConnectionError, asyncio.TimeoutError, RuntimeError) as e:
            raise _ClientGone() from e

    async def _fail(self, err: HTTPError, extra: Sequence[tuple[str, str]] = ()) -> None:
        with contextlib.suppress(_ClientGone):
            await self._send(_error_bytes(err.status, err.text, extra))

    # -- main loop -----------------------------------------------------------------------
    async def run(self) -> None:
        first = True
        while True:
            try:
                head = await self._read_head(
                    self.reader, self.limits.handshake_timeout if first
                    else self.limits.idle_timeout, request=True)
            except HTTPError as e:
                self._log(None, "-", "-", e.status, (), time.monotonic())
                await self._fail(e)
                return
            if head is None:
                return
            first = False
            started = time.monotonic()
            method, target = "-", "-"
            try:
                req = _parse_head(head, self.limits, request=True)
                method, target, version = req.start
                if not _TOKEN.match(method) or version not in ("HTTP/1.1", "HTTP/1.0"):
                    raise HTTPError(400, "malformed request line")
                config = self.proxy.config
                ident = config.authenticate(req.headers.get("proxy-authorization"))
                if ident is None:
                    self._log(None, method, target, 407, (), started)
                    await self._fail(HTTPError(407, "proxy credentials missing or invalid"),
                                     [("Proxy-Authenticate",
                                       'Basic realm="jupyter_cloudtik egress"')])
                    return
                if method == "CONNECT":
                    await self._connect(target, ident, started)
                    return
                if target.startswith("/") or target == "*":
                    raise HTTPError(400, "a proxy request needs an absolute URI "
                                    "(http://host/path)")
                scheme, sep, rest = target.partition("://")
                if not sep or scheme.lower() != "http":
                    raise HTTPError(400, "only http:// URIs are proxied directly; use "
                                    "CONNECT for https")
                cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0] or [len(rest)])
                authority, path = rest[:cut], rest[cut:] or "/"
                if path.startswith("?"):
                    path = "/" + path
                if "@" in authority:
                    raise HTTPError(400, "user info in the request URI is not supported")
                host, port = _parse_authority(authority, 80)
            except HTTPError as e:
                self._log(None, method[:20], target, e.status, (), started)
                await self._fail(e)
                return
            keep = await self._forward(req, ident, host, port, path, tls=False,
                                       started=started)
            if not keep:
                return

    async def _connect(self, target: str, ident: Identity, started: float) -> None:
        try:
            host, port = _parse_authority(target, None)
        except HTTPError as e:
            self._log(ident, "CONNECT", target, e.status, (), started)
            await self._fail(e)
            return
        config = self.proxy.config
        ruled = config.rules.for_host(ident.user, ident.groups, host, port)
        if not ruled:
            await self._tunnel(ident, host, port, started)
            return
        # interception: the session must trust the deployment CA; we verify the upstream
        self.mode = "mitm"
        ctx = self.proxy.ca.server_context(host)
        # the ClientHello follows our 200 at once: it must reach the TLS layer, not land in
        # the plain reader's buffer while we await the write (start_tls resumes reading)
        self.writer.transport.pause_reading()
        await self._send(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if getattr(self.reader, "_buffer", b""):
            log.info("user=%s CONNECT %s:%s mode=mitm client sent data before the CONNECT "
                     "response: closed", ident.name, host, port)
            return
        try:
            await _start_tls(self.writer, ctx, self.limits.handshake_timeout)
        except (ssl.SSLError, ConnectionError, asyncio.TimeoutError, OSError) as e:
            log.info("user=%s CONNECT %s:%s mode=mitm tls handshake with client failed (%s)",
                     ident.name, host, port, type(e).__name__)
            return
        while True:
            try:
                head = await self._read_head(self.reader, self.limits.idle_timeout,
                                             request=True)
            except HTTPError as e:
                self._log(ident, "-", f"https://{host}:{port}", e.status, (), time.monotonic())
                await self._fail(e)
                return
            if head is None:
                return
            started = time.monotonic()
            try:
                req = _parse_head(head, self.limits, request=True)
                method, path, version = req.start
                if not _TOKEN.match(method) or version not in ("HTTP/1.1", "HTTP/1.0"):
                    raise HTTPError(400, "malformed request line")
                if method == "CONNECT":
                    raise HTTPError(400, "CONNECT inside an intercepted tunnel")
                if path.lower().startswith("https://"):
                    rest = path[8:]
                    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0]
                              or [len(rest)])
                    if _parse_authority(rest[:cut], 443) != (host, port):
                        raise HTTPError(400, "request URI host differs from the CONNECT host")
                    path = rest[cut:] or "/"
                elif not path.startswith("/") and path != "*":
                    raise HTTPError(400, "malformed request target")
                # a different Host could reach another tenant of the same server with our
                # credential: the Host must be the host the session connected to
                hh = req.headers.get_all("host")
                if len(hh) > 1 or (hh and not _same_origin(hh[0], host, port)):
                    raise HTTPError(400, "Host header differs from the CONNECT host")
                current = self.proxy.config.identify(ident.user, ident.token) \
                    if ident.token is not None else self.proxy.config.identify(None, None)
                if current is None:
                    raise HTTPError(403, "proxy credentials no longer valid")
            except HTTPError as e:
                self._log(ident, "-", f"https://{host}:{port}", e.status, (), started)
                await self._fail(e)
                return
            keep = await self._forward(req, current, host, port, path, tls=True,
                                       started=started)
            if not keep:
                return

    # -- upstream ------------------------------------------------------------------------
    async def _open(self, host: str, port: int, tls: bool
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        config = self.proxy.config
        loop = asyncio.get_running_loop()
        timeout = self.limits.connect_timeout
        deadline = loop.time() + timeout
        try:
            ipaddress.ip_address(host)
            addrs = [host]
        except ValueError:
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
            except asyncio.TimeoutError:
                raise HTTPError(504, f"resolving {host} timed out") from None
            except OSError:
                raise HTTPError(502, f"cannot resolve {host}") from None
            addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
        # check the addresses we connect to, not the name: no DNS-rebinding detour
        allowed = [a for a in addrs if not config.denied(a)]
        if not allowed:
            raise HTTPError(403, f"{host}:{port} is in a network the egress proxy does "
                            "not reach")
        last: Exception | None = None
        for addr in allowed:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                return await asyncio.wait_for(asyncio.open_connection(
                    addr, port, ssl=self.proxy.upstream_ssl if tls else None,
                    server_hostname=host if tls else None,
                    ssl_handshake_timeout=timeout if tls else None,
                    limit=self.limits.max_header_bytes), left)
            except ssl.SSLCertVerificationError as e:
                raise HTTPError(502, f"upstream {host}:{port} presented a certificate that "
                                f"is not trusted ({e.verify_message})") from None
            except ssl.SSLError as e:
                raise HTTPError(502, f"TLS with upstream {host}:{port} failed "
                                f"({e.reason or type(e).__name__})") from None
            except (OSError, asyncio.TimeoutError) as e:
                last = e
        if isinstance(last, OSError):
            raise HTTPError(502, f"upstream {host}:{port} unreachable "
                            f"({last.strerror or type(last).__name__})")
        raise HTTPError(504, f"connecting to {host}:{port} timed out")

    async def _upstream(self, host: str, port: int, tls: bool) -> _Upstream:
        key = (host, port, tls)
        if self.upstream is not None and self.upstream.usable(key):
            self.upstream.used = True
            return self.upstream
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        r, w = await self._open(host, port, tls)
        self.upstream = _Upstream(key, r, w)
        return self.upstream

    # -- one request ---------------------------------------------------------------------
    async def _forward(self, req: _Message, ident: Identity, host: str, port: int,
                       path: str, *, tls: bool, started: float) -> bool:
        """Send one request upstream and its response back; True if the client connection
        stays open for another request."""
        method, _, version = req.start
        h = req.headers
        rules: list[Rule] = []
        skipped: list[Rule] = []
        upstream_failed = False
        sent_head = False
        try:
            framing = _body_framing(h, request=True)
            conn_tokens = h.tokens("connection") | h.tokens("proxy-connection")
            if version == "HTTP/1.1":
                client_keep = "close" not in conn_tokens
            else:
                client_keep = "keep-alive" in conn_tokens
            upgrade = h.get("upgrade") if "upgrade" in conn_tokens else None
            expect = h.tokens("expect")
            if expect - {"100-continue"}:
                raise HTTPError(417, "only Expect: 100-continue is supported")
            config = self.proxy.config
            matched = config.rules.match(ident.user, ident.groups, host, port, path)
            # a header the client sent is the client's: a rule never silently replaces
            # it (someone else's credential in place of the user's own); the rule is
            # not applied and the response says so
            rules = [r for r in matched if not h.get_all(r.header)]
            skipped = [r for r in matched if r not in rules]
            notes = [f"not-applied rule={r.id} reason=client-sent-header" for r in skipped]
            drop = (_HOP_BY_HOP | conn_tokens | {"host", "expect", "content-length"}
                    | {r.header.lower() for r in rules})
            default = 443 if tls else 80
            out = [("Host", _host_header(host, port, default)), *h.without(drop).items]
            out += [(r.header, r.value) for r in rules]
            if framing == "chunked":
                out.append(("Transfer-Encoding", "chunked"))
            elif isinstance(framing, int) and (framing > 0 or method in ("POST", "PUT",
                                                                          "PATCH")):
                out.append(("Content-Length", str(framing)))
            if upgrade:
                out += [("Connection", "Upgrade"), ("Upgrade", upgrade)]
            head = (f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
                    + _Headers(out).encode() + b"\r\n")
            if not isinstance(framing, int) or framing or not (
                    self.upstream and self.upstream.usable((host, port, tls))):
                attempts = 1
            else:
                attempts = 2  # a bodiless request on a reused connection: retry if stale
            for attempt in range(attempts):
                up = await self._upstream(host, port, tls)
                reused = up.used
                try:
                    up.writer.write(head)
                    if "100-continue" in expect:
                        await self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await self._relay_body(self.reader, up.writer, framing, to_upstream=True)
                    resp, rhead = await self._response_head(up, version)
                    break
                except HTTPError as e:
                    if (attempt + 1 < attempts and reused and e.status == 502):
                        up.close()
                        self.upstream = None
                        continue
                    raise
            status = int(resp.start[1])
            rh = resp.headers
            if method == "HEAD" or status in _NO_BODY_STATUS or 100 <= status < 200:
                rframing: int | str = 0
            else:
                rframing = _body_framing(rh, request=False)
            up_tokens = rh.tokens("connection")
            up_keep = (resp.start[0] == "HTTP/1.1" and "close" not in up_tokens
                       and rframing != "close")
            if status == 101 and upgrade:
                await self._send(rhead)
                sent_head = True
                self._log(ident, method, self._url(tls, host, port, path), status, rules,
                          started, note=_skipped_note(skipped))
                up = self.upstream
                self.upstream = None
                assert up is not None
                await self._pipe(self.reader, self.writer, up.reader, up.writer,
                                 self.limits.idle_timeout)
                up.close()
                return False
            dechunk = rframing == "chunked" and version != "HTTP/1.1"
            client_keep = client_keep and rframing != "close" and not dechunk
            rdrop = _HOP_BY_HOP | up_tokens | {EGRESS_HEADER.lower()}
            rout = rh.without(rdrop).items
            rout += [(EGRESS_HEADER, n) for n in notes]
            rout += [(EGRESS_HEADER, f"applied rule={r.id}") for r in rules]
            if rframing == "chunked" and not dechunk:
                rout.append(("Transfer-Encoding", "chunked"))
            if not client_keep:
                rout.append(("Connection", "close"))
            elif version == "HTTP/1.0":
                rout.append(("Connection", "keep-alive"))
            reason = resp.start[2]
            await self._send(f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")
                             + _Headers(rout).encode() + b"\r\n")
            sent_head = True
            upstream_failed = True  # from here a failure reading is the upstream's
            up = self.upstream
            assert up is not None
            await self._relay_body(up.reader, self.writer, rframing, to_upstream=False,
                                   dechunk=dechunk)
            upstream_failed = False
            if not up_keep:
                up.close()
                self.upstream = None
            self._log(ident, method, self._url(tls, host, port, path), status, rules, started,
                      note=_skipped_note(skipped))
            return client_keep
        except HTTPError as e:
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None
            self._log(ident, method, self._url(tls, host, port, path), e.status, rules,
                      started, note="" if not sent_head else "aborted")
            if not sent_head:
                await self._fail(e)
            return False
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                ssl.SSLError) as e:
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None
            status = 502 if upstream_failed or not sent_head else 0
            self._log(ident, method, self._url(tls, host, port, path), status, rules,
                      started, note=f"aborted ({type(e).__name__})")
            if not sent_head and not isinstance(e, _ClientGone):
                await self._fail(HTTPError(502, "connection to the upstream failed"))
            return False

    async def _response_head(self, up: _Upstream, client_version: str
                             ) -> tuple[_Message, bytes]:
        while True:
            try:
                data = await self._read_head(up.reader, self.limits.response_timeout,
                                             request=False)
            except (ConnectionError, ssl.SSLError):
                raise HTTPError(502, "upstream closed the connection") from None
            assert data is not None
            resp = _parse_head(data, self.limits, request=False)
            ver, code, _ = resp.start
            if not ver.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
                raise HTTPError(502, "malformed upstream status line")
            status = int(code)
            if 100 <= status < 200 and status != 101:
                if status != 100 and client_version == "HTTP/1.1":
                    await self._send(data)  # 103 Early Hints and friends
                continue  # our own 100 Continue already went out
            return resp, data

    async def _relay_body(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                          framing: int | str, *, to_upstream: bool,
                          dechunk: bool = False) -> None:
        """Stream a body with bounded memory; chunk sizes are re-encoded (no extensions),
        so what the upstream sees is framed exactly as we parsed it."""
        timeout = self.limits.idle_timeout

        async def write(data: bytes) -> None:
            dst.write(data)
            try:
                await asyncio.wait_for(dst.drain(), timeout)
            except (ConnectionError, asyncio.TimeoutError, RuntimeError) as e:
                if to_upstream:
                    raise HTTPError(502, "upstream stopped reading the request") from e
                raise _ClientGone() from e

        async def read(n: int) -> bytes:
            try:
                data = await asyncio.wait_for(src.read(n), timeout)
            except (ConnectionError, asyncio.TimeoutError, ssl.SSLError) as e:
                if to_upstream:
                    raise _ClientGone() from e
                raise HTTPError(502, "upstream response broke off") from e
            return data

        async def read_exact(n: int) -> None:
            while n > 0:
                data = await read(min(n, _CHUNK))
                if not data:
                    if to_upstream:
                        raise _ClientGone()
                    raise HTTPError(502, "upstream response broke off")
                n -= len(data)
                await write(data)

        async def readline() -> bytes:
            try:
                line = await asyncio.wait_for(src.readuntil(b"\n"), timeout)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                    asyncio.TimeoutError, ssl.SSLError) as e:
                if to_upstream:
                    raise _ClientGone() from e
                raise HTTPError(502, "upstream sent a malformed chunked body") from e
            return line

        if framing == "chunked":
            while True:
                line = await readline()
                size_s = line.split(b";", 1)[0].strip()
                if not size_s or len(size_s) > 16 or not re.fullmatch(rb"[0-9a-fA-F]+", size_s):
                    if to_upstream:
                        raise HTTPError(400, "malformed chunked request body")
                    raise HTTPError(502, "upstream sent a malformed chunked body")
                size = int(size_s, 16)
                if not dechunk:
                    await write(b"%x\r\n" % size)
                if size == 0:
                    while True:  # trailer fields, then the empty line
                        t = await readline()
                        if not dechunk:
                            await write(t if t.endswith(b"\r\n") else t[:-1] + b"\r\n")
                        if t.strip() == b"":
                            return
                await read_exact(size)
                crlf = await readline()
                if crlf.strip():
                    raise HTTPError(400 if to_upstream else 502, "malformed chunk")
                if not dechunk:
                    await write(b"\r\n")
        elif framing == "close":
            while True:
                data = await read(_CHUNK)
                if not data:
                    return
                await write(data)
        else:
            assert isinstance(framing, int)
            await read_exact(framing)
        return

    async def _pipe(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter,
                    r2: asyncio.StreamReader, w2: asyncio.StreamWriter,
                    idle: float) -> tuple[int, int]:
        """Copy both ways until both sides are done or nothing moved for ``idle`` seconds."""
        last = [time.monotonic()]
        counts = [0, 0]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, i: int) -> None:
            try:
                while True:
                    data = await src.read(_CHUNK)
                    if not data:
                        break
                    last[0] = time.monotonic()
                    counts[i] += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    if dst.can_write_eof():
                        dst.write_eof()
                    else:
                        dst.close()

        tasks = [asyncio.create_task(pump(r1, w2, 0)), asyncio.create_task(pump(r2, w1, 1))]
        try:
            while True:
                _done, pending = await asyncio.wait(tasks, timeout=min(idle, 5.0))
                if not pending:
                    break
                # one side has finished: the other gets a short grace, not the full idle
                limit = idle if len(pending) == 2 else min(idle, 30.0)
                if time.monotonic() - last[0] > limit:
                    break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return counts[0], counts[1]

    async def _tunnel(self, ident: Identity, host: str, port: int, started: float) -> None:
        self.mode = "tunnel"
        try:
            r, w = await self._open(host, port, False)
        except HTTPError as e:
            self._log(ident, "CONNECT", f"{host}:{port}", e.status, (), started)
            await self._fail(e)
            return
        try:
            await self._send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            up, down = await self._pipe(self.reader, self.writer, r, w,
                                        self.limits.tunnel_idle_timeout)
            self._log(ident, "CONNECT", f"{host}:{port}", 200, (), started,
                      note=f"tunnel up={up}B down={down}B")
        finally:
            with contextlib.suppress(Exception):
                w.close()

    # -- logging -------------------------------------------------------------------------
    @staticmethod
    def _url(tls: bool, host: str, port: int, path: str) -> str:
        h = f"[{host}]" if ":" in host else host
        return f"{'https' if tls else 'http'}://{h}:{port}{path}"

    def _log(self, ident: Identity | None, method: str, url: str, status: int,
             rules: Iterable[Rule], started: float, note: str = "") -> None:
        # the query may hold tokens of its own: log the path only, never header values
        url = _USERINFO.sub("://", url.split("?", 1)[0].split("#", 1)[0])
        if len(url) > 200:
            url = url[:200] + "..."
        ids = ",".join(r.id for r in rules) or "-"
        ms = (time.monotonic() - started) * 1000
        log.info("user=%s %s %s status=%s rules=%s mode=%s %.1fms%s",
                 ident.name if ident else "-", method, url, status or "-", ids, self.mode, ms,
                 f" {note}" if note else "")
