"""The egress proxy's mitmproxy add-on: our rules, identities, deny list and per-client
limits applied to mitmproxy's flows (see ``mitm.py`` for what it decides and why).

By hook: ``http_connect`` (who, where, intercepted or a blind tunnel), ``next_layer`` and
``tls_clienthello`` (interception only for TLS to the CONNECT host), ``server_connect``
(resolve, deny networks, connect to the checked address), ``requestheaders`` (credentials
of the matching rules, on the strictest reading of the request), ``responseheaders`` and
``response`` (no injected value comes back), plus the connection bookkeeping that bounds
what one client may hold (``fairness.py``)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ipaddress
import logging
import re
import socket
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from mitmproxy import certs, connection, ctx, http
from mitmproxy.proxy import layer, layers
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.tls import ClientHelloData

from .ca import DeploymentCA
from .fairness import OVER_LIMIT_DELAY, ClientShare, FairLoop
from .proxy import EGRESS_HEADER, Identity, Limits, ProxyConfig
from .rules import Decision, Rule, normalize_host
from .scrub import REFLECTING_METHODS, BodyScrubber, decoder_for, needles, scrub
from .targets import (
    TLS_PORT,
    Refused,
    check_head,
    error_response,
    format_authority,
    parse_authority,
    same_origin,
    valid_host,
)

__all__ = ["EgressAddon"]

log = logging.getLogger("jupyter_cloudtik.egress")

_USERINFO = re.compile(r"://[^/]*@")


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



class EgressAddon:
    """Rules, identities and the deny list, applied to mitmproxy's flows."""

    def __init__(self, ca: DeploymentCA, limits: Limits) -> None:
        self.ca = ca
        self.limits = limits
        self.config = ProxyConfig()
        self.conns: weakref.WeakKeyDictionary[connection.Client, _Conn] = \
            weakref.WeakKeyDictionary()
        self.clients: dict[str, ClientShare] = {}
        # connections not authenticated yet, per peer address, oldest first
        self._preauth: dict[str, collections.OrderedDict[connection.Client, None]] = {}
        self.fair = FairLoop(self)
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

    def claimed_user(self, head: bytes) -> str | None:
        """The user whose valid credentials the start of a request head carries
        (``ProxyConfig.claimed``).  Only where a connection's first read queues
        (``FairLoop.pace_key``); the request itself is authenticated again by its hook."""
        ident = self.config.claimed(head)
        return ident.user if ident is not None else None

    def client(self, key: str) -> ClientShare:
        cl = self.clients.get(key)
        if cl is None:
            cl = self.clients[key] = ClientShare(self.limits)
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
            flow.response = error_response(407, "proxy credentials missing or invalid",
                                   {"Proxy-Authenticate": 'Basic realm="jupyter_cloudtik egress"'})
            self._log(None, "CONNECT", "-", 407, (), started)
            return
        try:
            host, port = valid_host(flow.request.host), flow.request.port
            authority = flow.request.authority or ""
            if authority and parse_authority(authority, port) != (host, port):
                raise Refused(400, "malformed CONNECT authority")
            hh = flow.request.headers.get_all("host")
            if len(hh) > 1 or (hh and not same_origin(hh[0], host, port)):
                raise Refused(400, "Host header differs from the CONNECT authority")
        except Refused as e:
            flow.response = error_response(e.status, e.text)
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
            flow.response = error_response(e.status, e.text)
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
                if len(hh) > 1 or (hh and not same_origin(hh[0], host, port)):
                    raise Refused(400, "Host header differs from the CONNECT host")
                if req.authority and not same_origin(req.authority, host, port):
                    raise Refused(400, "request authority differs from the CONNECT host")
            else:
                ident = self._authenticate(flow)
                if ident is None:
                    flow.response = error_response(
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
                host, port = valid_host(req.host), req.port
                if not 0 < port < 65536:
                    raise Refused(400, "invalid port in request target")
            check_head(req)
            if not tls and await self._denied(st.key, host, port):
                raise Refused(403, f"{host}:{port} is in a network the egress proxy does "
                              "not reach")
        except Refused as e:
            flow.response = error_response(e.status, e.text)
            self._log(ident, req.method[:20], "-", e.status, (), started,
                      mode=flow.metadata["egress_mode"], note=e.text)
            return
        flow.metadata["egress_user"] = ident.name
        for name in [k for k in req.headers if k.lower().startswith("proxy-")]:
            del req.headers[name]
        if not tls:
            # the upstream routes by Host: it names the host the rules were matched for
            req.headers["Host"] = format_authority(host, port, 80)
        flow.metadata["egress_url"] = self._url(tls, host, port, req.path)
        try:
            rules, skipped = self._rules_for(req, ident, tls, host, port)
        except Refused as e:
            flow.response = error_response(e.status, e.text)
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

