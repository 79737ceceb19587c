"""The egress proxy end to end: a real proxy process under its supervisor, real loopback
HTTP and HTTPS servers (the HTTPS ones with a test CA of their own), real clients (requests,
curl, raw sockets).  Nothing of the proxy is mocked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests
from cryptography import x509

from cloudtik_emulators.upstreams import make_test_ca as _test_ca
from cloudtik_emulators.upstreams import received
from cloudtik_emulators.upstreams import serve as _serve
from jupyter_cloudtik.core import ports
from jupyter_cloudtik.hub.egress import DeploymentCA, EgressSupervisor, Rule, RuleSet

SECRET = f"Bearer sekret-{uuid.uuid4().hex}"
SECRET_TLS = f"tls-sekret-{uuid.uuid4().hex}"
TOKEN_ALICE = f"tok-alice-{uuid.uuid4().hex}"
TOKEN_BOB = f"tok-bob-{uuid.uuid4().hex}"
ALL_SECRETS = (SECRET, SECRET_TLS, TOKEN_ALICE, TOKEN_BOB)

CLIENTS = [{"user": "alice", "token": TOKEN_ALICE, "groups": ["physics"]},
           {"user": "bob", "token": TOKEN_BOB, "groups": []}]


class Loop:
    """An asyncio loop in a thread: the supervisor lives there, the test talks sync."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("egress")
    ca_path, ctx = _test_ca(base)
    http_srv, _ = _serve(None)
    ruled_srv, _ = _serve(ctx)     # HTTPS with a rule: intercepted
    plain_srv, _ = _serve(ctx)     # HTTPS without a rule: tunnelled
    loop = Loop()
    sup = loop.run(_make_supervisor(base / "state", ca_path))
    try:
        yield {"base": base, "upstream_ca": ca_path, "http": http_srv.server_address[1],
               "ruled": ruled_srv.server_address[1], "plain": plain_srv.server_address[1],
               "sup": sup, "loop": loop}
    finally:
        pid = sup.pid
        loop.run(sup.stop())
        loop.close()
        for s in (http_srv, ruled_srv, plain_srv):
            s.shutdown()
            s.server_close()
        assert pid is None or not psutil.pid_exists(pid) or \
            psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        # every line the proxy ever logged, read at the very end
        log = sup.log_path.read_text()
        for s in ALL_SECRETS:
            assert s not in log, "a secret reached the proxy log"


async def _make_supervisor(state: Path, upstream_ca: Path) -> EgressSupervisor:
    # loopback upstreams: the test allows what production denies (see test_default_deny)
    sup = EgressSupervisor(state, upstream_ca_bundle=str(upstream_ca), no_proxy="",
                           deny_networks=["169.254.0.0/16"])
    await sup.start()
    return sup


def _rules(env, *extra: dict) -> list[dict]:
    return [
        {"id": "http-api", "host": "127.0.0.1", "port": env["http"], "path_prefix": "/api",
         "header": "Authorization", "value": SECRET, "users": ["alice"]},
        {"id": "tls-data", "host": "127.0.0.1", "port": env["ruled"],
         "header": "X-Data-Token", "value": SECRET_TLS, "groups": ["physics"]},
        *extra,
    ]


def _update(env, rules: list[dict], **kw) -> None:
    env["loop"].run(env["sup"].update(CLIENTS, rules, **kw))


def _session(env, user: str | None, token: str | None) -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # NO_PROXY/REQUESTS_CA_BUNDLE of the machine must not interfere
    if user is None:
        url = f"http://127.0.0.1:{env['sup'].port}"
    else:
        url = env["sup"].proxy_url_for(user, token)
    s.proxies = {"http": url, "https": url}
    return s


def _headers(resp: requests.Response) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in received(resp)["headers"]:
        out.setdefault(k.lower(), []).append(v)
    return out


# -- pure parts ----------------------------------------------------------------------------
def test_rule_validation_and_matching():
    r = Rule(id="r1", host="*.Example.org.", header="Authorization", value="Bearer xyz123",
             path_prefix="/api", owner="carol")
    assert "xyz123" not in repr(r) and "xyz123" not in str(r)
    assert "value" not in r.to_public() and r.to_public()["host"] == "*.example.org"
    assert r.matches_host("a.b.example.org", 443) and not r.matches_host("example.org", 443)
    assert not r.matches_host("badexample.org", 443)
    rs = RuleSet([r])
    assert rs.match("carol", [], "x.example.org", 443, "/api/v1?q=1") == [r]
    assert rs.match("carol", [], "x.example.org", 443, "/apix") == []
    # a dot segment could carry the credential out of its prefix: not matched
    assert rs.match("carol", [], "x.example.org", 443, "/api/../admin") == []
    assert rs.match("carol", [], "x.example.org", 443, "/api/%2e%2e/admin") == []
    assert rs.match("dave", [], "x.example.org", 443, "/api") == []   # owner only
    assert rs.match(None, [], "x.example.org", 443, "/api") == []     # not anonymous
    anyone = Rule(id="r2", host="data.org", header="X-K", value="v" * 9, users=["*"])
    assert RuleSet([anyone]).match(None, [], "data.org", 80, "/") == [anyone]
    for bad in ("Host", "Proxy-Authorization", "content-length", "Transfer-Encoding",
                "Connection"):
        with pytest.raises(ValueError, match=rf"field 'header' is '{bad}'"):
            Rule(id="x", host="a.org", header=bad, value="secret-value")
    with pytest.raises(ValueError, match="field 'header'"):
        Rule(id="x", host="a.org", header="Bad Header", value="secret-value")
    with pytest.raises(ValueError, match="field 'value'") as e:
        Rule(id="x", host="a.org", header="X-A", value="secret\r\nX-Evil: 1")
    assert "secret" not in str(e.value).replace("field 'value'", "")
    with pytest.raises(ValueError, match="unknown field"):
        Rule.from_dict({"id": "x", "host": "a.org", "header": "X-A", "value": "v", "hots": 1})
    with pytest.raises(ValueError, match="used twice"):
        RuleSet([anyone, anyone])


def test_deployment_ca_files(tmp_path):
    ca = DeploymentCA.load_or_create(tmp_path / "ca")
    assert (ca.key_path.stat().st_mode & 0o777) == 0o600
    assert (ca.cert_path.stat().st_mode & 0o777) == 0o644
    assert ca.key_path.stat().st_uid == os.geteuid()
    os.chmod(ca.key_path, 0o644)  # loosened by someone: tightened again on load
    again = DeploymentCA.load_or_create(tmp_path / "ca")
    assert again.cert.serial_number == ca.cert.serial_number  # reused, not regenerated
    assert (ca.key_path.stat().st_mode & 0o777) == 0o600
    bc = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca
    assert ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    leaf = ca.issue("10.1.2.3")
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert ca.server_context("a.org") is ca.server_context("A.org.")  # cached
    assert not list((tmp_path / "ca").glob(".leaf-*"))  # leaf keys never stay on disk


# -- through the proxy ---------------------------------------------------------------------
def test_http_injection_never_replaces_a_client_header(env):
    _update(env, _rules(env))
    base = f"http://127.0.0.1:{env['http']}"
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(f"{base}/api/items?x=1", timeout=10)
        assert r.status_code == 200
        h = _headers(r)
        assert h["authorization"] == [SECRET]          # injected
        assert "proxy-authorization" not in h
        assert r.json()["path"] == "/api/items?x=1"
        assert r.headers["X-CloudTik-Egress"] == "applied rule=http-api"
        # the client sent the header itself: its value goes out, the rule is not applied,
        # and the response says why
        r = s.get(f"{base}/api/items", headers={"Authorization": "mine"}, timeout=10)
        assert _headers(r)["authorization"] == ["mine"]
        assert r.headers["X-CloudTik-Egress"] == \
            "not-applied rule=http-api reason=client-sent-header"
        assert SECRET not in str(r.headers) and SECRET not in r.text
        deadline = time.monotonic() + 10
        while "not-applied=http-api(client-sent-header)" not in \
                env["sup"].log_path.read_text():
            assert time.monotonic() < deadline, "the proxy log does not say why"
            time.sleep(0.1)
        # outside the path prefix: nothing injected, the client's own header passes
        r = s.get(f"{base}/other", headers={"Authorization": "mine"}, timeout=10)
        assert _headers(r)["authorization"] == ["mine"]
        # bodies: Content-Length and chunked requests, chunked response, keep-alive reuse
        data = os.urandom(300_000)
        r = s.post(f"{base}/api/upload", data=data, timeout=10)
        assert r.json()["body_sha"] == hashlib.sha256(data).hexdigest()
        r = s.post(f"{base}/api/chunked", data=iter([data[:1000], data[1000:]]), timeout=10)
        assert r.json()["body_sha"] == hashlib.sha256(data).hexdigest()
        assert _headers(r)["transfer-encoding"] == ["chunked"]
        assert _headers(r)["authorization"] == [SECRET]
    with _session(env, "bob", TOKEN_BOB) as s:         # not in the rule's users
        r = s.get(f"{base}/api/items", timeout=10)
        assert r.status_code == 200 and "authorization" not in _headers(r)


def test_proxy_auth_required(env):
    _update(env, _rules(env))
    url = f"http://127.0.0.1:{env['http']}/api/x"
    for user, token in ((None, None), ("alice", "wrong-token-123"), ("bob", TOKEN_ALICE)):
        with _session(env, user, token) as s:
            r = s.get(url, timeout=10)
            assert r.status_code == 407
            assert r.headers["Proxy-Authenticate"].startswith("Basic")
            assert SECRET not in r.text
    with _session(env, "alice", "wrong-token-123") as s, pytest.raises(
            requests.exceptions.ProxyError):
        s.get(f"https://127.0.0.1:{env['ruled']}/", verify=str(env["upstream_ca"]),
              timeout=10)


def test_https_intercepted_for_ruled_host(env):
    _update(env, _rules(env))
    sup = env["sup"]
    url = f"https://127.0.0.1:{env['ruled']}/data/file.csv"
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(url, verify=str(sup.bundle_path), timeout=10)
        assert r.status_code == 200
        assert _headers(r)["x-data-token"] == [SECRET_TLS]
        r = s.get(url.replace("/data", "/chunked"), verify=str(sup.bundle_path), timeout=10)
        assert _headers(r)["x-data-token"] == [SECRET_TLS]
        # the certificate the client saw is ours, not the upstream's
        with pytest.raises(requests.exceptions.SSLError):
            s.get(url, verify=str(env["upstream_ca"]), timeout=10)
        # inside the interception too, a header the client sent is kept
        r = s.get(url, headers={"X-Data-Token": "alices-own"}, verify=str(sup.bundle_path),
                  timeout=10)
        assert _headers(r)["x-data-token"] == ["alices-own"]
        assert r.headers["X-CloudTik-Egress"] == \
            "not-applied rule=tls-data reason=client-sent-header"
    with _session(env, "bob", TOKEN_BOB) as s:   # not in group physics: a plain tunnel
        r = s.get(url, verify=str(env["upstream_ca"]), timeout=10)
        assert "x-data-token" not in _headers(r)


def test_https_tunnel_for_unruled_host(env):
    _update(env, _rules(env))
    url = f"https://127.0.0.1:{env['plain']}/x"
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(url, verify=str(env["upstream_ca"]), timeout=10)  # the real certificate
        assert r.status_code == 200 and "x-data-token" not in _headers(r)
        with pytest.raises(requests.exceptions.SSLError):
            s.get(url, verify=str(env["sup"].bundle_path), timeout=10)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_with_session_env(env):
    _update(env, _rules(env))
    sup = env["sup"]
    session_env = sup.session_env("alice", TOKEN_ALICE)
    assert session_env["NO_PROXY"] == ""
    bundle = Path(session_env["CURL_CA_BUNDLE"]).read_bytes()
    assert Path(sup.ca_cert_path).read_bytes() in bundle
    assert TOKEN_ALICE not in " ".join(session_env[k] for k in session_env
                                       if "PROXY" not in k.upper())
    run_env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    run_env.update(session_env)
    out = subprocess.run(["curl", "-sS", "--max-time", "10",
                          f"https://127.0.0.1:{env['ruled']}/curl"],
                         env=run_env, capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    got = {k.lower(): v for k, v in received(out.stdout)["headers"]}
    assert got["x-data-token"] == SECRET_TLS


def _raw_tunnel(env, port: int, cafile: Path | None = None) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10)
    cred = base64.b64encode(f"alice:{TOKEN_ALICE}".encode()).decode()
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Proxy-Authorization: Basic {cred}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1024)
        assert chunk, "proxy closed the CONNECT"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(cafile or env["upstream_ca"]))
    return ctx.wrap_socket(sock, server_hostname="127.0.0.1")


def _raw_get(tls: ssl.SSLSocket, path: str) -> dict:
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += tls.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ")[1])
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += tls.recv(65536)
    return received(body) if status == 200 else {"status": status, "text": body.decode()}


def test_hot_reload_adds_and_removes_rules_without_dropping_tunnels(env):
    _update(env, _rules(env))
    tunnel = _raw_tunnel(env, env["plain"])  # open across the reloads below
    try:
        assert _raw_get(tunnel, "/before")["path"] == "/before"
        extra = {"id": "plain-added", "host": "127.0.0.1", "port": env["plain"],
                 "header": "X-Added", "value": SECRET_TLS, "users": ["alice"]}
        _update(env, _rules(env, extra))
        url = f"https://127.0.0.1:{env['plain']}/now"
        with _session(env, "alice", TOKEN_ALICE) as s:
            r = s.get(url, verify=str(env["sup"].bundle_path), timeout=10)
            assert _headers(r)["x-added"] == [SECRET_TLS]
        _update(env, _rules(env))
        with _session(env, "alice", TOKEN_ALICE) as s:
            r = s.get(url, verify=str(env["upstream_ca"]), timeout=10)
            assert "x-added" not in _headers(r)
        # the tunnel opened before both reloads still carries requests
        assert _raw_get(tunnel, "/after")["path"] == "/after"
    finally:
        tunnel.close()
    # a bad config is refused (naming the field) and the running one stays
    with pytest.raises(ValueError, match="field 'header'"):
        _update(env, _rules(env, {"id": "bad", "host": "a.org", "header": "Host",
                                  "value": SECRET}))
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(f"http://127.0.0.1:{env['http']}/api/still", timeout=10)
        assert _headers(r)["authorization"] == [SECRET]


def test_anonymous_sessions_get_only_everyone_rules(env):
    everyone = {"id": "open-data", "host": "127.0.0.1", "port": env["http"],
                "path_prefix": "/open", "header": "X-Open-Key", "value": SECRET,
                "users": ["*"]}
    _update(env, _rules(env, everyone), allow_anonymous=True)
    try:
        with _session(env, None, None) as s:
            r = s.get(f"http://127.0.0.1:{env['http']}/open/x", timeout=10)
            assert _headers(r)["x-open-key"] == [SECRET]
            r = s.get(f"http://127.0.0.1:{env['http']}/api/x", timeout=10)
            assert "authorization" not in _headers(r)
    finally:
        _update(env, _rules(env), allow_anonymous=False)


def test_errors_are_http_statuses_without_secrets(env):
    dead_port = ports.free_port()
    dead = {"id": "dead", "host": "127.0.0.1", "port": dead_port, "header": "X-Dead",
            "value": SECRET, "users": ["alice"]}
    _update(env, _rules(env, dead))
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(f"http://127.0.0.1:{dead_port}/x", timeout=10)
        assert r.status_code == 502
        assert SECRET not in r.text and SECRET not in str(r.headers)
        # an intercepted upstream that refuses: 502 inside the TLS tunnel
        # (mitmproxy connects before it answers the CONNECT: the 502 is the CONNECT's)
        with pytest.raises(requests.exceptions.ProxyError, match="502") as e:
            s.get(f"https://127.0.0.1:{dead_port}/x", verify=str(env["sup"].bundle_path),
                  timeout=10)
        assert SECRET not in str(e.value)
    # an intercepted upstream whose certificate we do not trust: the HTTP server
    http_tls = {"id": "http-as-tls", "host": "127.0.0.1", "port": env["http"],
                "header": "X-T", "value": SECRET, "users": ["alice"]}
    _update(env, [http_tls])
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(f"https://127.0.0.1:{env['http']}/x", verify=str(env["sup"].bundle_path),
                  timeout=10)
        assert r.status_code == 502 and SECRET not in r.text
    # a request that is not a proxy request
    with socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 407")  # auth comes first
    cred = base64.b64encode(f"alice:{TOKEN_ALICE}".encode()).decode()
    with socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10) as sock:
        sock.sendall(f"GET /x HTTP/1.1\r\nHost: a.invalid\r\nProxy-Authorization: Basic "
                     f"{cred}\r\n\r\n".encode())
        # mitmproxy takes an origin-form target from its Host (the rules would match that
        # host, and that Host goes upstream): a.invalid does not resolve
        assert sock.recv(1024).split(b" ")[1] in (b"400", b"502")
    # limits: a head larger than max_header_bytes is refused, not buffered
    with socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10) as sock:
        sock.sendall(f"GET http://127.0.0.1:{env['http']}/ HTTP/1.1\r\n"
                     f"X-Big: {'a' * 70_000}\r\n\r\n".encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 431")
    # request smuggling shapes are refused
    with socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10) as sock:
        sock.sendall(f"POST http://127.0.0.1:{env['http']}/ HTTP/1.1\r\nContent-Length: 3"
                     f"\r\nTransfer-Encoding: chunked\r\nProxy-Authorization: Basic {cred}"
                     "\r\n\r\n0\r\n\r\n".encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 400")
    _update(env, _rules(env))


def test_default_deny_keeps_sessions_off_the_hub_host(env):
    sup = env["sup"]
    saved = sup.deny_networks
    sup.deny_networks = ["127.0.0.0/8", "::1/128", "169.254.0.0/16"]
    try:
        _update(env, _rules(env))
        with _session(env, "alice", TOKEN_ALICE) as s:
            r = s.get(f"http://127.0.0.1:{env['http']}/api/x", timeout=10)
            assert r.status_code == 403 and SECRET not in r.text
            with pytest.raises(requests.exceptions.ProxyError):
                s.get(f"https://127.0.0.1:{env['plain']}/", verify=str(env["upstream_ca"]),
                      timeout=10)
    finally:
        sup.deny_networks = saved
        _update(env, _rules(env))


def test_secrets_never_in_argv_or_environment(env):
    _update(env, _rules(env))
    proc = psutil.Process(env["sup"].pid)
    argv = " ".join(proc.cmdline())
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
    for s in ALL_SECRETS:
        assert s not in argv and s not in environ
    assert SECRET not in repr(env["sup"].rules) and SECRET not in str(env["sup"].rules[0])
    assert SECRET not in repr(env["sup"])
    # the CA key: made by the proxy, 0600, owned by the proxy's user, in no file sessions get
    key = env["sup"].dir / "ca" / DeploymentCA.KEY_NAME
    assert (key.stat().st_mode & 0o777) == 0o600 and key.stat().st_uid == proc.uids().effective
    assert b"PRIVATE KEY" not in env["sup"].bundle_path.read_bytes()


def test_killed_proxy_is_restarted_with_its_rules(env):
    _update(env, _rules(env))
    sup = env["sup"]
    old_pid, old_port, before = sup.pid, sup.port, sup.restarts
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while (sup.restarts == before or sup.pid == old_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sup.restarts == before + 1 and sup.pid != old_pid
    env["loop"].run(sup.wait_ready(20))
    assert sup.port == old_port  # sessions' proxy URLs stay valid
    with _session(env, "alice", TOKEN_ALICE) as s:
        r = s.get(f"http://127.0.0.1:{env['http']}/api/after-restart", timeout=10)
        assert _headers(r)["authorization"] == [SECRET]
        r = s.get(f"https://127.0.0.1:{env['ruled']}/x", verify=str(sup.bundle_path),
                  timeout=10)
        assert _headers(r)["x-data-token"] == [SECRET_TLS]


@pytest.mark.parametrize("tls", [False, True])
def test_websocket_gets_rule_headers(env, tls):
    """A WebSocket (ws:// and, intercepted, wss://) gets its rule headers on the upgrade
    request, then messages flow both ways."""
    from websockets.sync.client import connect
    from websockets.sync.server import serve

    seen: dict[str, list[tuple[str, str]]] = {}

    def echo(ws) -> None:
        seen["headers"] = list(ws.request.headers.raw_items())
        for msg in ws:
            ws.send(msg.upper())

    ctx = None
    if tls:  # the upstream's certificate is of the test CA the proxy trusts
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(env["base"] / "upstream-leaf.pem")
    with serve(echo, "127.0.0.1", 0, ssl=ctx) as server:
        port = server.socket.getsockname()[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        rule = {"id": "ws", "host": "127.0.0.1", "port": port, "header": "X-WS-Key",
                "value": SECRET, "users": ["alice"]}
        _update(env, _rules(env, rule))
        try:
            if tls:  # websockets tunnels through CONNECT: intercepted
                proxy = env["sup"].proxy_url_for("alice", TOKEN_ALICE)
                client_ctx = ssl.create_default_context(cafile=str(env["sup"].bundle_path))
                with connect(f"wss://127.0.0.1:{port}/ws", proxy=proxy, ssl=client_ctx,
                             open_timeout=10) as ws:
                    ws.send("hello")
                    assert ws.recv(timeout=10) == "HELLO"
            else:  # ws:// as a plain proxy request (absolute-form upgrade), frames by hand
                cred = base64.b64encode(f"alice:{TOKEN_ALICE}".encode()).decode()
                with socket.create_connection(("127.0.0.1", env["sup"].port),
                                              timeout=10) as sock:
                    sock.sendall(f"GET http://127.0.0.1:{port}/ws HTTP/1.1\r\n"
                                 f"Host: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n"
                                 "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                 f"Proxy-Authorization: Basic {cred}\r\n\r\n".encode())
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += sock.recv(4096)
                    assert head.startswith(b"HTTP/1.1 101")
                    mask = b"\x01\x02\x03\x04"
                    sock.sendall(b"\x81\x85" + mask + bytes(
                        c ^ mask[i % 4] for i, c in enumerate(b"hello")))
                    frame = head.split(b"\r\n\r\n", 1)[1]
                    while len(frame) < 7:
                        frame += sock.recv(4096)
                    assert frame[:7] == b"\x81\x05HELLO"
            got = {k.lower(): v for k, v in seen["headers"]}
            assert got["x-ws-key"] == SECRET
            assert "proxy-authorization" not in got
        finally:
            server.shutdown()
            _update(env, _rules(env))


def test_revoked_token_stops_an_open_intercepted_connection(env):
    _update(env, _rules(env))
    tls = _raw_tunnel(env, env["ruled"], env["sup"].bundle_path)  # intercepted: our CA
    try:
        got = _raw_get(tls, "/one")
        assert [v for k, v in got["headers"] if k.lower() == "x-data-token"] == [SECRET_TLS]
        env["loop"].run(env["sup"].update([c for c in CLIENTS if c["user"] != "alice"],
                                          _rules(env)))
        got = _raw_get(tls, "/two")
        assert got["status"] == 403 and SECRET_TLS not in got["text"]
    finally:
        tls.close()
        _update(env, _rules(env))


def test_http2_through_an_intercepted_ruled_host(env):
    """HTTP/2 end to end: the client speaks h2 to the proxy's interception, the proxy speaks
    h2 to the upstream, and the rule header arrives."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    from h2_upstream import H2Upstream

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(env["base"] / "upstream-leaf.pem")
    up = H2Upstream(ctx)
    rule = {"id": "h2", "host": "127.0.0.1", "port": up.port, "header": "X-H2-Key",
            "value": SECRET, "users": ["alice"]}
    _update(env, _rules(env, rule))
    try:
        verify = ssl.create_default_context(cafile=str(env["sup"].bundle_path))
        proxy = env["sup"].proxy_url_for("alice", TOKEN_ALICE)
        with httpx.Client(proxy=proxy, http2=True, verify=verify, trust_env=False,
                          timeout=10) as c:
            r = c.get(f"https://127.0.0.1:{up.port}/h2")
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            assert r.headers["x-cloudtik-egress"] == "applied rule=h2"
            got = dict(received(r)["headers"])
            assert got["x-h2-key"] == SECRET and "proxy-authorization" not in got
            # a client :authority naming another host is refused, nothing goes upstream
            n = len(up.requests)
            r = c.get(f"https://127.0.0.1:{up.port}/h2", headers={"host": "evil.test"})
            assert r.status_code == 400 and len(up.requests) == n
    finally:
        up.close()
        _update(env, _rules(env))


def test_upstreams_are_verified_against_the_system_trust_store(env, tmp_path):
    """Without a test bundle the proxy trusts the operating system's CAs only: the test CA
    of the loopback upstreams is not among them, so an intercepted request is refused."""
    loop = env["loop"]
    sup = EgressSupervisor(tmp_path / "state", no_proxy="", deny_networks=["169.254.0.0/16"])
    loop.run(sup.start())
    try:
        loop.run(sup.update(CLIENTS, _rules(env)))
        with requests.Session() as s:
            s.trust_env = False
            url = sup.proxy_url_for("alice", TOKEN_ALICE)
            s.proxies = {"http": url, "https": url}
            r = s.get(f"https://127.0.0.1:{env['ruled']}/x", verify=str(sup.bundle_path),
                      timeout=10)
            assert r.status_code == 502 and "certificate verify failed" in r.text.lower()
            assert SECRET_TLS not in r.text
    finally:
        loop.run(sup.stop())


@pytest.mark.parametrize("extra", [
    [("host", "evil.test")],                          # Host differing from :authority
    [("transfer-encoding", "chunked")],               # HTTP/1 framing inside HTTP/2
    [("connection", "keep-alive")],                   # connection-specific, banned in h2
    [("x-bad", "a\r\nInjected: 1")],                  # a line break in a value
])
def test_http2_attacks_on_an_intercepted_ruled_host(env, extra):
    """Raw HTTP/2 frames (the h2 library with its own checks off) that a well-behaved client
    never sends: none reaches the upstream with the secret, and the proxy keeps serving."""
    h2conn_mod = pytest.importorskip("h2.connection")
    import h2.config
    import h2.events
    from h2_upstream import H2Upstream

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(env["base"] / "upstream-leaf.pem")
    up = H2Upstream(ctx)
    rule = {"id": "h2", "host": "127.0.0.1", "port": up.port, "header": "X-H2-Key",
            "value": SECRET, "users": ["alice"]}
    _update(env, _rules(env, rule))
    try:
        sock = socket.create_connection(("127.0.0.1", env["sup"].port), timeout=10)
        cred = base64.b64encode(f"alice:{TOKEN_ALICE}".encode()).decode()
        sock.sendall(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n"
                     f"Proxy-Authorization: Basic {cred}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        cctx = ssl.create_default_context(cafile=str(env["sup"].bundle_path))
        cctx.set_alpn_protocols(["h2"])
        tls = cctx.wrap_socket(sock, server_hostname="127.0.0.1")
        assert tls.selected_alpn_protocol() == "h2"
        conn = h2conn_mod.H2Connection(h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "GET"), (":scheme", "https"),
                              (":authority", f"127.0.0.1:{up.port}"), (":path", "/atk"),
                              *extra], end_stream=True)
        tls.sendall(conn.data_to_send())
        outcome = None
        deadline = time.monotonic() + 10
        while outcome is None and time.monotonic() < deadline:
            try:
                data = tls.recv(65536)
            except (OSError, ssl.SSLError):
                data = b""
            if not data:
                outcome = "closed"
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    outcome = dict(ev.headers).get(b":status", b"?").decode()
                elif isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    outcome = "reset"
            with contextlib.suppress(Exception):
                tls.sendall(conn.data_to_send())
        tls.close()
        assert outcome in ("400", "reset", "closed"), outcome
        assert not any(k.lower() == "x-h2-key" for r in up.requests for k, _ in r)
        # the proxy still serves an honest HTTP/2 request with its secret
        httpx = pytest.importorskip("httpx")
        with httpx.Client(proxy=env["sup"].proxy_url_for("alice", TOKEN_ALICE), http2=True,
                          verify=ssl.create_default_context(cafile=str(env["sup"].bundle_path)),
                          trust_env=False, timeout=10) as c:
            r = c.get(f"https://127.0.0.1:{up.port}/honest")
            assert r.status_code == 200 and dict(received(r)["headers"])["x-h2-key"] == SECRET
    finally:
        up.close()
        _update(env, _rules(env))
