"""Added latency and throughput of the egress proxy, against going direct.

A real proxy process under its supervisor, loopback HTTP and HTTPS upstreams (the HTTPS one
with a CA of its own), ``requests`` sessions with keep-alive.  Modes, each interleaved with
its direct baseline in rounds so both see the same machine noise:

- http:   plain HTTP with a rule (headers injected);
- tunnel: HTTPS without a rule (CONNECT, bytes untouched);
- mitm:   HTTPS with a rule (intercepted, re-encrypted to the upstream).

- http2:  HTTPS with a rule over HTTP/2 (httpx with h2, against a small h2 upstream).

Also one large download per mode, for throughput; each mode prints
``egress MODE mitmproxy proxy X ms direct Y ms ratio Z`` (medians) after its detail line.

Fairness (issue 27; needs root for the proxy's private resolv.conf, see
tests/hub/egress_fairness.py): an honest client's sequential keep-alive GETs, each to a new
name (a real look-up), quiet and while another client runs each abuse; one line per abuse
``egress fairness ABUSE p99 ratio X`` (p99 under abuse / quiet p99).  Then 2,000 keep-alive
GETs while two CPU burners load the machine: ``egress keepalive 2000 max X s p99 Y ms``.

    .venv/bin/python benchmarks/egress_proxy.py [--requests 500] [--mib 64]
        [--only latency|fairness|keepalive] [--fair-requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from cloudtik_emulators.upstreams import make_test_ca
from jupyter_cloudtik.hub.egress import EgressSupervisor

BIG = b"x" * (1 << 20)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    mib = 64

    def do_GET(self) -> None:
        if self.path.startswith("/big"):
            self.send_response(200)
            self.send_header("Content-Length", str(self.mib * len(BIG)))
            self.end_headers()
            for _ in range(self.mib):
                self.wfile.write(BIG)
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _serve(chain: Path | None) -> int:
    import ssl

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    if chain:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(chain)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


def _times(session: requests.Session, url: str, n: int, verify) -> list[float]:
    out = []
    session.get(url, verify=verify, timeout=10)  # connect (and handshake) outside timing
    for _ in range(n):
        t = time.perf_counter()
        r = session.get(url, verify=verify, timeout=10)
        out.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200, r.status_code
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _h2_times(client, url: str, n: int) -> list[float]:
    out = []
    client.get(url)
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(url)
        out.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and r.http_version == "HTTP/2", r
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--only", choices=("latency", "fairness", "keepalive"), default=None)
    ap.add_argument("--fair-requests", type=int, default=300)
    args = ap.parse_args()
    Handler.mib = args.mib
    if args.only in (None, "latency"):
        bench("mitmproxy", args)
    if args.only in (None, "fairness", "keepalive"):
        fairness(args)


def fairness(args: argparse.Namespace) -> None:
    """Per-client fairness (``egress fairness ABUSE p99 ratio X``) and keep-alive under
    load (``egress keepalive 2000 max X s p99 Y ms``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hub"))
    import egress_fairness as ef

    from jupyter_cloudtik.hub.egress.supervisor import egress_python

    why = ef.available()
    if why:
        print(f"egress fairness skipped: {why}")
        return
    tmp = Path(tempfile.mkdtemp(prefix="egress-fair-"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    with ef.upstreams(tmp) as (http_port, abuse_port, tls_port, upstream_ca), \
            ef.name_server() as dns_ip:
        python = ef.resolving_python(tmp, dns_ip, egress_python())
        sup = EgressSupervisor(tmp / "state", upstream_ca_bundle=str(upstream_ca),
                               no_proxy="", deny_networks=[], python=python)
        run(sup.start())
        try:
            clients, rules, setup = ef.configure(http_port, abuse_port, tls_port)
            run(sup.update(clients, rules))
            setup.proxy_port = sup.port
            n = args.fair_requests
            if args.only in (None, "fairness"):
                ef.normal_latencies(setup, 20)  # warm-up
                quiet, failed = ef.normal_latencies(setup, n)
                print(f"fairness: {n} sequential keep-alive GETs of one client, each a new "
                      f"name; quiet {ef.summary(quiet)} failed {failed}", flush=True)
                q99 = ef.pct(quiet, .99)
                for kind in ef.ABUSES:
                    with ef.abuse(kind, setup, seconds=60):
                        lat, failed = ef.normal_latencies(setup, n)
                    print(f"  under {kind}: {ef.summary(lat)} failed {failed}")
                    print(f"egress fairness {kind} p99 ratio {ef.pct(lat, .99) / q99:.2f}",
                          flush=True)
            if args.only in (None, "keepalive"):
                keepalive(setup)
        finally:
            run(sup.stop())
            loop.call_soon_threadsafe(loop.stop)
            shutil.rmtree(tmp, ignore_errors=True)


def keepalive(setup) -> None:
    import egress_fairness as ef

    s = requests.Session()
    s.trust_env = False
    s.proxies = {"http": f"http://{setup.normal[0]}:{setup.normal[1]}@127.0.0.1:"
                         f"{setup.proxy_port}"}
    url = f"http://k.fast.test:{setup.http_port}/x"
    s.get(url, timeout=30)
    lat = []
    with ef.cpu_burners(2):
        for _ in range(2000):
            t = time.perf_counter()
            r = s.get(url, timeout=30)
            lat.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.status_code
    s.close()
    print(f"keep-alive under 2 CPU burners: {ef.summary(lat)}")
    print(f"egress keepalive 2000 max {max(lat) / 1000:.2f} s p99 {ef.pct(lat, .99):.1f} ms",
          flush=True)


def bench(engine: str, args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    upstream_ca, _ctx = make_test_ca(tmp)
    chain = tmp / "upstream-leaf.pem"  # make_test_ca's leaf key and chain
    http_port, ruled_port, plain_port = _serve(None), _serve(chain), _serve(chain)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    token = uuid.uuid4().hex
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hub"))
    from h2_upstream import H2Upstream

    h2ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    h2ctx.load_cert_chain(chain)
    h2 = H2Upstream(h2ctx)
    sup = EgressSupervisor(tmp / "state", upstream_ca_bundle=str(upstream_ca), no_proxy="",
                           deny_networks=[])
    run(sup.start())
    try:
        run(sup.update([{"user": "bench", "token": token}], [
            *([{"id": "h2", "host": "127.0.0.1", "port": h2.port, "header": "Authorization",
                "value": "Bearer " + uuid.uuid4().hex, "users": ["bench"]}] if h2 else []),
            {"id": "h", "host": "127.0.0.1", "port": http_port, "header": "Authorization",
             "value": "Bearer " + uuid.uuid4().hex, "users": ["bench"]},
            {"id": "m", "host": "127.0.0.1", "port": ruled_port, "header": "Authorization",
             "value": "Bearer " + uuid.uuid4().hex, "users": ["bench"]}]))
        proxy = sup.proxy_url_for("bench", token)
        modes = {
            "http": (f"http://127.0.0.1:{http_port}/x", None, None),
            "tunnel": (f"https://127.0.0.1:{plain_port}/x", str(upstream_ca),
                       str(upstream_ca)),
            "mitm": (f"https://127.0.0.1:{ruled_port}/x", str(upstream_ca),
                     str(sup.bundle_path)),
        }
        print(f"engine {engine}: {args.requests} sequential keep-alive GETs per mode and path "
              f"(ms: median / p95), one {args.mib} MiB download (MiB/s)")
        for mode, (url, verify_direct, verify_proxy) in modes.items():
            direct, via = requests.Session(), requests.Session()
            direct.trust_env = via.trust_env = False
            via.proxies = {"http": proxy, "https": proxy}
            d: list[float] = []
            v: list[float] = []
            rounds = 5
            for _ in range(rounds):
                d += _times(direct, url, args.requests // rounds, verify_direct)
                v += _times(via, url, args.requests // rounds, verify_proxy)
            big = url.replace("/x", "/big")
            rates = []
            for s, verify in ((direct, verify_direct), (via, verify_proxy)):
                t = time.perf_counter()
                r = s.get(big, verify=verify, timeout=120)
                assert len(r.content) == args.mib << 20
                rates.append(args.mib / (time.perf_counter() - t))
            added = statistics.median(v) - statistics.median(d)
            print(f"{mode:7s} direct {statistics.median(d):6.2f} / {_pct(d, .95):6.2f}   "
                  f"proxy {statistics.median(v):6.2f} / {_pct(v, .95):6.2f}   "
                  f"added {added:5.2f} ms   "
                  f"download direct {rates[0]:7.1f} proxy {rates[1]:7.1f} MiB/s")
            _line(mode, engine, v, d)
            direct.close()
            via.close()
        if h2 is not None:
            import httpx

            url = f"https://127.0.0.1:{h2.port}/x"
            with httpx.Client(proxy=proxy, http2=True, trust_env=False, verify=ssl
                              .create_default_context(cafile=str(sup.bundle_path))) as via, \
                    httpx.Client(http2=True, trust_env=False, verify=ssl
                                 .create_default_context(cafile=str(upstream_ca))) as direct:
                d, v = [], []
                rounds = 5
                for _ in range(rounds):
                    d += _h2_times(direct, url, args.requests // rounds)
                    v += _h2_times(via, url, args.requests // rounds)
            print(f"http2   direct {statistics.median(d):6.2f} / {_pct(d, .95):6.2f}   "
                  f"proxy {statistics.median(v):6.2f} / {_pct(v, .95):6.2f}   "
                  f"added {statistics.median(v) - statistics.median(d):5.2f} ms")
            _line("http2", engine, v, d)
    finally:
        run(sup.stop())
        loop.call_soon_threadsafe(loop.stop)
        if h2 is not None:
            h2.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _line(mode: str, engine: str, via: list[float], direct: list[float]) -> None:
    p, d = statistics.median(via), statistics.median(direct)
    print(f"egress {mode} {engine} proxy {p:.2f} ms direct {d:.2f} ms ratio {p / d:.1f}",
          flush=True)


if __name__ == "__main__":
    main()
