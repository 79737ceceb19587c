"""The egress proxy on mitmproxy: our rules, CA and secret look-ups as a mitmproxy add-on.

mitmproxy (a kept library: HTTP/1, HTTP/2, WebSockets, TLS interception) does the parsing,
framing and TLS; this add-on decides, per connection and per request:

* who the client is (``Proxy-Authorization: Basic``, checked on every plain request and on
  each ``CONNECT``; an intercepted connection is re-checked on every request, so a revoked
  token stops an open connection);
* whether a ``CONNECT`` is intercepted (a rule may apply for this user, host and port) or a
  blind TCP tunnel (no rule: mitmproxy never sees inside);
* which rule headers a request gets: matched against the authority the client *connected to*
  (the ``CONNECT`` target, or the absolute-form URI of a plain request), never against a
  ``Host``/``:authority`` the client chose; a request whose ``Host`` or absolute-form target
  differs from that authority is refused;
* where the proxy may connect: every upstream address is resolved here and checked against
  the deny networks, and the connection goes to the checked address (no DNS rebinding).

It runs in its own interpreter (mitmproxy pins versions the project's environment cannot
take, see docs/hub-egress.md) and imports nothing of jupyter_cloudtik but this package.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ipaddress
import logging
import re
import shutil
import socket
import ssl
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from mitmproxy import certs, connection, ctx, http, options
from mitmproxy.addons import core, disable_h2c, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master
from mitmproxy.proxy import layer, layers
from mitmproxy.proxy import server as mitm_server
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.tls import ClientHelloData

from .ca import DeploymentCA
from .proxy import EGRESS_HEADER, Identity, Limits, ProxyConfig
from .rules import Decision, Rule, normalize_host
from .scrub import REFLECTING_METHODS, BodyScrubber, decoder_for, needles, scrub

__all__ = ["EgressAddon", "MitmEgressProxy", "system_ca_file"]

log = logging.getLogger("jupyter_cloudtik.egress")

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]{0,252})$")
# control characters (HTAB allowed in values) and DEL: never in a head that carries a secret
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET_BAD = re.compile(r"[\x00-\x20\x7f]")
_USERINFO = re.compile(r"://[^/]*@")
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                   "/etc/ssl/cert.pem")
# the port of TLS: a rule for it is a rule for HTTPS, never sent over plain http://
TLS_PORT = 443
# a connection over its client's client_connections is answered 429 after this long: a
# client that reconnects at once cannot turn refusals into work the loop does for everyone
OVER_LIMIT_DELAY = 1.0


def system_ca_file() -> str | None:
    """The operating system's CA bundle (not certifi's copy): what upstreams are verified
    against unless a test names its own."""
    paths = ssl.get_default_verify_paths()
    for c in (paths.cafile, paths.openssl_cafile, *_SYSTEM_BUNDLES):
        if c and Path(c).is_file():
            return c
    return None


class Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


@dataclass
class _Conn:
    """What a client connection established: who, and (after CONNECT) to where."""

    ident: Identity | None = None
    connected: float = field(default_factory=time.monotonic)
    host: str | None = None
    port: int | None = None
    intercept: bool = False
    decided: bool = False
    key: str = ""                     # the client it counts for (see EgressAddon.key)
    counted: str | None = None        # the key its connection slot is counted under
    tls_since: float | None = None    # holds a TLS set-up slot since
    body_since: float | None = None   # a request body is being read since
    body_bytes: int = 0
    peer: str = ""                    # its peer address while it is pre-auth (see _preauth)


class _Client:
    """One client's shares of what all clients share (see ``Limits``)."""

    def __init__(self, limits: Limits) -> None:
        self.lookups = asyncio.Semaphore(limits.client_lookups)
        self.handshakes = asyncio.Semaphore(limits.client_handshakes)
        self.connections = 0
        self.next_read = 0.0   # its connections' next read waits until then (loop share)
        self.turn = asyncio.Lock()  # its connections take turns (FIFO) while it is paced
        self.seen = 0.0        # its last read


class _Fair:
    """Per-client bookkeeping of the event loop: one client's expensive reads (a body in
    one-byte chunks, a flood of requests over many connections) are paid for by waiting
    before its next read while other clients are active, and read in small pieces, so no
    single step of the loop takes long.  Work-conserving: a client alone is never held."""

    ACTIVE = 0.5   # seconds: a client that read within this is "active"
    SLOW = 0.002   # a read whose handling took longer: the next read of that connection is small

    def __init__(self, addon: EgressAddon) -> None:
        self.addon = addon
        self.wait = 1.0 / max(0.01, min(1.0, addon.limits.client_loop_share)) - 1.0
        # connections whose last read was cheap to handle: read in full (64 KiB); the
        # others, new ones included, in small pieces
        self.cheap: weakref.WeakSet[connection.Connection] = weakref.WeakSet()

    def _others_active(self, key: str, now: float) -> bool:
        return any(k != key and c.seen > now - self.ACTIVE
                   for k, c in self.addon.clients.items())

    def size(self, conn: connection.Connection) -> int:
        """How much to read next from ``conn``: little at first and after a read that was
        expensive (64 KiB of one-byte chunks is one long step of the loop)."""
        return 65535 if conn in self.cheap else 2048

    async def pace(self, client: connection.Client) -> asyncio.Lock | None:
        """Before data read for ``client`` is handled: while it is over its share, its
        connections queue (FIFO, one woken at a time) and each waits for the client's next
        turn; the lock returned is released once the data is handled."""
        # a connection that has not authenticated yet is paced on its peer address (on a
        # single-host hub, one bucket for every user's first head): leaving pre-auth
        # reads unpaced and billing them to the user afterwards was measured worse (honest
        # GETs up to 2-11 s instead of ~1 s: a churning client's first reads jumped the
        # queue), see docs/hub-egress.md
        cl = self.addon.client(self.addon.key(client))
        if cl.next_read - time.monotonic() <= 0.001 and not cl.turn.locked():
            return None
        await cl.turn.acquire()
        try:
            delay = cl.next_read - time.monotonic()
            if delay > 0.001:
                await asyncio.sleep(delay)
        except BaseException:
            cl.turn.release()
            raise
        return cl.turn

    def after(self, conn: connection.Connection, spent: float) -> None:
        """A read of ``conn`` took ``spent`` to handle: the next one is small if it was
        expensive."""
        if spent > self.SLOW:
            self.cheap.discard(conn)
        else:
            self.cheap.add(conn)

    def charge(self, client: connection.Client, spent: float) -> None:
        """``client``'s connection handler used the loop for ``spent`` (any event: data,
        a hook's completion, a connection opened or closed)."""
        key = self.addon.key(client)
        cl = self.addon.client(key)
        now = time.monotonic()
        cl.seen = now
        if self.wait and self._others_active(key, now):
            cl.next_read = max(now, cl.next_read) + spent * self.wait


def _valid_host(host: str) -> str:
    h = normalize_host(host)
    if not h:
        raise Refused(400, "empty host in request target")
    try:
        ipaddress.ip_address(h)
        return h
    except ValueError:
        pass
    if not h.isascii() or not _HOSTNAME.match(h) or ".." in h:
        raise Refused(400, "invalid host in request target")
    return h


def _parse_authority(authority: str, default_port: int) -> tuple[str, int]:
    a = authority.strip()
    if a.startswith("["):
        end = a.find("]")
        if end < 0 or (a[end + 1:] and not a[end + 1:].startswith(":")):
            raise Refused(400, "malformed IPv6 authority")
        host, port_s = a[1:end], a[end + 2:]
    else:
        host, _, port_s = a.partition(":")
    if port_s:
        # ASCII digits only: int() takes other scripts' digits, we do not
        if not (port_s.isascii() and port_s.isdigit()) or not 0 < int(port_s) < 65536:
            raise Refused(400, "invalid port in authority")
        port = int(port_s)
    else:
        port = default_port
    return _valid_host(host), port


def _same_origin(host_header: str, host: str, port: int) -> bool:
    try:
        return _parse_authority(host_header, port) == (host, port)
    except Refused:
        return False


def _authority(host: str, port: int, default: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return h if port == default else f"{h}:{port}"


def _reason_text(status: int) -> str:
    return http.status_codes.RESPONSES.get(status, "Error")


def _error(status: int, text: str, extra: dict[str, str] | None = None) -> http.Response:
    body = f"{status} {_reason_text(status)}: {text}\n"
    headers = {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"}
    headers.update(extra or {})
    return http.Response.make(status, body, headers)


class EgressAddon:
    """Rules, identities and the deny list, applied to mitmproxy's flows."""

    def __init__(self, ca: DeploymentCA, limits: Limits) -> None:
        self.ca = ca
        self.limits = limits
        self.config = ProxyConfig()
        self.conns: weakref.WeakKeyDictionary[connection.Client, _Conn] = \
            weakref.WeakKeyDictionary()
        self.clients: dict[str, _Client] = {}
        # connections not authenticated yet, per peer address, oldest first
        self._preauth: dict[str, collections.OrderedDict[connection.Client, None]] = {}
        self.fair = _Fair(self)
        # name look-ups run here, not in the loop's default executor (a handful of threads
        # one client's slow names could fill for everyone)
        self._resolver = concurrent.futures.ThreadPoolExecutor(
            max_workers=limits.lookup_threads, thread_name_prefix="egress-dns")
        self._lookups: collections.OrderedDict[tuple[str, int], tuple[float, list[str]]] = \
            collections.OrderedDict()
        self._sweeper: asyncio.Task | None = None
        self._store: certs.CertStore | None = None

    # -- clients ---------------------------------------------------------------------------
    def key(self, client: connection.Client) -> str:
        """Who a connection counts for: its authenticated user, else its peer address
        (anonymous sessions and connections that have not authenticated yet)."""
        st = self.conns.get(client)
        if st is not None and st.key:
            return st.key
        peer = client.peername[0] if client.peername else "?"
        return f"peer:{peer}"

    def client(self, key: str) -> _Client:
        cl = self.clients.get(key)
        if cl is None:
            cl = self.clients[key] = _Client(self.limits)
        return cl

    def _admit(self, flow: http.HTTPFlow, st: _Conn, ident: Identity) -> Refused | None:
        """Count this connection for its client once it is known; over the share: 429."""
        key = (f"user:{ident.user}" if ident.user is not None
               else f"peer:{flow.client_conn.peername[0] if flow.client_conn.peername else '?'}")
        st.key = key
        if st.counted == key:
            return None
        if st.counted is not None:
            self.client(st.counted).connections -= 1
        else:
            # authenticated: no longer in its peer's pre-auth budget
            self._preauth_done(flow.client_conn)
        cl = self.client(key)
        cl.connections += 1
        st.counted = key
        if cl.connections > self.limits.client_connections:
            return Refused(429, f"{ident.name} has more than {self.limits.client_connections} "
                           "open connections to the egress proxy (limit client_connections)")
        return None

    async def resolve(self, key: str, host: str, port: int) -> list[str]:
        """The addresses of ``host``: at most ``client_lookups`` look-ups of one client at
        once (its others wait for its own slots), each bounded by ``lookup_timeout``.  A
        slot stays taken until the look-up's thread is really done (a timed-out libc call
        still runs), so one client can never hold more than its share of the threads."""
        now = time.monotonic()
        hit = self._lookups.get((host, port))
        if hit is not None and hit[0] > now:
            return hit[1]
        cl = self.client(key)
        deadline = now + self.limits.lookup_timeout
        try:
            await asyncio.wait_for(cl.lookups.acquire(), self.limits.lookup_timeout)
        except asyncio.TimeoutError:
            raise Refused(504, f"name look-up of {host[:100]} waited more than "
                          f"{self.limits.lookup_timeout:g} s for a slot: this client has "
                          f"{self.limits.client_lookups} look-ups running (limit "
                          "client_lookups)") from None
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._resolver, socket.getaddrinfo, host, port, 0,
                                   socket.SOCK_STREAM)
        fut.add_done_callback(lambda _f: cl.lookups.release())
        try:
            infos = await asyncio.wait_for(asyncio.shield(fut),
                                           max(0.1, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise Refused(504, f"name look-up of {host[:100]} took more than "
                          f"{self.limits.lookup_timeout:g} s") from None
        except OSError:
            raise Refused(502, f"cannot resolve {host[:100]}") from None
        addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
        if self.limits.lookup_cache_seconds > 0:
            self._lookups[(host, port)] = (time.monotonic() + self.limits.lookup_cache_seconds,
                                           addrs)
            self._lookups.move_to_end((host, port))
            while len(self._lookups) > 4096:
                self._lookups.popitem(last=False)
        return addrs

    # -- lifecycle -------------------------------------------------------------------------
    def running(self) -> None:
        # the deployment CA signs the leaves, in memory only (mitmproxy uses one key for the
        # CA and its leaves: ours never leaves this process or its 0600 file)
        dh = Path(ctx.options.confdir) / "dhparam.pem"  # mitmproxy's default parameters
        self._store = certs.CertStore(self.ca._key, certs.Cert(self.ca.cert), None,
                                      certs.CertStore.load_dhparam(dh))
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def tls_start_client(self, data: object) -> None:
        # tlsconfig (re)makes a store of its own when it starts: ours is put back before
        # every client handshake it serves (this add-on runs first)
        tlsconfig = ctx.master.addons.get("tlsconfig")
        if tlsconfig.certstore is not self._store:
            tlsconfig.certstore = self._store

    def done(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._resolver.shutdown(wait=False, cancel_futures=True)

    async def _sweep(self) -> None:
        """Close connections that have not authenticated within the handshake timeout:
        idle or slow unauthenticated sockets cannot pile up and starve everyone else."""
        limit = self.limits.handshake_timeout
        while True:
            await asyncio.sleep(min(1.0, limit / 2))
            now = time.monotonic()
            ps = ctx.master.addons.get("proxyserver")
            for handler in list(ps.connections.values()):
                st = self.conns.get(handler.client)
                if st is None:
                    continue
                why = None
                if st.ident is None and now - st.connected >= limit:
                    why = f"closing an unauthenticated connection after {limit:.0f}s"
                elif st.tls_since is not None and now - st.tls_since >= limit:
                    why = (f"closing a connection of {st.ident.name if st.ident else '-'} "
                           f"whose TLS set-up took more than {limit:.0f}s")
                elif (st.body_since is not None and self.limits.min_body_rate > 0
                      and now - st.body_since >= self.limits.body_grace
                      and st.body_bytes / (now - st.body_since) < self.limits.min_body_rate):
                    why = (f"closing a connection of {st.ident.name if st.ident else '-'} "
                           f"whose request body came slower than "
                           f"{self.limits.min_body_rate:g} bytes/s (limit min_body_rate)")
                if why is None:
                    continue
                io = handler.transports.get(handler.client)
                if io is not None and io.handler is not None:
                    log.info("%s", why)
                    st.body_since = None
                    self._tls_done(handler.client)
                    io.handler.cancel("egress limit")
            self.forget(now)

    def forget(self, now: float) -> int:
        """Forget clients that hold nothing and did nothing for ``client_forget_seconds``:
        the table stays bounded under a stream of distinct peers and identities (a client's
        entry is made again, empty, when it comes back).  The number forgotten."""
        idle = now - self.limits.client_forget_seconds
        gone = [k for k, c in self.clients.items()
                if c.connections <= 0 and c.seen < idle and not c.turn.locked()
                and c.lookups._value == self.limits.client_lookups
                and c.handshakes._value == self.limits.client_handshakes]
        for k in gone:
            del self.clients[k]
        if gone:
            log.info("forgot %d idle client(s); %d known", len(gone), len(self.clients))
        return len(gone)

    def set_config(self, config: ProxyConfig) -> None:
        self.config = config  # one reference swap

    # -- connections -----------------------------------------------------------------------
    def client_connected(self, client: connection.Client) -> None:
        peer = client.peername[0] if client.peername else "?"
        self.conns[client] = _Conn(peer=peer)
        waiting = self._preauth.setdefault(peer, collections.OrderedDict())
        waiting[client] = None
        while len(waiting) > self.limits.preauth_connections:
            # over the peer's pre-auth budget: its oldest connection that has not
            # authenticated goes (an honest client authenticates with its first request,
            # so the oldest is the one that idles), the new one stays
            old, _ = waiting.popitem(last=False)
            self._close(old, f"closing the oldest of more than "
                        f"{self.limits.preauth_connections} unauthenticated connections from "
                        f"{peer} (limit preauth_connections)")

    def _preauth_done(self, client: connection.Client) -> None:
        st = self.conns.get(client)
        if st is None or not st.peer:
            return
        waiting = self._preauth.get(st.peer)
        if waiting is not None:
            waiting.pop(client, None)
            if not waiting:
                del self._preauth[st.peer]
        st.peer = ""

    def _close(self, client: connection.Client, why: str) -> None:
        ps = ctx.master.addons.get("proxyserver")
        handler = ps.connections.get(client.id)
        io = handler.transports.get(client) if handler is not None else None
        if io is not None and io.handler is not None:
            log.info("%s", why)
            io.handler.cancel("egress limit")

    def client_disconnected(self, client: connection.Client) -> None:
        st = self.conns.get(client)
        if st is None:
            return
        self._preauth_done(client)
        self._tls_done(client)
        if st.counted is not None:
            self.client(st.counted).connections -= 1
            st.counted = None

    def _tls_done(self, client: connection.Client) -> None:
        st = self.conns.get(client)
        if st is not None and st.tls_since is not None:
            st.tls_since = None
            self.client(st.key).handshakes.release()

    def tls_established_client(self, data: object) -> None:
        self._tls_done(data.context.client)  # type: ignore[attr-defined]

    def tls_failed_client(self, data: object) -> None:
        self._tls_done(data.context.client)  # type: ignore[attr-defined]

    def _state(self, client: connection.Client) -> _Conn:
        st = self.conns.get(client)
        if st is None:
            st = self.conns[client] = _Conn()
        return st

    def _authenticate(self, flow: http.HTTPFlow) -> Identity | None:
        values = flow.request.headers.get_all("proxy-authorization")
        if len(values) > 1:
            return None
        return self.config.authenticate(values[0] if values else None)

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        st = self._state(flow.client_conn)
        started = time.monotonic()
        flow.metadata["egress_started"] = started
        ident = self._authenticate(flow)
        if ident is None:
            flow.response = _error(407, "proxy credentials missing or invalid",
                                   {"Proxy-Authenticate": 'Basic realm="jupyter_cloudtik egress"'})
            self._log(None, "CONNECT", "-", 407, (), started)
            return
        try:
            host, port = _valid_host(flow.request.host), flow.request.port
            authority = flow.request.authority or ""
            if authority and _parse_authority(authority, port) != (host, port):
                raise Refused(400, "malformed CONNECT authority")
            hh = flow.request.headers.get_all("host")
            if len(hh) > 1 or (hh and not _same_origin(hh[0], host, port)):
                raise Refused(400, "Host header differs from the CONNECT authority")
        except Refused as e:
            flow.response = _error(e.status, e.text)
            self._log(ident, "CONNECT", flow.request.host[:100], e.status, (), started,
                      note=e.text)
            return
        if "proxy-authorization" in flow.request.headers:
            del flow.request.headers["proxy-authorization"]
        try:
            over = self._admit(flow, st, ident)
            if over is not None:
                await asyncio.sleep(OVER_LIMIT_DELAY)
                raise over
            if await self._denied(st.key, host, port):
                raise Refused(403, f"{host}:{port} is in a network the egress proxy does "
                              "not reach")
            intercept = bool(self.config.rules.for_host(ident.user, ident.groups, host, port))
            if intercept and st.tls_since is None:
                # a TLS set-up (upstream connection, leaf, two handshakes) is work the
                # proxy does for this client: at most client_handshakes of its at once
                sem = self.client(st.key).handshakes
                try:
                    await asyncio.wait_for(sem.acquire(), self.limits.handshake_timeout)
                except asyncio.TimeoutError:
                    raise Refused(503, f"{ident.name} has {self.limits.client_handshakes} "
                                  "TLS set-ups in progress for more than "
                                  f"{self.limits.handshake_timeout:g} s (limit "
                                  "client_handshakes)") from None
                st.tls_since = time.monotonic()
        except Refused as e:
            flow.response = _error(e.status, e.text)
            self._log(ident, "CONNECT", f"{host}:{port}", e.status, (), started,
                      note="denied" if e.status == 403 else e.text)
            return
        st.ident, st.host, st.port, st.decided = ident, host, port, False
        st.intercept = intercept
        flow.metadata["egress_mode"] = "mitm" if st.intercept else "tunnel"

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        if nextlayer.layer is not None:
            return
        st = self.conns.get(nextlayer.context.client)
        if st is None or st.host is None or st.decided:
            return
        if not st.intercept:
            # no rule for this user here: a blind tunnel, whatever the bytes are
            st.decided = True
            nextlayer.layer = layers.TCPLayer(nextlayer.context, ignore=True)
            self._log(st.ident, "CONNECT", f"{st.host}:{st.port}", 200, (), time.monotonic(),
                      mode="tunnel")
            return
        data = nextlayer.data_client()
        if not data:
            return  # wait for the first bytes
        st.decided = True
        if data[0] != 0x16:
            # a ruled host but not TLS inside the CONNECT: never injected, tunnelled as is
            self._tls_done(nextlayer.context.client)
            nextlayer.layer = layers.TCPLayer(nextlayer.context, ignore=True)
            self._log(st.ident, "CONNECT", f"{st.host}:{st.port}", 200, (), time.monotonic(),
                      mode="tunnel", note="not TLS: not intercepted")

    def tls_clienthello(self, data: ClientHelloData) -> None:
        st = self.conns.get(data.context.client)
        if st is None or st.host is None:
            data.ignore_connection = True
            return
        sni = data.client_hello.sni
        if sni is not None and normalize_host(sni) != st.host:
            # the client names another host than it connected to: not intercepted (a
            # blind tunnel to the CONNECT host carries nothing of ours)
            data.ignore_connection = True
            self._tls_done(data.context.client)
            self._log(st.ident, "CONNECT", f"{st.host}:{st.port}", 200, (), time.monotonic(),
                      mode="tunnel", note="SNI differs from the CONNECT host: not intercepted")

    async def _denied(self, key: str, host: str, port: int) -> bool:
        """Whether every address of ``host`` is denied (an early, readable 403; the
        connection itself is checked again in ``server_connect``).  A look-up that takes
        too long is this client's 504 (``Refused``)."""
        try:
            ipaddress.ip_address(host)
            return self.config.denied(host)
        except ValueError:
            pass
        try:
            addrs = await self.resolve(key, host, port)
        except Refused as e:
            if e.status == 504:
                raise
            return False  # server_connect says it cannot resolve
        return all(self.config.denied(a) for a in addrs)

    async def server_connect(self, data: ServerConnectionHookData) -> None:
        """Resolve here, refuse denied networks, connect to the address we checked."""
        if data.server.address is None:
            return
        host, port = data.server.address[0], data.server.address[1]
        try:
            ipaddress.ip_address(host)
            addrs = [host]
            is_name = False
        except ValueError:
            is_name = True
            try:
                addrs = await self.resolve(self.key(data.client), host, port)
            except Refused as e:
                data.server.error = e.text
                return
        allowed = [a for a in addrs if not self.config.denied(a)]
        if not allowed:
            data.server.error = (f"{host}:{port} is in a network the egress proxy does not "
                                 "reach")
            return
        if is_name:
            if data.server.sni is None:
                data.server.sni = host
            data.server.address = (allowed[0], port)
        st = self.conns.get(data.client)
        if st is not None and st.host is None:
            self._close_idle_upstreams(data.client, data.server)

    def _close_idle_upstreams(self, client: connection.Client,
                              keep: connection.Server) -> None:
        """A plain-HTTP client connection that asks for another upstream is done with its
        others (HTTP/1: the next request is read only once the last response is sent):
        they are closed.  mitmproxy kept them until its 600 s idle timeout, and allows 5
        per upstream address per client connection, so a keep-alive session visiting a
        sixth name of one address (virtual hosts, a CDN) stalled until an upstream hung up."""
        ps = ctx.master.addons.get("proxyserver")
        for handler in list(ps.connections.values()):
            if handler.client is not client:
                continue
            for conn, io in list(handler.transports.items()):
                if conn is client or conn is keep or io.handler is None:
                    continue
                conn.state = connection.ConnectionState.CLOSED
                io.handler.cancel("egress: superseded by a connection to another upstream")
            return

    # -- requests --------------------------------------------------------------------------
    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        started = time.monotonic()
        flow.metadata["egress_started"] = started
        st = self._state(flow.client_conn)
        req = flow.request
        tls = st.host is not None
        flow.metadata["egress_mode"] = "mitm" if tls else "http"
        ident: Identity | None = None
        try:
            if tls:
                assert st.ident is not None and st.port is not None
                ident = (self.config.identify(st.ident.user, st.ident.token)
                         if st.ident.token is not None else self.config.identify(None, None))
                if ident is None:
                    raise Refused(403, "proxy credentials no longer valid")
                host, port = st.host, st.port
                if req.scheme != "https":
                    raise Refused(400, "plain HTTP inside an intercepted tunnel")
                hh = req.headers.get_all("host")
                if len(hh) > 1 or (hh and not _same_origin(hh[0], host, port)):
                    raise Refused(400, "Host header differs from the CONNECT host")
                if req.authority and not _same_origin(req.authority, host, port):
                    raise Refused(400, "request authority differs from the CONNECT host")
            else:
                ident = self._authenticate(flow)
                if ident is None:
                    flow.response = _error(
                        407, "proxy credentials missing or invalid",
                        {"Proxy-Authenticate": 'Basic realm="jupyter_cloudtik egress"'})
                    self._log(None, req.method[:20], "-", 407, (), started, mode="http")
                    return
                st.ident = st.ident or ident
                over = self._admit(flow, st, ident)
                if over is not None:
                    await asyncio.sleep(OVER_LIMIT_DELAY)
                    raise over
                # mitmproxy took the target from the absolute-form URI (or, for an
                # origin-form request, from its Host): the rules match that, and the Host
                # sent upstream is rewritten to it below
                if req.scheme != "http":
                    raise Refused(400, "only http:// URIs are proxied directly; use CONNECT "
                                  "for https")
                if "@" in (req.host or ""):
                    raise Refused(400, "user info in the request URI is not supported")
                host, port = _valid_host(req.host), req.port
                if not 0 < port < 65536:
                    raise Refused(400, "invalid port in request target")
            self._check_head(req)
            if not tls and await self._denied(st.key, host, port):
                raise Refused(403, f"{host}:{port} is in a network the egress proxy does "
                              "not reach")
        except Refused as e:
            flow.response = _error(e.status, e.text)
            self._log(ident, req.method[:20], "-", e.status, (), started,
                      mode=flow.metadata["egress_mode"], note=e.text)
            return
        flow.metadata["egress_user"] = ident.name
        for name in [k for k in req.headers if k.lower().startswith("proxy-")]:
            del req.headers[name]
        if not tls:
            # the upstream routes by Host: it names the host the rules were matched for
            req.headers["Host"] = _authority(host, port, 80)
        flow.metadata["egress_url"] = self._url(tls, host, port, req.path)
        try:
            rules, skipped = self._rules_for(req, ident, tls, host, port)
        except Refused as e:
            flow.response = _error(e.status, e.text)
            self._log(ident, req.method[:20], flow.metadata["egress_url"], e.status, (),
                      started, mode=flow.metadata["egress_mode"], note="refused")
            return
        for r in rules:
            req.headers[r.header] = r.value
        if rules:
            # an encoded body could carry a value back past the scrubber: ask for none
            req.headers["Accept-Encoding"] = "identity"
        flow.metadata["egress_rules"] = rules
        flow.metadata["egress_skipped"] = skipped
        # bodies are streamed: bounded memory, and a body never delays a decision; one
        # that comes slower than min_body_rate is cut off by the sweeper
        st.body_since, st.body_bytes = time.monotonic(), 0

        def count(data: bytes) -> bytes:
            if data:
                st.body_bytes += len(data)
            else:
                st.body_since = None  # the end of the body
            return data

        req.stream = count

    def _rules_for(self, req: http.Request, ident: Identity, tls: bool, host: str,
                   port: int) -> tuple[list[Rule], list[Rule]]:
        """(rules to apply, rules not applied because the client sent the header)."""
        decision = self.config.rules.decide(ident.user, ident.groups, host, port, req.path)
        refused = list(decision.refused_by)
        matched = list(decision.rules)
        if not tls:
            # a secret never goes in cleartext to a rule meant for TLS (its port is 443, or
            # it names no port at all: then it is for https only)
            matched = [r for r in matched if r.port is not None and r.port != TLS_PORT]
            refused = [r for r in refused if r.port is not None and r.port != TLS_PORT]
        if refused:
            raise Refused(400, Decision(refused_by=tuple(refused),
                                        why=decision.why).refusal())
        if matched and req.method.upper() in REFLECTING_METHODS:
            raise Refused(405, f"{req.method.upper()} sends the request back to the client; "
                          f"it is refused where rule(s) {', '.join(r.id for r in matched)} "
                          "would add a credential")
        rules = [r for r in matched if r.header not in req.headers]
        return rules, [r for r in matched if r not in rules]

    @staticmethod
    def _check_head(req: http.Request) -> None:
        if _TARGET_BAD.search(req.path):
            raise Refused(400, "control character or space in the request target")
        if not _TOKEN.match(req.method):
            raise Refused(400, "malformed request method")
        for name, value in req.headers.fields:
            if not _TOKEN.match(name.decode("latin-1")) or _CTL.search(value):
                raise Refused(400, "malformed header field")

    def request(self, flow: http.HTTPFlow) -> None:
        st = self.conns.get(flow.client_conn)
        if st is not None:
            st.body_since = None
        # trailers of the client are not relayed: a trailer field could carry a header the
        # rules own (Authorization, Host) past every check made on the head
        if flow.request.trailers:
            flow.request.trailers = None

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        resp = flow.response
        if resp is None:
            return
        resp.stream = True
        if EGRESS_HEADER in resp.headers:
            del resp.headers[EGRESS_HEADER]
        rules = flow.metadata.get("egress_rules", ())
        if rules:
            self._scrub_response(flow, rules)
        for r in flow.metadata.get("egress_skipped", ()):
            resp.headers.add(EGRESS_HEADER, f"not-applied rule={r.id} reason=client-sent-header")
        for r in flow.metadata.get("egress_rules", ()):
            resp.headers.add(EGRESS_HEADER, f"applied rule={r.id}")

    def _scrub_response(self, flow: http.HTTPFlow, rules: list[Rule]) -> None:
        """No injected value reaches the client in any form an echo takes (scrub.py)."""
        resp = flow.response
        assert resp is not None
        forms = needles(r.value for r in rules)
        flow.metadata["egress_forms"] = forms
        masked = 0
        fields = []
        for name, value in resp.headers.fields:
            value, n = scrub(value, forms)
            masked += n
            fields.append((name, value))
        if masked:
            resp.headers.fields = tuple(fields)
        try:
            decoder = decoder_for(resp.headers.get("content-encoding", ""))
        except (ValueError, ImportError):
            # a body the proxy cannot read is a body it cannot check
            body = (f"502 Bad Gateway: the upstream answered a request that carried rule "
                    f"{rules[0].id}'s credential in a content coding the proxy cannot check "
                    f"({resp.headers.get('content-encoding', '')[:40]!r})\n").encode()
            status = 502
            flow.response = http.Response.make(status, b"", {
                "Content-Type": "text/plain; charset=utf-8",
                "Content-Length": str(len(body)), "Connection": "close"})
            sent = [False]

            def refuse(_data: bytes) -> list[bytes]:
                if sent[0]:
                    return []
                sent[0] = True
                return [body]

            flow.response.stream = refuse
            flow.metadata["egress_note"] = "refused: unreadable content coding"
            return
        if decoder is not None:
            for h in ("content-encoding", "content-length"):
                if h in resp.headers:
                    del resp.headers[h]
            if flow.request.http_version == "HTTP/1.1":
                resp.headers["transfer-encoding"] = "chunked"
        scrubber = BodyScrubber(forms, decoder)
        flow.metadata["egress_scrubber"] = scrubber
        flow.metadata["egress_header_masks"] = masked
        resp.stream = scrubber

    def response(self, flow: http.HTTPFlow) -> None:
        if "egress_url" not in flow.metadata or flow.response is None:
            return
        forms = flow.metadata.get("egress_forms")
        masked = flow.metadata.get("egress_header_masks", 0)
        if forms and flow.response.trailers:
            fields = []
            for name, value in flow.response.trailers.fields:
                value, n = scrub(value, forms)
                masked += n
                fields.append((name, value))
            flow.response.trailers.fields = tuple(fields)
        scrubber = flow.metadata.get("egress_scrubber")
        masked += scrubber.count if scrubber is not None else 0
        skipped = flow.metadata.get("egress_skipped", ())
        notes = [f"not-applied={r.id}(client-sent-header)" for r in skipped]
        if masked:
            notes.append(f"masked {masked} echo(es) of an injected value")
        if flow.metadata.get("egress_note"):
            notes.append(flow.metadata["egress_note"])
        self._log_flow(flow, flow.response.status_code, " ".join(notes))

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        forms = flow.metadata.get("egress_forms")
        if not forms or flow.websocket is None:
            return
        message = flow.websocket.messages[-1]
        if message.from_client:
            return
        content, n = scrub(message.content, forms)
        if n:
            message.content = content
            log.info("user=%s websocket %s masked %d echo(es) of an injected value",
                     flow.metadata.get("egress_user", "-"),
                     self._clean(flow.metadata["egress_url"]), n)

    def error(self, flow: http.HTTPFlow) -> None:
        if "egress_url" not in flow.metadata:
            return
        err = flow.error.msg if flow.error else "error"
        # mitmproxy's messages name addresses and errno texts, never header values
        self._log_flow(flow, 502, f"aborted ({err[:120]})")

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        if "egress_url" in flow.metadata:
            self._log_flow(flow, 101, "websocket")

    # -- logging ---------------------------------------------------------------------------
    @staticmethod
    def _url(tls: bool, host: str, port: int, path: str) -> str:
        h = f"[{host}]" if ":" in host else host
        return f"{'https' if tls else 'http'}://{h}:{port}{path}"

    def _log_flow(self, flow: http.HTTPFlow, status: int, note: str) -> None:
        log.info("user=%s %s %s status=%s rules=%s mode=%s %.1fms%s",
                 flow.metadata.get("egress_user", "-"), flow.request.method[:20],
                 self._clean(flow.metadata["egress_url"]), status,
                 ",".join(r.id for r in flow.metadata.get("egress_rules", ())) or "-",
                 flow.metadata.get("egress_mode", "-"),
                 (time.monotonic() - flow.metadata.get("egress_started", time.monotonic()))
                 * 1000, f" {note}" if note else "")

    @staticmethod
    def _clean(url: str) -> str:
        url = _USERINFO.sub("://", url.split("?", 1)[0].split("#", 1)[0])
        return url if len(url) <= 200 else url[:200] + "..."

    def _log(self, ident: Identity | None, method: str, url: str, status: int,
             rules: tuple[Rule, ...] | list[Rule], started: float, *, mode: str = "-",
             note: str = "") -> None:
        log.info("user=%s %s %s status=%s rules=%s mode=%s %.1fms%s",
                 ident.name if ident else "-", method, self._clean(url), status,
                 ",".join(r.id for r in rules) or "-", mode,
                 (time.monotonic() - started) * 1000, f" {note}" if note else "")


_BOUNDED = False


def bound_http1_heads(max_bytes: int, max_fields: int) -> None:
    """mitmproxy 11 buffers an HTTP/1 head without any bound ("FIXME: protect against
    header size DoS" in its ``_http1.py``): one client could fill our memory with a head
    that never ends.  Heads of clients and upstreams alike are bounded here: a client gets
    431, an upstream's connection is closed (the client gets 502).  Trailer fields, which
    it does not implement (an exception per connection), are refused with a 400."""
    global _BOUNDED
    if _BOUNDED:
        return
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import _http1

    def wrap(cls: type, server: bool) -> None:
        original = cls.read_headers

        def read_headers(self, event):  # type: ignore[no-untyped-def]
            if isinstance(event, events.DataReceived):
                data = self.buf._data
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    end = data.find(b"\n\n")
                size = len(data) if end < 0 else end
                if size > max_bytes or data.count(b"\n", 0, size) > max_fields + 1:
                    if server:
                        yield commands.SendData(self.conn, _http1.make_error_response(
                            431, f"request head larger than {max_bytes} bytes or "
                                 f"{max_fields} fields"))
                    else:
                        yield commands.Log("upstream response head too large: closed")
                    yield commands.CloseConnection(self.conn)
                    self.state = self.done
                    return
            yield from original(self, event)

        cls.read_headers = read_headers

        def read_body(self, event):  # type: ignore[no-untyped-def]
            # mitmproxy 11 raises NotImplementedError on HTTP/1 trailer fields, which
            # kills the connection with a traceback: refuse them (400) instead.  The
            # trailers themselves are never relayed either way.
            try:
                yield from _read_body_coalesced(self, event)
            except NotImplementedError:
                if server:
                    yield commands.SendData(self.conn, _http1.make_error_response(
                        400, "trailer fields are not accepted"))
                else:
                    yield commands.Log("upstream sent trailer fields: closed")
                yield commands.CloseConnection(self.conn)
                self.state = self.done

        cls.read_body = read_body

    wrap(_http1.Http1Server, True)
    wrap(_http1.Http1Client, False)
    _BOUNDED = True


def _read_body_coalesced(self, event):  # type: ignore[no-untyped-def]
    """mitmproxy's ``Http1Connection.read_body``, but the data of consecutive chunks of one
    read go on as one piece: mitmproxy passed each chunk of a chunked body through its
    layers and wrote it upstream on its own, so a body in one-byte chunks cost a socket
    write (and its framing) per byte, on the loop every client shares (issue 27)."""
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp

    h11 = _http1.h11
    assert self.stream_id is not None
    pending: list[bytes] = []

    def flush():  # type: ignore[no-untyped-def]
        if pending:
            data = b"".join(pending)
            pending.clear()
            yield ReceiveHttp(self.ReceiveData(self.stream_id, data))

    while True:
        try:
            if isinstance(event, events.DataReceived):
                h11_event = self.body_reader(self.buf)
            elif isinstance(event, events.ConnectionClosed):
                h11_event = self.body_reader.read_eof()
            else:
                raise AssertionError(f"Unexpected event: {event}")
        except h11.ProtocolError as e:
            yield from flush()
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(self.ReceiveProtocolError(self.stream_id,
                                                        f"HTTP/1 protocol error: {e}"))
            return
        if h11_event is None:
            yield from flush()
            return
        if isinstance(h11_event, h11.Data):
            data = bytes(h11_event.data)
            if data:
                pending.append(data)
        elif isinstance(h11_event, h11.EndOfMessage):
            yield from flush()
            assert self.request
            if h11_event.headers:
                raise NotImplementedError("HTTP trailers are not implemented yet.")
            if self.request.data.method.upper() != b"CONNECT":
                yield ReceiveHttp(self.ReceiveEndOfMessage(self.stream_id))
            is_request = isinstance(self, _http1.Http1Server)
            yield from self.mark_done(request=is_request, response=not is_request)
            return


_GATE: _Fair | None = None
# a hook is charged its wall time up to this (beyond it, it was waiting, not working)
HOOK_CHARGE_CAP = 0.005


def fair_reads(gate: _Fair) -> None:
    """mitmproxy reads every connection as fast as data comes and hands it to its layers
    at once: a client whose reads are expensive (tiny chunks, a flood of requests) takes the
    loop every other client waits on.  Reads of client connections go through ``gate``
    (``_Fair``): they are taken in small pieces after an expensive one, and a client that
    used more than its share of the loop waits before its data is handled while others are
    active (the reads of its upstream connections count for it too).  The rest is
    mitmproxy's ``ConnectionHandler.handle_connection`` (11.0.2)."""
    global _GATE
    first = _GATE is None
    _GATE = gate
    if not first:
        return
    from mitmproxy.connection import ConnectionState
    from mitmproxy.proxy import events

    async def handle_connection(self, connection):  # type: ignore[no-untyped-def]
        cancelled = None
        reader = self.transports[connection].reader
        assert reader
        gate = _GATE
        while True:
            try:
                data = await reader.read(gate.size(connection) if gate else 65535)
                if not data:
                    raise OSError("Connection closed by peer.")
                turn = await gate.pace(self.client) if gate is not None else None
            except OSError:
                break
            except asyncio.CancelledError as e:
                cancelled = e
                break
            try:
                t0 = time.perf_counter()
                await self.server_event(events.DataReceived(connection, data))
                if gate is not None:
                    gate.after(connection, time.perf_counter() - t0)
            finally:
                if turn is not None:
                    turn.release()
            try:
                await self.drain_writers()
            except asyncio.CancelledError as e:
                cancelled = e
                break

        if cancelled is None and connection.transport_protocol == "tcp":
            connection.state &= ~ConnectionState.CAN_READ
        else:
            connection.state = ConnectionState.CLOSED

        await self.server_event(events.ConnectionClosed(connection))

        if connection.state is ConnectionState.CAN_WRITE:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError as e:
                cancelled = e

        try:
            writer = self.transports[connection].writer
            assert writer
            writer.close()
        except OSError:
            pass
        self.transports.pop(connection)

        if cancelled:
            raise cancelled

    mitm_server.ConnectionHandler.handle_connection = handle_connection
    original_event = mitm_server.ConnectionHandler.server_event

    async def server_event(self, event):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            await original_event(self, event)
        finally:
            if _GATE is not None:
                _GATE.charge(self.client, time.perf_counter() - t0)

    mitm_server.ConnectionHandler.server_event = server_event

    async def hook_task(self, hook):  # type: ignore[no-untyped-def]
        # the add-ons' work for a hook is the client's too (ours: credentials, rules, the
        # log line); its wall time, capped, since it may await a look-up
        t0 = time.perf_counter()
        await self.handle_hook(hook)
        if _GATE is not None:
            _GATE.charge(self.client, min(time.perf_counter() - t0, HOOK_CHARGE_CAP))
        if hook.blocking:
            await self.server_event(events.HookCompleted(hook))

    mitm_server.ConnectionHandler.hook_task = hook_task


class MitmEgressProxy:
    """Same surface as ``EgressProxy``: ``await start()``, ``set_config()``, ``await stop()``."""

    def __init__(self, ca: DeploymentCA, *, host: str = "127.0.0.1", port: int = 0,
                 upstream_ca_bundle: str | None = None, limits: Limits | None = None) -> None:
        self.ca = ca
        self.host = host
        self.requested_port = port
        self.limits = limits or Limits()
        self.addon = EgressAddon(ca, self.limits)
        self.upstream_ca = upstream_ca_bundle or system_ca_file()
        self.port: int | None = None
        self._master: Master | None = None
        self._task: asyncio.Task | None = None
        self._confdir = tempfile.mkdtemp(prefix="egress-mitm-")

    def set_config(self, config: ProxyConfig) -> None:
        self.addon.set_config(config)

    async def start(self) -> int:
        # an idle connection (no byte either way) is closed after idle_timeout; open tunnels
        # get the longer tunnel timeout
        mitm_server.TCP_TIMEOUT = int(max(self.limits.idle_timeout,
                                          self.limits.tunnel_idle_timeout))
        bound_http1_heads(self.limits.max_header_bytes, self.limits.max_headers)
        fair_reads(self.addon.fair)
        opts = options.Options(listen_host=self.host, listen_port=self.requested_port,
                               mode=["regular"], confdir=self._confdir)
        master = Master(opts, event_loop=asyncio.get_running_loop())
        # only what an egress proxy needs: every add-on is called on every event of every
        # flow, and mitmproxy's default set (replay, maps, cookies, saving...) is ~30 of them
        master.addons.add(self.addon, core.Core(), proxyserver.Proxyserver(),
                          next_layer.NextLayer(), tlsconfig.TlsConfig(),
                          disable_h2c.DisableH2C())
        opts.update(
            ssl_insecure=False, http2=True, websocket=True, upstream_cert=False,
            connection_strategy="eager", rawtcp=False, validate_inbound_headers=True,
            normalize_outbound_headers=True, stream_large_bodies="1m",
            # the CA the upstreams are verified against: the system's (tests name their own)
            ssl_verify_upstream_trusted_ca=self.upstream_ca,
        )
        self._master = master
        self._task = asyncio.get_running_loop().create_task(master.run())
        ps = master.addons.get("proxyserver")
        deadline = time.monotonic() + 20
        while True:
            if self._task.done():
                self._task.result()
                raise RuntimeError("mitmproxy stopped while starting")
            addrs = [a for s in ps.servers for a in s.listen_addrs]
            if addrs and ps.is_running:
                self.port = int(addrs[0][1])
                return self.port
            if time.monotonic() > deadline:
                raise RuntimeError("mitmproxy did not start listening in 20 s")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._master is not None:
            self._master.shutdown()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)
        # mitmproxy's own throw-away CA and the DH parameters: never used, not kept
        shutil.rmtree(self._confdir, ignore_errors=True)
