"""The egress proxy's front and its worker processes (issue 27, fair service): each user's
connections are served by a process of that user's, placed there only against that user's
valid token, and nothing the front read is lost on the way.  Written as an attacker on the
same host would try it: claim another user's worker, reuse a placed connection for another
user's credentials, kill a worker, outlast the cap.  A real proxy under its supervisor, a
real echo upstream that records what reached it."""

from __future__ import annotations

import base64
import http.client
import re
import signal
import socket
import time
import uuid

import psutil
import pytest

from cloudtik_emulators.upstreams import received
from cloudtik_emulators.upstreams import serve as _serve
from jupyter_cloudtik.hub.egress import EgressSupervisor
from tests.hub.test_egress import Loop

SECRET = f"Bearer wsekret-{uuid.uuid4().hex}"
TOKENS = {u: f"tok-{u}-{uuid.uuid4().hex}" for u in ("alice", "bob", "carol")}
CLIENTS = [{"user": u, "token": t, "groups": []} for u, t in TOKENS.items()]


@pytest.fixture()
def proxy(tmp_path):
    """A started proxy (``extra`` flags by indirect parametrisation) and an echo upstream
    with a rule for alice."""
    upstream, _ = _serve(None)
    port = upstream.server_address[1]
    loop = Loop()
    made = []

    def start(*extra: str) -> EgressSupervisor:
        sup = EgressSupervisor(tmp_path / f"state{len(made)}", no_proxy="",
                               deny_networks=["169.254.0.0/16"], extra_args=list(extra))
        loop.run(sup.start())
        made.append(sup)
        rules = [{"id": "alice-api", "host": "127.0.0.1", "port": port, "path_prefix": "/api",
                  "header": "Authorization", "value": SECRET, "users": ["alice"]}]
        loop.run(sup.update(CLIENTS, rules))
        return sup

    start.upstream = port  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for sup in made:
            loop.run(sup.stop())
            log = sup.log_path.read_text()
            assert SECRET not in log and not any(t in log for t in TOKENS.values())
        loop.close()
        upstream.shutdown()
        upstream.server_close()


def _head(port: int, path: str, user: str | None, token: str | None = None,
          extra: str = "") -> bytes:
    auth = ""
    if user is not None:
        cred = base64.b64encode(f"{user}:{token or TOKENS[user]}".encode()).decode()
        auth = f"Proxy-Authorization: Basic {cred}\r\n"
    return (f"GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"{auth}{extra}\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    r = http.client.HTTPResponse(sock)
    r.begin()
    return r.status, r.read()


# a refused request's line names no URL: the worker that answered 407
REFUSED = "user=- GET - status=407"


def _worker_of(sup: EgressSupervisor, path: str, timeout: float = 5.0) -> int:
    """The pid of the worker that logged a request for ``path`` (or the ``REFUSED`` line)."""
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(r"egress-worker\[(\d+)\] INFO .*" + re.escape(path),
                      sup.log_path.read_text())
        if m:
            return int(m.group(1))
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker logged {path}")
        time.sleep(0.05)


def _get(sup: EgressSupervisor, port: int, path: str, user: str | None,
         token: str | None = None) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", sup.port), timeout=10) as s:
        s.sendall(_head(port, path, user, token))
        return _answer(s)


def test_each_user_is_served_by_a_process_of_its_own(proxy):
    sup = proxy()
    port = proxy.upstream
    tag = uuid.uuid4().hex[:8]
    for user in ("alice", "bob"):
        status, _ = _get(sup, port, f"/api/{user}-{tag}", user)
        assert status == 200
    status, _ = _get(sup, port, f"/api/nobody-{tag}", None)
    assert status == 407
    alice, bob = (_worker_of(sup, f"/api/{u}-{tag}") for u in ("alice", "bob"))
    nobody = _worker_of(sup, REFUSED)
    assert len({alice, bob, nobody, sup.pid}) == 4, (alice, bob, nobody, sup.pid)
    children = {p.pid for p in psutil.Process(sup.pid).children()}
    assert {alice, bob, nobody} <= children
    # no secret in any process's command line or environment: configs go over pipes
    for pid in children | {sup.pid}:
        p = psutil.Process(pid)
        seen = " ".join(p.cmdline()) + " ".join(f"{k}={v}" for k, v in p.environ().items())
        assert SECRET not in seen and not any(t in seen for t in TOKENS.values())


def test_a_claim_without_the_token_and_a_placed_connection_reused_for_another_user(proxy):
    """The front places by credentials it checks; a worker knows its users' tokens only."""
    sup = proxy()
    port = proxy.upstream
    tag = uuid.uuid4().hex[:8]
    # alice's name with a wrong token: not alice's worker, a 407 from the shared one
    status, _ = _get(sup, port, f"/api/forged-{tag}", "alice", token="x" * 40)
    assert status == 407
    status, _ = _get(sup, port, f"/api/alice-{tag}", "alice")
    assert status == 200
    assert _worker_of(sup, REFUSED) != _worker_of(sup, f"/api/alice-{tag}")
    # a connection placed with bob's worker, then alice's valid credentials on it: bob's
    # worker does not know alice's token, so no request of hers (and no secret of her rule)
    # goes out on bob's connection
    with socket.create_connection(("127.0.0.1", sup.port), timeout=10) as s:
        s.sendall(_head(port, f"/api/bob-{tag}", "bob"))
        status, body = _answer(s)
        assert status == 200 and SECRET not in str(received(body)["headers"])
        s.sendall(_head(port, f"/api/alice-on-bobs-{tag}", "alice"))
        status, body = _answer(s)
        assert status == 407, body
    assert not re.search(rf"alice-on-bobs-{tag}\S* status=200", sup.log_path.read_text())


def test_bytes_read_with_the_first_head_are_served(proxy):
    """The front reads up to the end of the first head (often more: pipelined requests, a
    body in the same packet); all of it reaches the worker, in order."""
    sup = proxy()
    port = proxy.upstream
    tag = uuid.uuid4().hex[:8]
    body = b"b" * 3000
    auth = base64.b64encode(f"alice:{TOKENS['alice']}".encode()).decode()
    post = (f"POST http://127.0.0.1:{port}/api/post-{tag} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nProxy-Authorization: Basic {auth}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", sup.port), timeout=10) as s:
        s.sendall(post + _head(port, f"/api/second-{tag}", "alice"))
        status, got = _answer(s)
        rec = received(got)
        assert status == 200 and rec["method"] == "POST" and rec["body_len"] == len(body)
        assert ["Authorization", SECRET] in rec["headers"]
        status, got = _answer(s)
        assert status == 200 and received(got)["path"] == f"/api/second-{tag}"


def test_a_worker_that_dies_is_replaced_and_the_others_go_on(proxy):
    sup = proxy()
    port = proxy.upstream
    tag = uuid.uuid4().hex[:8]
    assert _get(sup, port, f"/api/a1-{tag}", "alice")[0] == 200
    assert _get(sup, port, f"/api/b1-{tag}", "bob")[0] == 200
    alice, bob = _worker_of(sup, f"/api/a1-{tag}"), _worker_of(sup, f"/api/b1-{tag}")
    psutil.Process(alice).send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "exited with code -9" not in sup.log_path.read_text():
        assert time.monotonic() < deadline, "the front did not see its worker die"
        time.sleep(0.05)
    assert _get(sup, port, f"/api/a2-{tag}", "alice")[0] == 200
    assert _get(sup, port, f"/api/b2-{tag}", "bob")[0] == 200
    assert _worker_of(sup, f"/api/a2-{tag}") not in (alice, bob)
    assert _worker_of(sup, f"/api/b2-{tag}") == bob
    # the shared worker too: heads without credentials are still answered (407), by a new one
    assert _get(sup, port, f"/api/n1-{tag}", None)[0] == 407
    shared = _worker_of(sup, REFUSED)
    psutil.Process(shared).send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while sup.log_path.read_text().count("exited with code -9") < 2:
        assert time.monotonic() < deadline, "the front did not see the shared worker die"
        time.sleep(0.05)
    assert _get(sup, port, f"/api/n2-{tag}", None)[0] == 407
    pids = set(re.findall(r"egress-worker\[(\d+)\] INFO " + re.escape(REFUSED),
                          sup.log_path.read_text()))
    assert len(pids) == 2 and str(shared) in pids, pids
    assert _get(sup, port, f"/api/b3-{tag}", "bob")[0] == 200


def test_idle_workers_end_and_users_share_past_the_cap(proxy):
    sup = proxy("--workers", "1", "--client-forget-seconds", "1")
    port = proxy.upstream
    tag = uuid.uuid4().hex[:8]
    for user in ("alice", "bob", "carol"):
        assert _get(sup, port, f"/api/{user}-{tag}", user)[0] == 200
    pids = {_worker_of(sup, f"/api/{u}-{tag}") for u in ("alice", "bob", "carol")}
    assert len(pids) == 1, pids  # one worker allowed: the three users share it
    (shared,) = pids
    # held by nobody for --client-forget-seconds: it ends, and the front forgets them
    deadline = time.monotonic() + 15
    while psutil.pid_exists(shared) and psutil.Process(shared).status() != \
            psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "an idle worker was not ended"
        time.sleep(0.1)
    assert "3 idle client(s); 0 known (their egress worker ended)" in sup.log_path.read_text()
    assert _get(sup, port, f"/api/again-{tag}", "alice")[0] == 200
    assert _worker_of(sup, f"/api/again-{tag}") != shared
