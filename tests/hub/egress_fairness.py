"""What the fairness tests and the benchmark share (issue 27): a name server that answers
slowly for the names we choose, a proxy process that resolves through it, loopback
upstreams, one honest client and the abuses another client runs.

Name resolution is the proxy's real one (libc ``getaddrinfo`` in the proxy's threads):
the proxy process runs in a mount namespace of its own (``unshare -m``) whose
``/etc/resolv.conf`` names our server on a random ``127.x.y.z`` port 53; nothing else on
the machine sees it.  ``*.fast.test`` answers at once, ``*.slow.test`` after
``SLOW_SECONDS``; both name 127.0.0.1 (the proxy runs with an empty deny list).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import random
import shutil
import socketserver
import ssl
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from cloudtik_emulators.upstreams import make_test_ca

SLOW_SECONDS = 8.0
ABUSES = ("slow-names", "tiny-chunk-upload", "slow-body", "many-connections", "slow-tls")


def available() -> str | None:
    """None if a private resolv.conf can be given to the proxy here, else why not."""
    if os.geteuid() != 0:
        return "needs root (a mount namespace for the proxy's resolv.conf)"
    if shutil.which("unshare") is None:
        return "needs util-linux unshare"
    try:
        import dns.message  # noqa: F401
    except ImportError:
        return "needs dnspython"
    return None


class _DNSHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        import dns.message
        import dns.rcode
        import dns.rdatatype
        import dns.rrset

        data, sock = self.request
        try:
            q = dns.message.from_wire(data)
        except Exception:
            return
        resp = dns.message.make_response(q)
        question = q.question[0]
        name = question.name.to_text().lower().rstrip(".")
        if name.endswith(".slow.test"):
            time.sleep(SLOW_SECONDS)
        if name.endswith((".slow.test", ".fast.test")):
            if question.rdtype == dns.rdatatype.A:
                resp.answer.append(dns.rrset.from_text(question.name, 1, "IN", "A",
                                                       "127.0.0.1"))
        else:
            resp.set_rcode(dns.rcode.NXDOMAIN)
        with contextlib.suppress(OSError):
            sock.sendto(resp.to_wire(), self.client_address)


class _DNSServer(socketserver.ThreadingUDPServer):
    daemon_threads = True
    allow_reuse_address = True


def _bind_name_server() -> tuple[_DNSServer, str]:
    for _ in range(20):
        ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        try:
            srv = _DNSServer((ip, 53), _DNSHandler)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("no free 127.x.y.z:53 for the test name server")
    return srv, ip


def _world_main(conn, what: str, chain: str | None) -> None:
    """A process of its own for the name server or an upstream: their threads must not
    take the measuring client's interpreter (its GIL) or each other's."""
    if what == "dns":
        srv, ip = _bind_name_server()
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        conn.send(ip)
    else:
        srv = serve(Path(chain) if chain else None)
        conn.send(srv.server_address[1])
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


@contextlib.contextmanager
def _world(what: str, chain: Path | None = None) -> Iterator[object]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_world_main, args=(child, what, str(chain) if chain else None),
                       daemon=True)
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError(f"the test {what} process did not start")
        yield parent.recv()
    finally:
        proc.kill()
        proc.join(10)


@contextlib.contextmanager
def name_server() -> Iterator[str]:
    """A DNS server on a random 127.x.y.z:53 (in a process of its own); yields its
    address."""
    with _world("dns") as ip:
        yield str(ip)


def resolving_python(directory: Path, dns_ip: str, python: str) -> str:
    """An interpreter wrapper that runs ``python`` with ``/etc/resolv.conf`` naming
    ``dns_ip`` (its own mount namespace: the machine's file is untouched)."""
    resolv = directory / "resolv.conf"
    resolv.write_text(f"nameserver {dns_ip}\noptions timeout:30 attempts:1\n")
    wrapper = directory / "python-with-test-dns"
    wrapper.write_text("#!/bin/sh\nexec unshare -m -- /bin/sh -c "
                       "'mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"' "
                       f"'{resolv}' '{python}' \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        # a sink: reads whatever body comes (chunked or not) until the connection ends
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.settimeout(60)
            while self.rfile.read1(65536):
                pass

    def log_message(self, *args) -> None:
        pass


def serve(chain: Path | None = None) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    srv.daemon_threads = True
    srv.request_queue_size = 1024
    if chain is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(chain)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@dataclass
class Setup:
    proxy_port: int
    http_port: int        # the honest client's upstream
    abuse_port: int       # the abuser's
    tls_port: int
    normal: tuple[str, str]   # user, token
    abuser: tuple[str, str]


def configure(http_port: int, abuse_port: int, tls_port: int
              ) -> tuple[list[dict], list[dict], Setup]:
    normal = ("normal", uuid.uuid4().hex)
    abuser = ("abuser", uuid.uuid4().hex)
    clients = [{"user": u, "token": t} for u, t in (normal, abuser)]
    rules = [{"id": "fair-http", "host": "*.fast.test", "port": http_port,
              "header": "Authorization", "value": "Bearer " + uuid.uuid4().hex,
              "users": ["normal"]},
             {"id": "fair-abuse", "host": "*.fast.test", "port": abuse_port,
              "header": "Authorization", "value": "Bearer " + uuid.uuid4().hex,
              "users": ["abuser"]},
             {"id": "fair-tls", "host": "127.0.0.1", "port": tls_port,
              "header": "Authorization", "value": "Bearer " + uuid.uuid4().hex,
              "users": ["abuser"]},
             # the honest client's TLS set-ups are intercepted too (test_same_host_users)
             {"id": "fair-tls-normal", "host": "127.0.0.1", "port": tls_port,
              "header": "Authorization", "value": "Bearer " + uuid.uuid4().hex,
              "users": ["normal"]}]
    return clients, rules, Setup(0, http_port, abuse_port, tls_port, normal, abuser)


def _auth(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def normal_latencies(setup: Setup, n: int, *, timeout: float = 30) -> tuple[list[float], int]:
    """``n`` sequential keep-alive GETs of the honest client, each to a new name (a real
    look-up each time): (latencies in ms, failures)."""
    s = requests.Session()
    s.trust_env = False
    proxy = f"http://{setup.normal[0]}:{setup.normal[1]}@127.0.0.1:{setup.proxy_port}"
    s.proxies = {"http": proxy}
    out, failed = [], 0
    tag = uuid.uuid4().hex[:8]
    for i in range(n):
        url = f"http://n{i}-{tag}.fast.test:{setup.http_port}/x"
        t = time.perf_counter()
        try:
            r = s.get(url, timeout=timeout)
            ok = r.status_code == 200
        except requests.RequestException:
            ok = False
        out.append((time.perf_counter() - t) * 1000)
        failed += not ok
    s.close()
    return out, failed


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


# -- abuses (run in a process of their own, so they do not share our interpreter) ----------
async def _open(setup: Setup) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", setup.proxy_port)


async def _slow_names(setup: Setup, stop: float) -> None:
    auth = _auth(*setup.abuser)

    async def one(i: int) -> None:
        k = 0
        while time.monotonic() < stop:
            k += 1
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                r, w = await _open(setup)
                host = f"a{i}-{k}-{uuid.uuid4().hex[:6]}.slow.test:{setup.abuse_port}"
                w.write(f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n"
                        f"Proxy-Authorization: {auth}\r\n\r\n".encode())
                await asyncio.wait_for(r.read(1024), 30)
                w.close()
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one(i) for i in range(48)))


async def _tiny_chunks(setup: Setup, stop: float) -> None:
    auth = _auth(*setup.abuser)
    block = b"1\r\nx\r\n" * 10000

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                _r, w = await _open(setup)
                host = f"u{i}.fast.test:{setup.abuse_port}"
                w.write(f"POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\n"
                        f"Proxy-Authorization: {auth}\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n".encode())
                while time.monotonic() < stop:
                    w.write(block)
                    await asyncio.wait_for(w.drain(), 30)
                w.close()

    await asyncio.gather(*(one(i) for i in range(4)))


async def _slow_body(setup: Setup, stop: float) -> None:
    auth = _auth(*setup.abuser)

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                _r, w = await _open(setup)
                host = f"b{i}.fast.test:{setup.abuse_port}"
                w.write(f"POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\n"
                        f"Proxy-Authorization: {auth}\r\n"
                        "Content-Length: 1000000\r\n\r\n".encode())
                while time.monotonic() < stop:
                    w.write(b"x")
                    await asyncio.wait_for(w.drain(), 30)
                    await asyncio.sleep(0.2)
                w.close()

    await asyncio.gather(*(one(i) for i in range(100)))


async def _many_connections(setup: Setup, stop: float) -> None:
    auth = _auth(*setup.abuser)
    host = f"m.fast.test:{setup.abuse_port}"
    req = (f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n"
           f"Proxy-Authorization: {auth}\r\n\r\n").encode()

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            try:
                r, w = await _open(setup)
                while time.monotonic() < stop:
                    w.write(req)
                    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
                    if b" 200 " not in head.split(b"\r\n", 1)[0]:
                        break
                    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await r.readexactly(n)
                w.close()
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, IndexError,
                    ValueError, asyncio.LimitOverrunError):
                await asyncio.sleep(0.05)

    await asyncio.gather(*(one(i) for i in range(400)))


async def _slow_tls(setup: Setup, stop: float) -> None:
    auth = _auth(*setup.abuser)
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64)

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                r, w = await _open(setup)
                w.write(f"CONNECT 127.0.0.1:{setup.tls_port} HTTP/1.1\r\n"
                        f"Host: 127.0.0.1:{setup.tls_port}\r\n"
                        f"Proxy-Authorization: {auth}\r\n\r\n".encode())
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
                if b" 200 " in head:
                    for b in hello:
                        if time.monotonic() >= stop:
                            break
                        w.write(bytes([b]))
                        await asyncio.wait_for(w.drain(), 30)
                        await asyncio.sleep(0.5)
                w.close()
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one(i) for i in range(100)))


async def _preauth_idle(setup: Setup, stop: float) -> None:
    """3,000 connections that never send a byte (nobody's yet: no credentials), renewed
    as the proxy closes them."""

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                r, w = await _open(setup)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(r.read(1), max(0.1, stop - time.monotonic()))
                w.close()
            await asyncio.sleep(0.05)

    await asyncio.gather(*(one(i) for i in range(3000)))


_RUNNERS = {"preauth-idle": _preauth_idle, "slow-names": _slow_names,
            "tiny-chunk-upload": _tiny_chunks, "slow-body": _slow_body,
            "many-connections": _many_connections,
            "slow-tls": _slow_tls}


def _abuse_main(kind: str, setup: Setup, seconds: float) -> None:
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(Exception):
        asyncio.run(asyncio.wait_for(_RUNNERS[kind](setup, time.monotonic() + seconds),
                                     seconds + 40))


@contextlib.contextmanager
def abuse(kind: str, setup: Setup, seconds: float) -> Iterator[None]:
    """Another client runs ``kind`` during the block (at most ``seconds``; started 1.5 s
    before the block, killed when it ends)."""
    proc = multiprocessing.get_context("spawn").Process(
        target=_abuse_main, args=(kind, setup, seconds), daemon=True)
    proc.start()
    time.sleep(1.5)  # let the abuse build up
    try:
        yield
    finally:
        proc.kill()
        proc.join(10)


@contextlib.contextmanager
def cpu_burners(n: int = 2) -> Iterator[None]:
    """``n`` processes spinning on the CPU (a loaded machine)."""
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def summary(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs):.1f} ms p99 {pct(xs, .99):.1f} ms max {max(xs):.1f} ms"


@contextlib.contextmanager
def upstreams(directory: Path) -> Iterator[tuple[int, int, int, Path]]:
    """(honest client's HTTP port, abuser's HTTP port, abuser's TLS port, the TLS CA): each
    upstream in a process of its own, so the abuser's load on its upstream is not the
    honest client's (different users' upstreams are different servers)."""
    ca, _ctx = make_test_ca(directory)
    chain = directory / "upstream-leaf.pem"  # make_test_ca's leaf key and chain
    with _world("http") as honest, _world("http") as abused, _world("tls", chain) as tls:
        yield int(honest), int(abused), int(tls), ca
