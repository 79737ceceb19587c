"""Egress proxy overhead per request, against a direct request in the same run.

    .venv/bin/python benchmarks/egress_proxy.py [--n 200] [--engine mitmproxy builtin]

For each engine (mitmproxy: the proxy now; builtin: the older HTTP/1.1 proxy, as on main
before issue 21) it starts the real proxy process under its supervisor and loopback upstreams,
then times N sequential keep-alive requests: plain HTTP/1.1 with a rule, intercepted HTTPS
with a rule, and an HTTPS tunnel without a rule, each next to the same request made directly.
Prints ``egress <kind> <engine> proxy X ms direct Y ms ratio Z`` (medians).
HTTP/2 is not timed here: the project's environment has no HTTP/2 client (see the note).
"""

from __future__ import annotations

import argparse
import asyncio
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


def _time(session: requests.Session, url: str, n: int, verify) -> float:
    session.get(url, verify=verify, timeout=10)  # connection set up outside the timing
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        r = session.get(url, verify=verify, timeout=10)
        samples.append(time.perf_counter() - t)
        assert r.status_code == 200, r.status_code
    return statistics.median(samples) * 1000


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
    _run(loop, sup.update([{"user": "bench", "token": TOKEN}], [
        {"id": "h", "host": "127.0.0.1", "port": hp, "header": "Authorization",
         "value": "Bearer bench-secret", "users": ["bench"]},
        {"id": "t", "host": "127.0.0.1", "port": rp, "header": "X-Key",
         "value": "bench-secret", "users": ["bench"]}]))
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
            p = _time(via, u, n, verify_proxy)
            d = _time(direct, u, n, verify_direct or True)
            print(f"egress {kind} {engine} proxy {p:.2f} ms direct {d:.2f} ms "
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
