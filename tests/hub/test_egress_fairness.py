"""Attack suite, fairness (issue 27, points 3 and 4): one client misbehaves, the other is
still served.

A real proxy process under its supervisor resolves names with libc through a name server
this test runs (tests/hub/egress_fairness.py: ``*.slow.test`` answers after 8 s); a second
client ("abuser", in a process of its own) floods slow names, uploads in one-byte chunks,
dribbles bodies, opens hundreds of connections, or dribbles TLS ClientHellos, while the
honest client makes sequential keep-alive GETs, each to a new name (a real look-up).  The
honest requests must all succeed and stay well under a few seconds (the strict 2x of the
quiet p99 is shown by ``benchmarks/egress_proxy.py``; here a margin keeps a loaded CI
machine from failing the test).  Before issue 27 the slow names alone held honest requests
up to 15 s and failed some with 502.
"""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import socket
import ssl
import time
import uuid
from pathlib import Path

import egress_fairness as ef
import pytest

from jupyter_cloudtik.hub.egress import EgressSupervisor
from jupyter_cloudtik.hub.egress.supervisor import egress_python

pytestmark = [pytest.mark.skipif(ef.available() is not None, reason=ef.available() or ""),
              pytest.mark.slow]

# an honest GET under abuse: its quiet p99 is tens of ms on the shared 2-core machine; before
# issue 27 the abuses held honest requests 15-30 s or failed them.  A few seconds of margin:
# the first request of a phase (a new connection while the abuse starts) has taken ~3 s
# when other test runs loaded the machine (load average 12-15)
BOUND_MS = 5000


_RUN: dict = {}


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("egress-fair")
    loop = asyncio.new_event_loop()
    with ef.upstreams(tmp) as (http_port, abuse_port, tls_port, upstream_ca), \
            ef.name_server() as dns_ip:
        python = ef.resolving_python(tmp, dns_ip, egress_python())
        sup = EgressSupervisor(tmp / "state", upstream_ca_bundle=str(upstream_ca),
                               no_proxy="", deny_networks=[], python=python,
                               # idle clients forgotten soon (test_idle_clients_are_forgotten)
                               extra_args=["--client-forget-seconds", "2"])
        loop.run_until_complete(sup.start())
        try:
            clients, rules, setup = ef.configure(http_port, abuse_port, tls_port)
            loop.run_until_complete(sup.update(clients, rules))
            setup.proxy_port = sup.port
            setup.log = sup.log_path  # type: ignore[attr-defined]
            # not on setup: it is pickled for the abuser's process
            _RUN.update(sup=sup, loop=loop, clients=clients, rules=rules)
            yield setup
        finally:
            loop.run_until_complete(sup.stop())
            loop.close()
            shutil.rmtree(tmp, ignore_errors=True)


def test_names_resolve_through_the_test_server(fair):
    """The harness is real: the proxy's libc asks our server (a slow name takes its 8 s
    and the client gets 504 at the 5 s look-up bound; an unknown name is 502)."""
    _lat, failed = ef.normal_latencies(fair, 5)
    assert failed == 0
    s = socket.create_connection(("127.0.0.1", fair.proxy_port), timeout=30)
    auth = base64.b64encode(f"{fair.abuser[0]}:{fair.abuser[1]}".encode()).decode()
    host = f"probe-{time.time_ns()}.slow.test:{fair.http_port}"
    t = time.monotonic()
    s.sendall(f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n"
              f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
    head = b""
    while chunk := s.recv(4096):
        head += chunk
    took = time.monotonic() - t
    s.close()
    assert head.startswith(b"HTTP/1.1 504"), head[:200]
    assert b"look-up" in head
    assert 4 < took < 8, took


@pytest.mark.parametrize("kind", ef.ABUSES)
def test_another_client_is_served_while_one_abuses(fair, kind):
    # the abuse runs until the block ends; 3,000 connections open slowly on a loaded
    # machine (a clean-clone CI run took over 40 s to show the pre-auth limit)
    wait = 100 if kind == "preauth-idle" else 40
    with ef.abuse(kind, fair, seconds=wait + 30):
        lat, failed = ef.normal_latencies(fair, 60)
    assert failed == 0, f"{failed} of 60 honest requests failed during {kind}"
    assert ef.pct(lat, .99) < BOUND_MS, f"during {kind}: {ef.summary(lat)}"
    log = Path(fair.log).read_text(errors="replace")
    at = log.find("Traceback")
    assert at < 0, log[max(0, at - 600):at + 2400]


def test_keepalive_under_cpu_load_never_stalls(fair):
    """Issue 27 point 4: keep-alive GETs while two CPU burners keep the machine's cores
    busy; none above 2 s.  600 here (~30 s on the loaded machine); the benchmark runs the
    issue's 2,000 (``egress keepalive 2000 max X s``)."""
    import requests

    s = requests.Session()
    s.trust_env = False
    s.proxies = {"http": f"http://{fair.normal[0]}:{fair.normal[1]}@127.0.0.1:"
                         f"{fair.proxy_port}"}
    url = f"http://k.fast.test:{fair.http_port}/x"
    assert s.get(url, timeout=30).status_code == 200
    lat = []
    with ef.cpu_burners(2):
        for _ in range(600):
            t = time.perf_counter()
            r = s.get(url, timeout=30)
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200
    s.close()
    assert max(lat) < 2.0, f"slowest keep-alive GET {max(lat):.2f} s"


def _fresh_requests(fair, n: int, timed: bool = True) -> list[str]:
    """``n`` rounds of what an honest user on the same host does with new connections: a
    plain GET on a connection of its own, and a CONNECT whose TLS is intercepted (a TLS
    set-up slot) then a GET inside.  What went wrong, one line each."""
    auth = base64.b64encode(f"{fair.normal[0]}:{fair.normal[1]}".encode()).decode()
    ctx = ssl.create_default_context(cafile=str(_RUN['sup'].ca_cert_path))
    bad = []
    for i in range(n):
        host = f"f{i}-{uuid.uuid4().hex[:6]}.fast.test:{fair.http_port}"
        t = time.monotonic()
        with socket.create_connection(("127.0.0.1", fair.proxy_port), timeout=30) as s:
            s.sendall(f"GET http://{host}/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                      f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
            head = s.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                bad.append(f"plain GET {i}: {head[:120]!r}")
        # a first head on a new connection waits for its own user's turn, not for the
        # other user's reconnect churn from the same address (FairLoop.pace_key)
        took = (time.monotonic() - t) * 1000
        if timed and took > BOUND_MS:
            bad.append(f"plain GET {i} on a new connection took {took:.0f} ms")
        target = f"127.0.0.1:{fair.tls_port}"
        with socket.create_connection(("127.0.0.1", fair.proxy_port), timeout=30) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                      f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                bad.append(f"CONNECT {i}: {head[:120]!r}")
                continue
            with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
                t.sendall(f"GET /x HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n"
                          .encode())
                head = t.recv(4096)
                if not head.startswith(b"HTTP/1.1 200"):
                    bad.append(f"GET inside CONNECT {i}: {head[:120]!r}")
    return bad


@pytest.mark.parametrize("kind", ["many-connections", "slow-tls", "preauth-idle"])
def test_same_host_users_do_not_share_a_budget(fair, kind):
    """Every user server of a single-host hub connects from 127.0.0.1: one user's hundreds
    of connections (over its 256: 429s), its TLS set-ups (over its 4: 503s) or 3,000
    connections that never authenticate must not give another user on the same address a
    429, 503 or anything but its answers, on connections it opens fresh each time."""
    log = Path(fair.log)
    start = log.stat().st_size
    # the first head's turn is what FairLoop.pace_key decides, so its time is bounded; not
    # under preauth-idle, whose 3,000 sockets wait in the kernel's accept queue before the
    # proxy sees anyone (a new connection once took 5.3 s there on the loaded CI machine)
    timed = kind != "preauth-idle"
    # the abuse runs until the block ends; 3,000 connections open slowly on a loaded
    # machine (a clean-clone CI run took over 40 s to show the pre-auth limit)
    wait = 100 if kind == "preauth-idle" else 40
    with ef.abuse(kind, fair, seconds=wait + 30):
        bad = _fresh_requests(fair, 15, timed)
        # the abuse really went over the limits: 429s, 503s, or (pre-auth) its oldest
        # connections closed; honest rounds go on until it shows (a loaded machine opens
        # 3,000 connections slowly)
        sign = {"many-connections": "(limit client_connections)",
                "slow-tls": "(limit client_handshakes)",
                "preauth-idle": "(limit preauth_connections)"}[kind]
        deadline = time.monotonic() + wait
        while sign not in _since(log, start) and time.monotonic() < deadline:
            bad += _fresh_requests(fair, 1, timed)
    assert not bad, f"during {kind}: " + "; ".join(bad[:5])
    got = _since(log, start)
    assert sign in got, f"{kind} never reached its limit ({sign[1:-1]})"


def _since(log: Path, start: int) -> str:
    with log.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


def test_idle_clients_are_forgotten(fair):
    """The per-client table is bounded: 40 distinct users each make a request and leave;
    once idle (--client-forget-seconds 2 here) they are forgotten, and the table is back to
    the few clients still around."""
    extra = [{"user": f"passer{i}", "token": uuid.uuid4().hex} for i in range(40)]
    _RUN['loop'].run_until_complete(_RUN['sup'].update(_RUN['clients'] + extra, _RUN['rules']))
    log = Path(fair.log)
    start = log.stat().st_size
    for c in extra:
        auth = base64.b64encode(f"{c['user']}:{c['token']}".encode()).decode()
        host = f"p.fast.test:{fair.http_port}"
        with socket.create_connection(("127.0.0.1", fair.proxy_port), timeout=30) as s:
            s.sendall(f"GET http://{host}/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                      f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    forgotten, known = 0, None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        found = re.findall(r"forgot (\d+) idle client\(s\); (\d+) known", text)
        forgotten = sum(int(a) for a, _ in found)
        known = int(found[-1][1]) if found else None
        if forgotten >= 40 and known is not None and known <= 3:
            break
        time.sleep(0.5)
    assert forgotten >= 40 and known is not None and known <= 3, (forgotten, known)
