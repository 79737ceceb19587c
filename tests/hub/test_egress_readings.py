"""The egress proxy decides a path rule on what the upstream will serve, not on its own
reading; and no injected value comes back to the client.

Real upstreams: private nginx, Apache httpd and Tomcat instances (Debian's packages,
``cloudtik_emulators.path_servers``) that read the same bytes differently, behind the
real proxy (mitmproxy engine, its supervisor).  The attack paths are generated from the
building blocks of each known reading (docs/hub-egress.md, "Path rules: the readings
considered"); each is first sent to the servers directly, to know which ones they serve
from outside ``/api/`` (the test fails if none is: then it proves nothing), then through
the proxy with a rule for ``/api/``: no server may receive the secret for a path it serves
from outside, and the proxy says why it refused.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cloudtik_emulators import path_servers
from jupyter_cloudtik.hub.egress import EgressSupervisor

pytestmark = pytest.mark.skipif(not all(path_servers.available().values()),
                                reason="nginx-light, apache2 and tomcat10-user are installed "
                                       "by make test (scripts/install-system-deps.sh)")

SECRET = f"Bearer path-{uuid.uuid4().hex}"
TOKEN = f"tok-{uuid.uuid4().hex}"
CRED = base64.b64encode(f"alice:{TOKEN}".encode()).decode()

DOTS = [".", "%2e", "%2E", "%252e", "%c0%ae", "%u002e", "%ef%bc%8e"]
SEPARATORS = ["/", "%2f", "%2F", "\\", "%5c", "%5C", "%252f", "//"]
PARAMS = ["", ";", ";x=1"]


def attack_paths() -> list[str]:
    """Paths from ``/api/`` towards ``/admin/probe.txt``, one per combination of a reading's
    building blocks (bounded: every pair of dots, then every separator and parameter with
    the common dot-dots), and the odd ones out."""
    out = []
    for a, b in itertools.product(DOTS, DOTS):
        out.append(f"/api/{a}{b}/admin/probe.txt")
    for dd, sep, param in itertools.product(["..", ".%2e", "%2e%2e", "%c0%ae%c0%ae"],
                                            SEPARATORS, PARAMS):
        out.append(f"/api/{dd}{param}{sep}admin/probe.txt")
    out += ["/api/.../admin/probe.txt", "/api/.. /admin/probe.txt".replace(" ", "%20"),
            "/api/..%00/admin/probe.txt", "/api/x#/../../admin/probe.txt",
            "/api//../admin/probe.txt", "/api/./../admin/probe.txt",
            "/api;x/../admin/probe.txt", "/api/x/..;/..;/admin/probe.txt",
            "/api/%2e%2e%2fadmin/probe.txt", "/api/..%5cadmin/probe.txt",
            "/API/../admin/probe.txt", "/api/%2E%2E/admin/probe.txt"]
    return list(dict.fromkeys(out))


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _exchange(port: int, data: bytes, timeout: float = 15) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def _split(answer: bytes) -> tuple[int, bytes, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, head, body


def _via_proxy(env, port: int, method: str, path: str, extra: str = "") -> bytes:
    req = (f"{method} http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
           f"Proxy-Authorization: Basic {CRED}\r\n{extra}Connection: close\r\n\r\n")
    return _exchange(env["sup"].port, req.encode("latin-1"))


def _direct(port: int, path: str) -> bytes:
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    return _exchange(port, req.encode("latin-1"))


def _with_id(path: str, rid: str) -> str:
    # the id goes in the query, which every reading leaves alone
    return f"{path}{'&' if '?' in path else '?'}n={rid}"


class Reflector(BaseHTTPRequestHandler):
    """An upstream whose answers carry the request back in every form an echo takes:
    headers (raw and JSON in the body), percent- and base64-encoded, in a redirect, in a
    header of its own, gzip-encoded when asked."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        import gzip
        from urllib.parse import quote

        got = self.headers.get("X-Secret", "")
        body = json.dumps({"headers": dict(self.headers.items()), "q": quote(got, safe=""),
                           "b64": base64.b64encode(got.encode()).decode(),
                           "raw": got}).encode()
        if self.path.startswith("/api/gzip") or "gzip" in self.headers.get("X-Want", ""):
            body = gzip.compress(body)
            coding = "gzip"
        else:
            coding = ""
        self.send_response(302 if self.path.startswith("/api/redirect") else 200)
        self.send_header("Location", f"/login?next={got}")
        self.send_header("X-Echo", got)
        if coding:
            self.send_header("Content-Encoding", coding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("readings")
    servers = path_servers.start_all(base, SECRET)
    refl = ThreadingHTTPServer(("127.0.0.1", 0), Reflector)
    refl.daemon_threads = True
    threading.Thread(target=refl.serve_forever, daemon=True).start()
    loop = Loop()
    sup = EgressSupervisor(base / "state", no_proxy="", deny_networks=[])
    try:
        loop.run(sup.start())
        rules = [{"id": f"api-{s.name}", "host": "127.0.0.1", "port": s.port,
                  "path_prefix": "/api/", "header": "X-Secret", "value": SECRET,
                  "users": ["alice"]} for s in servers]
        rules.append({"id": "reflect", "host": "127.0.0.1", "port": refl.server_address[1],
                      "path_prefix": "/api/", "header": "X-Secret", "value": SECRET,
                      "users": ["alice"]})
        loop.run(sup.update([{"user": "alice", "token": TOKEN}], rules))
        yield {"sup": sup, "servers": servers, "reflector": refl.server_address[1]}
    finally:
        loop.run(sup.stop())
        loop.close()
        refl.shutdown()
        for s in servers:
            s.stop()


def _outside(seen, body: bytes) -> bool:
    if b"OUTSIDE" in body:
        return True
    return seen is not None and seen.path is not None and not seen.path.startswith("/api/")


def test_the_rule_applies_to_its_own_paths(env):
    """The control: without it, 'no secret reached the servers' would prove nothing."""
    for s in env["servers"]:
        rid = uuid.uuid4().hex
        status, head, body = _split(_via_proxy(env, s.port, "GET",
                                               _with_id("/api/probe.txt", rid)))
        assert status == 200 and b"INSIDE" in body, (s.name, head)
        assert s.seen(rid, wait=5).secret, s.name
        assert f"applied rule=api-{s.name}".encode() in head


def test_no_server_gets_the_secret_for_a_path_it_serves_from_outside(env):
    paths = attack_paths()
    escaping: dict[str, list[str]] = {s.name: [] for s in env["servers"]}
    direct = []
    for s in env["servers"]:
        for p in paths:
            rid = uuid.uuid4().hex
            _, _, body = _split(_direct(s.port, _with_id(p, rid)))
            direct.append((s, p, rid, body))
    time.sleep(1)  # servers log after they answer
    for s, p, rid, body in direct:
        if _outside(s.seen(rid), body):
            escaping[s.name].append(p)
    # the attacks are real: each server family serves some of them from outside /api/
    assert all(escaping.values()), {k: len(v) for k, v in escaping.items()}
    sent = []
    for s in env["servers"]:
        for p in paths:
            rid = uuid.uuid4().hex
            status, _, body = _split(_via_proxy(env, s.port, "GET", _with_id(p, rid)))
            sent.append((s, p, rid, status, body))
    time.sleep(1)
    leaks, unexplained = [], []
    for s, p, rid, status, body in sent:
        seen = s.seen(rid)
        if seen is not None and seen.secret and _outside(seen, body):
            leaks.append((s.name, p))
        refused = status == 400 and body.startswith(b"400 Bad Request: the path has")
        if p in escaping[s.name] and not refused and seen is not None and seen.secret:
            # served from outside when sent directly: through the proxy it is refused or
            # goes without the credential
            unexplained.append((s.name, p, status))
        if refused:
            assert f"api-{s.name}".encode() in body and seen is None, body
    assert leaks == [], leaks          # names of paths only: the secret is not printed
    assert unexplained == [], unexplained


def test_a_differently_cased_path_gets_no_credential(env):
    s = env["servers"][0]
    rid = uuid.uuid4().hex
    status, _, _ = _split(_via_proxy(env, s.port, "GET", _with_id("/API/probe.txt", rid)))
    assert status == 404 and not s.seen(rid, wait=5).secret


@pytest.mark.parametrize("method", ["TRACE", "TRACK", "trace"])
def test_reflecting_methods_are_refused_where_a_rule_applies(env, method):
    apache = next(s for s in env["servers"] if s.name == "apache")
    # Apache (TraceEnable on) reflects TRACE: sent directly, the header comes back
    status, _, body = _split(_exchange(apache.port, (
        f"TRACE /api/probe.txt HTTP/1.1\r\nHost: x\r\nX-Secret: {SECRET}\r\n"
        "Connection: close\r\n\r\n").encode()))
    assert status == 200 and SECRET.encode() in body
    for s in env["servers"]:
        rid = uuid.uuid4().hex
        answer = _via_proxy(env, s.port, method, _with_id("/api/probe.txt", rid))
        status, _, body = _split(answer)
        assert SECRET.encode() not in answer
        assert status == 405 and b"api-" + s.name.encode() in body, (s.name, status)
        seen = s.seen(rid)
        assert seen is None or not seen.secret


def test_trace_outside_any_rule_is_passed_on(env):
    """TRACE is refused only where a credential would be added."""
    apache = next(s for s in env["servers"] if s.name == "apache")
    status, _, body = _split(_via_proxy(env, apache.port, "TRACE", "/probe.txt?n=plain"))
    assert status == 200 and b"TRACE /probe.txt" in body and SECRET.encode() not in body


@pytest.mark.parametrize("path", ["/api/echo", "/api/redirect", "/api/gzip"])
def test_an_upstream_that_echoes_the_request_never_shows_the_secret(env, path):
    port = env["reflector"]
    answer = _via_proxy(env, port, "GET", path, extra="Accept-Encoding: gzip\r\n")
    status, head, _ = _split(answer)
    assert status in (200, 302), head
    forms = [SECRET, SECRET.replace(" ", "%20"), base64.b64encode(SECRET.encode()).decode()]
    for f in forms:
        assert f.encode() not in answer, path
    # the echo arrived, masked: the upstream did get the value, the client sees stars
    assert b"*" * len(SECRET) in answer
    if path == "/api/gzip":
        assert b"content-encoding" not in head.lower()  # decoded to be checked
