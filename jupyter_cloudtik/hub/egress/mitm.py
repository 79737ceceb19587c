"""The egress proxy on mitmproxy: the server wiring (``MitmEgressProxy``) of our add-on.

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

The parts: ``addon.py`` (the add-on: these decisions, hook by hook), ``targets.py`` (what a
request names, the head checks, error responses), ``fairness.py`` (per-client shares and
the event loop's fair reads), ``http1.py`` (bounds on mitmproxy's HTTP/1 layer) and this
module, which starts mitmproxy with only the add-ons an egress proxy needs.

It runs in its own interpreter (mitmproxy pins versions the project's environment cannot
take, see docs/hub-egress.md) and imports nothing of jupyter_cloudtik but this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import tempfile
import time
from pathlib import Path

from mitmproxy import options
from mitmproxy.addons import core, disable_h2c, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master
from mitmproxy.proxy import server as mitm_server
from mitmproxy.proxy.mode_servers import ServerInstance

from .addon import EgressAddon
from .ca import DeploymentCA
from .fairness import fair_reads
from .http1 import bound_http1_heads
from .proxy import Limits, ProxyConfig

__all__ = ["EgressAddon", "MitmEgressProxy", "system_ca_file"]

_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                   "/etc/ssl/cert.pem")


def system_ca_file() -> str | None:
    """The operating system's CA bundle (not certifi's copy): what upstreams are verified
    against unless a test names its own."""
    paths = ssl.get_default_verify_paths()
    for c in (paths.cafile, paths.openssl_cafile, *_SYSTEM_BUNDLES):
        if c and Path(c).is_file():
            return c
    return None


class MitmEgressProxy:
    """Same surface as ``EgressProxy``: ``await start()``, ``set_config()``, ``await stop()``.

    With ``listen=False`` (a worker of the front, ``front.py``) it opens no port: the
    connections it serves are handed to ``adopt`` by the front, with the bytes the front
    has read of them already."""

    def __init__(self, ca: DeploymentCA, *, host: str = "127.0.0.1", port: int = 0,
                 upstream_ca_bundle: str | None = None, limits: Limits | None = None,
                 listen: bool = True) -> None:
        self.ca = ca
        self.host = host
        self.requested_port = port
        self.listen = listen
        self._instance: ServerInstance | None = None
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
                               mode=["regular"], confdir=self._confdir, server=self.listen)
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
        if not self.listen:
            # a regular-mode server that never listens: the front hands it connections
            self._instance = ServerInstance.make("regular", ps)
            while not ps.is_running:
                if self._task.done():
                    self._task.result()
                    raise RuntimeError("mitmproxy stopped while starting")
                if time.monotonic() > deadline:
                    raise RuntimeError("mitmproxy did not start in 20 s")
                await asyncio.sleep(0.01)
            return 0
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

    @property
    def open_connections(self) -> int:
        if self._master is None:
            return 0
        return len(self._master.addons.get("proxyserver").connections)

    async def adopt(self, sock: socket.socket, head: bytes) -> None:
        """Serve a connection the front accepted, whose first bytes (``head``) it has read
        already: they are handled first, as if they had just arrived."""
        assert self._instance is not None, "adopt() is for a proxy started with listen=False"
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        if head:
            reader.feed_data(head)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            sock.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._instance.handle_stream(reader, writer)

    async def stop(self) -> None:
        if self._master is not None:
            self._master.shutdown()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)
        # mitmproxy's own throw-away CA and the DH parameters: never used, not kept
        shutil.rmtree(self._confdir, ignore_errors=True)
