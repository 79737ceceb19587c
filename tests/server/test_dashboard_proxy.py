"""A cluster's dashboard through the Jupyter server: ``{base_url}cloudtik/dashboard/NAME/``.

Real JupyterLab, real local cluster (a real Dask scheduler with its Bokeh dashboard), real
HTTP and websocket clients.  The route must serve the dashboard only to the server's
authenticated users, only for a recorded, live cluster, and never connect to whatever
listens on a port the URL or a stale record names.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import psutil
import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from .conftest import unique


@pytest.fixture(scope="module")
def cluster(lab):
    name = unique("dash")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 1})
    assert r.status_code == 202, r.text
    op = lab.wait_operation(r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    yield name
    r = lab.request("DELETE", f"clusters/{name}")
    if r.status_code == 202:
        lab.wait_operation(r.json()["operation"]["id"])


def dash(lab, name: str, page: str = "status") -> str:
    return f"{lab.url}cloudtik/dashboard/{name}/{page}"


def test_dashboard_link_is_the_servers_url(lab, cluster):
    info = lab.get(f"clusters/{cluster}").json()
    assert info["dashboard_link"] == f"/cloudtik/dashboard/{cluster}/status"
    listed = {c["name"]: c for c in lab.get("clusters").json()["clusters"]}
    assert listed[cluster]["dashboard_link"] == info["dashboard_link"]
    # the cluster's own address is still recorded (for the proxy), not shown as the link
    assert info["connect_info"]["http_address"].startswith("http://127.0.0.1:")


def test_status_page_and_json_through_the_server(lab, cluster):
    r = requests.get(dash(lab, cluster), headers=lab.headers(), timeout=30)
    assert r.status_code == 200, r.text[:500]
    assert "bokeh" in r.text.lower() and "Dask" in r.text
    ident = requests.get(dash(lab, cluster, "json/identity.json"), headers=lab.headers(),
                         timeout=30).json()
    assert ident["type"] == "Scheduler"
    assert ident["address"] == lab.get(f"clusters/{cluster}").json()["scheduler_address"]
    # the bare cluster URL goes to its status page
    r = requests.get(f"{lab.url}cloudtik/dashboard/{cluster}", headers=lab.headers(),
                     allow_redirects=False, timeout=30)
    assert r.status_code == 302 and r.headers["Location"].endswith(f"/{cluster}/status")


def test_websocket_of_a_plot_through_the_server(lab, cluster):
    """Bokeh's plots talk over ``<page>/ws`` with the page's session token: through the
    server the socket opens and Bokeh answers its ACK, then the plot's document."""
    import re

    page = requests.get(dash(lab, cluster, "individual-task-stream"), headers=lab.headers(),
                        timeout=30)
    assert page.status_code == 200
    token = re.search(r'"token":\s*"([^"]+)"', page.text)
    assert token, page.text[:2000]

    async def go() -> list[str]:
        url = dash(lab, cluster, "individual-task-stream/ws").replace("http://", "ws://")
        conn = await websocket_connect(HTTPRequest(url, headers=lab.headers()),
                                       subprotocols=["bokeh", token.group(1)])
        msgs = []
        for _ in range(3):
            msg = await asyncio.wait_for(conn.read_message(), 20)
            if msg is None:
                break
            msgs.append(msg if isinstance(msg, str) else msg.decode(errors="replace"))
            if any('"msgtype":"ACK"' in m.replace(" ", "") for m in msgs):
                break
        conn.close()
        return msgs

    msgs = asyncio.run(go())
    assert any('"msgtype":"ACK"' in m.replace(" ", "") for m in msgs), msgs


def test_unauthenticated_requests_are_refused(lab, cluster):
    r = requests.get(dash(lab, cluster), allow_redirects=False, timeout=30)
    assert r.status_code in (302, 403)
    assert "bokeh" not in r.text.lower()
    if r.status_code == 302:
        assert "/login" in r.headers["Location"]
    bad = requests.get(dash(lab, cluster), headers={"Authorization": "token nope"},
                       allow_redirects=False, timeout=30)
    assert bad.status_code in (302, 403) and "bokeh" not in bad.text.lower()

    async def ws() -> int:
        url = dash(lab, cluster, "individual-task-stream/ws").replace("http://", "ws://")
        try:
            await websocket_connect(HTTPRequest(url))
        except HTTPClientError as e:
            return e.code
        return 101

    assert asyncio.run(ws()) == 403


def test_unknown_cluster_and_foreign_hosts_are_404(lab, cluster):
    for path in ("nope/status", "127.0.0.1:22/status", "..%2F..%2Fapi/status"):
        r = requests.get(f"{lab.url}cloudtik/dashboard/{path}", headers=lab.headers(),
                         timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
        assert r.json()["reason"] == "not_found"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        body = b"not a dask scheduler"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_dead_scheduler_port_is_never_proxied_to(lab):
    """The scheduler dies without `down`; something else takes its dashboard port: the
    record still names the port, but the route answers 404 and passes nothing on."""
    name = unique("stale")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 0})
    assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
    try:
        info = lab.get(f"clusters/{name}").json()
        http_address = info["connect_info"]["http_address"]
        port = int(http_address.rsplit(":", 1)[1])
        assert requests.get(dash(lab, name), headers=lab.headers(), timeout=30).ok
        owner = next(c.pid for c in psutil.net_connections("tcp")
                     if c.laddr and c.laddr.port == port and c.status == "LISTEN")
        psutil.Process(owner).kill()
        deadline = time.monotonic() + 20
        server = None
        while server is None:
            try:
                server = http.server.HTTPServer(("127.0.0.1", port), _Recorder)
            except OSError:
                assert time.monotonic() < deadline, "port not freed"
                time.sleep(0.2)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            time.sleep(5.5)  # past the route's re-check interval
            assert lab.get(f"clusters/{name}").json()["state"] != "stopped"  # still recorded
            r = requests.get(dash(lab, name, "status?x=1"), headers=lab.headers(), timeout=30)
            assert r.status_code == 404, r.text[:300]
            assert "not a dask scheduler" not in r.text
            assert set(_Recorder.seen) <= {"/json/identity.json", "/api/v1/get_workers"}, (
                _Recorder.seen)  # probes only: nothing of the request was passed on
        finally:
            server.shutdown()
            server.server_close()
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])
    r = requests.get(dash(lab, name), headers=lab.headers(), timeout=30)
    assert r.status_code == 404


def test_cli_talking_to_the_server_prints_the_servers_dashboard_url(lab, cluster):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "CLOUDTIK_API_URL": lab.api_url, "CLOUDTIK_API_TOKEN": lab.token}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-cloudtik"), "status", cluster],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("dashboard"))
    url = line.split()[1]
    assert url == dash(lab, cluster)
    assert requests.get(url, headers=lab.headers(), timeout=30).ok


def _up(lab, name: str, watch: bool = True) -> set[int]:
    """`up` with no workers; what the dashboard route answered while it ran (``watch``:
    asked every 0.1 s, so the route may have seen the dashboard answer before `up` ends)."""
    r = lab.request("POST", "clusters", json={"name": name, "workers": 0})
    assert r.status_code == 202, r.text
    op_id = r.json()["operation"]["id"]
    seen = set()
    while lab.get(f"operations/{op_id}").json()["state"] in ("pending", "running"):
        if watch:
            seen.add(requests.get(dash(lab, name), headers=lab.headers(),
                                  timeout=60).status_code)
        time.sleep(0.1)
    assert lab.wait_operation(op_id)["state"] == "succeeded"
    return seen


def _down(lab, name: str) -> None:
    r = lab.request("DELETE", f"clusters/{name}")
    if r.status_code == 202:
        lab.wait_operation(r.json()["operation"]["id"])


def test_a_dashboard_not_answering_yet_is_503_with_retry_after_not_404(lab):
    """The window between a cluster recorded running and its dashboard answering, held
    open for real: right after `up`, before the route's first request, the scheduler is
    stopped (SIGSTOP), so its dashboard port accepts connections and answers nothing, as a
    head still starting its dashboard does.  The route says "still starting" (503,
    Retry-After), not "no such cluster" (404); once the scheduler goes on, the same URL
    serves the dashboard.  And while `up` runs (no scheduler recorded yet) the route
    never answers 404."""
    name, other = unique("slow"), unique("slow")
    scheduler = None
    try:
        # not watched: the route's first request comes after the scheduler is stopped (a
        # dashboard that answered here once and then stops is gone, or, within the 5 s a
        # check is trusted, proxied to as it is; CI: the watch saw it answer before `up`
        # ended and the request then waited on the stopped scheduler)
        _up(lab, name, watch=False)
        port = int(lab.get(f"clusters/{name}").json()["connect_info"]["http_address"]
                   .rsplit(":", 1)[1])
        scheduler = psutil.Process(next(
            c.pid for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == "LISTEN"))
        scheduler.suspend()
        r = requests.get(dash(lab, name), headers=lab.headers(), timeout=120)
        assert r.status_code == 503, r.text[:300]
        assert r.headers["Retry-After"] == "2"
        assert r.json()["reason"] == "starting"
        assert f"the dashboard of cluster '{name}' does not answer yet" in r.json()["message"]
        scheduler.resume()
        scheduler = None
        r = requests.get(dash(lab, name), headers=lab.headers(), timeout=60)
        assert r.status_code == 200 and "bokeh" in r.text.lower(), r.text[:300]

        seen = _up(lab, other)
        assert 404 not in seen, seen
    finally:
        if scheduler is not None:
            scheduler.resume()
        _down(lab, name)
        _down(lab, other)
