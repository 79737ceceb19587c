"""A Huawei Cloud cluster's dashboard from a browser that reaches only the Jupyter server.

The head's dashboard listens on the head's loopback; the head's relay (port 8788, opened
by the security group) lets in only TLS connections that present a certificate of the
cluster's CA.  The Jupyter server holds the cluster's client certificate and serves the
dashboard at ``{base_url}cloudtik/dashboard/NAME/`` (HTTP and Bokeh's websocket) behind
its own login.  Real emulated cloud (the head is a real local Dask scheduler started by
its user data), a real Jupyter server, real HTTP, TLS and websocket clients.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time

import psutil
import pytest
import requests
from hwc_helpers import cluster_config, leftovers, relay_get, workspace_config
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.slow


def _refused(host: str, port: int, ctx: ssl.SSLContext) -> str:
    """How the relay answers a GET over ``ctx``: refused (in or right after the
    handshake: under TLS 1.3 the server's refusal of a client certificate arrives at the
    client's first read) or what it answered."""
    try:
        answer = relay_get(host, port, ctx)
    except (ssl.SSLError, OSError) as e:
        return f"refused: {type(e).__name__}"
    return f"answered {answer[:80]!r}" if answer else "refused: closed"


def _head_process(server_id: str, marker: str) -> psutil.Process:
    """The emulated head's process whose command line names ``marker``."""
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (p.info["environ"] or {}).get("CLOUDTIK_EMULATED_SERVER") == server_id and \
                    any(marker in a for a in p.info["cmdline"] or []):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no {marker} process on {server_id}")


def test_dashboard_through_the_server_with_the_clusters_client_certificate(
        hwc, core, tmp_path):
    from jupyter_cloudtik.runtime.tls import client_ssl_context, make_cluster_tls
    from tests.server.conftest import _start_server, _stop
    from tests.server.kernels import running_kernel

    ws, name = "dash", "dash1"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    info = core.run(core.clusters.up(cluster_config(name, ws, workers=1)))
    assert info.state == "running"
    head = next(n for n in info.nodes if n.kind == "head")
    relay = f"https://{head.external_ip}:8788"
    assert info.connect_info["extra"]["dashboard_tls_address"] == relay
    assert info.connect_info["http_address"] is None
    _, connect = core.clusters.connect_info(name)

    # straight to the head: the dashboard itself is not on the EIP, and its relay refuses
    # TLS without a client certificate and with a certificate of another CA
    with pytest.raises(OSError):
        socket.create_connection((head.external_ip, 8787), timeout=2).close()
    no_cert = ssl.create_default_context(cadata=connect.credentials["ca"])
    no_cert.check_hostname = False
    other = make_cluster_tls(name)  # the same name, another CA
    foreign = client_ssl_context({"ca": connect.credentials["ca"], "cert": other.client_cert,
                                  "key": other.client_key})
    for ctx in (no_cert, foreign):
        assert _refused(head.external_ip, 8788, ctx).startswith("refused")
    # ...and lets the cluster's own client certificate in (what the server uses)
    ours = relay_get(head.external_ip, 8788, client_ssl_context(connect.credentials))
    assert ours.startswith(b"HTTP/1.") and b" 200 " in ours.split(b"\r\n", 1)[0], ours[:300]

    # the server on the same state folder (tmp_path/state): its store, the cluster's TLS
    server = _start_server(tmp_path, "server", [
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"],
        {"HUAWEICLOUD_CREDENTIALS_FILE": str(hwc.dir / "credentials")})
    try:
        base = f"{server.url}cloudtik/dashboard/{name}/"
        listed = server.get(f"clusters/{name}").json()
        assert listed["dashboard_link"] == f"/cloudtik/dashboard/{name}/status"

        # right after `up` the head's dashboard may still be starting: the route says so
        # (503 with Retry-After, never 404) and a client asks again after that long
        deadline = time.monotonic() + 90
        while True:
            page = requests.get(base + "status", headers=server.headers(), timeout=60)
            if page.status_code != 503 or time.monotonic() > deadline:
                break
            assert page.json()["reason"] == "starting", page.text[:500]
            time.sleep(float(page.headers["Retry-After"]))
        assert page.status_code == 200, page.text[:500]
        assert "bokeh" in page.text.lower() and "Dask" in page.text
        ident = requests.get(base + "json/identity.json", headers=server.headers(),
                             timeout=60).json()
        assert ident["type"] == "Scheduler"
        assert ident["address"] == connect.scheduler_address

        # Bokeh's plot document over the websocket, through the server, over WSS
        plot = requests.get(base + "individual-task-stream", headers=server.headers(),
                            timeout=60)
        assert plot.status_code == 200
        token = re.search(r'"token":\s*"([^"]+)"', plot.text)
        assert token, plot.text[:2000]

        async def plot_socket(headers: dict[str, str]) -> list[str] | int:
            """Bokeh's protocol over the socket: its ACK, then the plot's document
            (PULL-DOC-REQ / PULL-DOC-REPLY; a message is three frames: header, metadata,
            content)."""
            url = (base + "individual-task-stream/ws").replace("http://", "ws://")
            try:
                conn = await websocket_connect(HTTPRequest(url, headers=headers),
                                               subprotocols=["bokeh", token.group(1)])
            except HTTPClientError as e:
                return e.code
            msgs: list[str] = []
            asked = False
            for _ in range(12):
                msg = await asyncio.wait_for(conn.read_message(), 30)
                if msg is None:
                    break
                msgs.append(msg if isinstance(msg, str) else msg.decode(errors="replace"))
                flat = [m.replace(" ", "") for m in msgs]
                if not asked and any('"msgtype":"ACK"' in m for m in flat):
                    for frame in ('{"msgid":"1","msgtype":"PULL-DOC-REQ"}', "{}", "{}"):
                        await conn.write_message(frame)
                    asked = True
                replies = [i for i, m in enumerate(flat) if '"msgtype":"PULL-DOC-REPLY"' in m]
                if replies and len(msgs) >= replies[0] + 3:
                    break
            conn.close()
            return msgs

        msgs = asyncio.run(plot_socket(server.headers()))
        assert isinstance(msgs, list) and any(
            '"msgtype":"ACK"' in m.replace(" ", "") for m in msgs), msgs
        reply = next(i for i, m in enumerate(msgs) if "PULL-DOC-REPLY" in m)
        doc = msgs[reply + 2]  # the content frame: the plot's document, its models
        assert '"doc"' in doc and "ColumnDataSource" in doc and "Rect" in doc, doc[:500]

        # no login: refused; the kernel token (a REST capability) does not open it
        anon = requests.get(base + "status", allow_redirects=False, timeout=30)
        assert anon.status_code in (302, 403) and "bokeh" not in anon.text.lower()
        assert asyncio.run(plot_socket({})) == 403
        with running_kernel(server, "dash.ipynb") as kernel:
            out = kernel.run("import os; print(os.environ['CLOUDTIK_API_TOKEN'])")
        kernel_token = out.strip().splitlines()[-1]
        as_kernel = {"Authorization": f"token {kernel_token}"}
        assert requests.get(server.api_url + "clusters", headers=as_kernel, timeout=30).ok
        r = requests.get(base + "status", headers=as_kernel, allow_redirects=False,
                         timeout=30)
        assert r.status_code in (302, 403) and "bokeh" not in r.text.lower()

        # the relay ends with the scheduler (a head whose runtime died keeps no process)
        relay_proc = _head_process(head.node_id, "dashboard-relay")
        scheduler = psutil.Process(int(relay_proc.cmdline()[-1]))  # the pid it watches
        # (its title is Dask's: setproctitle writes over its /proc environ)
        assert scheduler.name().startswith("dask scheduler"), scheduler.name()
        # the dashboard is on the head's own loopback: in the emulator's fast mode an
        # address of its own, not this machine's 127.0.0.1, where another test's head
        # would meet it (CI: a relay served the other cluster's dashboard)
        listening = {(c.laddr.ip, c.laddr.port) for c in scheduler.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        dash = [a for a in listening if a[1] == 8787]
        assert len(dash) == 1 and dash[0][0].startswith("127.") and \
            dash[0][0] != "127.0.0.1", listening
        assert relay_proc.is_running()
        scheduler.kill()
        relay_proc.wait(15)
        # the proxy's check of a target is trusted for VERIFY_TTL (5 s): a request in
        # between may fail to connect (5xx); after it, the dead head is a 404
        deadline = time.monotonic() + 30
        while True:
            dead = requests.get(base + "status", headers=server.headers(), timeout=60)
            assert dead.status_code in (404, 500, 502), dead.status_code
            if dead.status_code == 404 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert dead.status_code == 404 and dead.json()["reason"] == "not_found"

        # a cluster that is gone: 404, with no connection to whatever answers there now
        down = server.request("DELETE", f"clusters/{name}")
        assert down.status_code == 202, down.text
        assert server.wait_operation(down.json()["operation"]["id"])["state"] == "succeeded"
        gone = requests.get(base + "status", headers=server.headers(), timeout=30)
        assert gone.status_code == 404 and gone.json()["reason"] == "not_found"
    finally:
        problems = _stop(server)
    assert not problems, problems
    assert core.clusters.get(name).state == "stopped"
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
