"""Egress proxy overhead per request, against a direct request in the same run.

    .venv/bin/python benchmarks/egress_proxy.py [--n 200] [--engine mitmproxy builtin]

For each engine (mitmproxy: the proxy now; builtin: the older HTTP/1.1 proxy, as on main
before issue 21) it starts the real proxy process under its supervisor and loopback upstreams,
then times N sequential keep-alive requests: plain HTTP/1.1 with a rule, intercepted HTTPS
with a rule, and an HTTPS tunnel without a rule, each next to the same request made directly.
Prints ``egress <kind> <engine> proxy X ms direct Y ms ratio Z`` (medians).
HTTP/2 (httpx with h2, intercepted, against a small h2 upstream) for the mitmproxy engine
only: the builtin proxy speaks HTTP/1.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_cloudtik.hub.egress import EgressSupervisor
from jupyter_cloudtik.testing.upstreams import make_test_ca, serve

TOKEN = "bench-token-0123456789"


def _loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def _run(loop, coro, timeout=60):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def _pair(via: requests.Session, direct: requests.Session, url: str, n: int,
          verify_via, verify_direct) -> tuple[float, float]:
    """Median ms of ``n`` requests through the proxy and ``n`` direct, interleaved so both
    see the same machine load."""
    via.get(url, verify=verify_via, timeout=10)  # connections set up outside the timing
    direct.get(url, verify=verify_direct, timeout=10)
    a, b = [], []
    for _ in range(n):
        for session, verify, out in ((via, verify_via, a), (direct, verify_direct, b)):
            t = time.perf_counter()
            r = session.get(url, verify=verify, timeout=10)
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.status_code
    return statistics.median(a) * 1000, statistics.median(b) * 1000


def _pair_h2(proxy: str, url: str, n: int, verify_via, verify_direct) -> tuple[float, float]:
    import httpx

    with httpx.Client(proxy=proxy, http2=True, verify=verify_via, trust_env=False) as via, \
            httpx.Client(http2=True, verify=verify_direct, trust_env=False) as direct:
        assert via.get(url).http_version == "HTTP/2" == direct.get(url).http_version
        a, b = [], []
        for _ in range(n):
            for client, out in ((via, a), (direct, b)):
                t = time.perf_counter()
                r = client.get(url)
                out.append(time.perf_counter() - t)
                assert r.status_code == 200
    return statistics.median(a) * 1000, statistics.median(b) * 1000


def bench(engine: str, n: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    ca_path, ctx = make_test_ca(base)
    http_srv, _ = serve(None)
    ruled, _ = serve(ctx)
    plain, _ = serve(ctx)
    loop = _loop()
    sup = EgressSupervisor(base / "state", upstream_ca_bundle=str(ca_path), no_proxy="",
                           deny_networks=["169.254.0.0/16"], engine=engine)
    _run(loop, sup.start())
    hp, rp, pp = (s.server_address[1] for s in (http_srv, ruled, plain))
    h2 = None
    if engine == "mitmproxy":  # the builtin proxy speaks HTTP/1.1 only
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hub"))
        from h2_upstream import H2Upstream

        h2ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        h2ctx.load_cert_chain(base / "upstream-leaf.pem")
        h2 = H2Upstream(h2ctx)
    _run(loop, sup.update([{"user": "bench", "token": TOKEN}], [
        {"id": "h", "host": "127.0.0.1", "port": hp, "header": "Authorization",
         "value": "Bearer bench-secret", "users": ["bench"]},
        {"id": "t", "host": "127.0.0.1", "port": rp, "header": "X-Key",
         "value": "bench-secret", "users": ["bench"]},
        *([{"id": "h2", "host": "127.0.0.1", "port": h2.port, "header": "X-Key",
            "value": "bench-secret", "users": ["bench"]}] if h2 else [])]))
    try:
        via = requests.Session()
        via.trust_env = False
        url = sup.proxy_url_for("bench", TOKEN)
        via.proxies = {"http": url, "https": url}
        direct = requests.Session()
        direct.trust_env = False
        cases = [("http1", f"http://127.0.0.1:{hp}/x", str(sup.bundle_path), None),
                 ("https-intercepted", f"https://127.0.0.1:{rp}/x", str(sup.bundle_path),
                  str(ca_path)),
                 ("https-tunnel", f"https://127.0.0.1:{pp}/x", str(ca_path), str(ca_path))]
        for kind, u, verify_proxy, verify_direct in cases:
            p, d = _pair(via, direct, u, n, verify_proxy, verify_direct or True)
            print(f"egress {kind} {engine} proxy {p:.2f} ms direct {d:.2f} ms "
                  f"ratio {p / d:.1f}", flush=True)
        if h2 is not None:
            p, d = _pair_h2(url, f"https://127.0.0.1:{h2.port}/x", n,
                            ssl.create_default_context(cafile=str(sup.bundle_path)),
                            ssl.create_default_context(cafile=str(ca_path)))
            print(f"egress http2-intercepted {engine} proxy {p:.2f} ms direct {d:.2f} ms "
                  f"ratio {p / d:.1f}", flush=True)
    finally:
        _run(loop, sup.stop())
        loop.call_soon_threadsafe(loop.stop)
        for s in (http_srv, ruled, plain):
            s.shutdown()
            s.server_close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--engine", nargs="+", default=["builtin", "mitmproxy"])
    args = ap.parse_args()
    for e in args.engine:
        bench(e, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
