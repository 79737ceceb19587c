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
import shutil
import socket
import time
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


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("egress-fair")
    loop = asyncio.new_event_loop()
    with ef.upstreams(tmp) as (http_port, abuse_port, tls_port, upstream_ca), \
            ef.name_server() as dns_ip:
        python = ef.resolving_python(tmp, dns_ip, egress_python())
        sup = EgressSupervisor(tmp / "state", upstream_ca_bundle=str(upstream_ca),
                               no_proxy="", deny_networks=[], python=python)
        loop.run_until_complete(sup.start())
        try:
            clients, rules, setup = ef.configure(http_port, abuse_port, tls_port)
            loop.run_until_complete(sup.update(clients, rules))
            setup.proxy_port = sup.port
            setup.log = sup.log_path  # type: ignore[attr-defined]
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
    with ef.abuse(kind, fair, seconds=60):
        lat, failed = ef.normal_latencies(fair, 60)
    assert failed == 0, f"{failed} of 60 honest requests failed during {kind}"
    assert ef.pct(lat, .99) < BOUND_MS, f"during {kind}: {ef.summary(lat)}"
    log = Path(fair.log).read_text(errors="replace")
    assert "Traceback" not in log


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
