"""A Huawei Cloud Spark cluster's UI through the Jupyter server, and Dask beside Spark.

One ``dask,spark`` cluster (a head and a worker) for the module, on the emulator's fast mode
(the servers run their user data as local processes: real Dask and Spark processes, real
JVMs).  The head's UIs listen on its loopback; its one mutual-TLS relay (port 8788, the
port the security group already opens for Dask's dashboard) passes a connection to Spark's
master UI when the client offers ALPN ``cloudtik-spark``, to Dask's dashboard otherwise, and
only with a certificate of the cluster's CA.  A real Jupyter server holding the cluster's
client certificate serves the master page (its workers), a running application's UI (the
driver in this process) and Dask's dashboard of the same cluster; hostile names and paths
get a 4xx and never reach another host; both clients compute; ``down`` leaves no JVM.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

import psutil
import pytest
import requests
from hwc_helpers import cluster_config, created_sg_rules, leftovers, relay_get, workspace_config

pytestmark = [pytest.mark.slow, pytest.mark.spark]
pyspark = pytest.importorskip("pyspark")


def _refused(host: str, port: int, ctx: ssl.SSLContext) -> bool:
    """Does the relay refuse ``ctx`` (in, or under TLS 1.3 right after, the handshake)?"""
    try:
        return relay_get(host, port, ctx, "/json/") == b""
    except (ssl.SSLError, OSError):
        return True


class Canary:
    """A listener that counts every connection made to it: "another host"."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _raw_get(url: str, path: str, headers: dict[str, str]) -> int:
    """GET ``path`` exactly as written (no client-side normalisation of dots or %2F)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def _jvms(root) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and cmd and "java" in cmd[0] \
                and str(root) in " ".join(cmd) and "org.apache.spark" in " ".join(cmd):
            out.append(p.pid)
    return out


def test_spark_ui_through_the_server_and_dask_beside_spark_on_huaweicloud(
        hwc, env, tmp_path):
    from jupyter_cloudtik import Cluster, Workspace
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.runtime.tls import (
        SPARK_UI_ALPN,
        client_ssl_context,
        load_cluster_tls,
        make_cluster_tls,
    )
    from tests.server.conftest import _start_server, _stop

    backend = CoreBackend(settings=CloudTik(state_dir=str(env), start_reaper=False,
                                            operation_timeout=300))
    ws, name = "sparkuiws", "sparkui1"
    server = spark = canary = None
    jvms: list[int] = []
    t_start = time.monotonic()
    try:
        first = hwc.ctl.last_request()
        Workspace.create(ws, config=workspace_config(hwc), progress=False, backend=backend)
        # no new port: the UIs share the dashboard relay's 8788; 8080 and 8787 stay closed
        rules = created_sg_rules(hwc, first)
        ports = {r.get("port_range_min") for r in rules}
        assert 8788 in ports and not ports & {8080, 8081, 8787}, rules
        cfg = cluster_config(name, ws, workers=1)
        cfg["runtime"] = {"types": ["dask", "spark"]}
        t0 = time.monotonic()
        c = Cluster.up(cfg, backend=backend, progress=False)
        up_s = time.monotonic() - t0
        jvms = _jvms(hwc.dir)
        assert len(jvms) == 2, jvms  # a master and a worker
        head = next(n for n in c.info.nodes if n.kind == "head")
        extra = c.info.connect_info["extra"]
        relay = f"https://{head.external_ip}:8788"
        assert extra["spark"]["ui_tls_address"] == relay
        assert extra["dashboard_tls_address"] == relay  # one relay, one port, both UIs

        # straight to the head: the master UI is not on the EIP; the relay refuses TLS
        # without a client certificate and with another CA's, also when asking for Spark
        with pytest.raises(OSError):
            socket.create_connection((head.external_ip, 8080), timeout=2).close()
        creds = load_cluster_tls(env, name).client_credentials()
        no_cert = ssl.create_default_context(cadata=creds["ca"])
        no_cert.check_hostname = False
        no_cert.set_alpn_protocols([SPARK_UI_ALPN])
        other = make_cluster_tls(name)  # the same name, another CA
        foreign = client_ssl_context({"ca": creds["ca"], "cert": other.client_cert,
                                      "key": other.client_key}, alpn=SPARK_UI_ALPN)
        for ctx in (no_cert, foreign):
            assert _refused(head.external_ip, 8788, ctx)
        # with the cluster's certificate: Spark's master for ALPN cloudtik-spark, Dask's
        # dashboard for a client that asks for none (what the dashboard route does)
        spark_json = relay_get(head.external_ip, 8788,
                                client_ssl_context(creds, alpn=SPARK_UI_ALPN), "/json/")
        assert b" 200 " in spark_json.split(b"\r\n", 1)[0], spark_json[:300]
        assert extra["spark"]["master_url"].encode() in spark_json
        # Dask's dashboard may still be starting right after `up` on a busy machine (the
        # relay closes at once while nothing listens behind it): a few tries
        deadline = time.monotonic() + 30
        while not (dask_ident := relay_get(head.external_ip, 8788, client_ssl_context(creds),
                                           "/json/identity.json")) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b'"Scheduler"' in dask_ident, dask_ident[:300]

        # both clients compute on the same nodes
        dask = c.client()
        try:
            assert dask.submit(sum, range(100)).result(timeout=60) == 4950
        finally:
            dask.close()
        spark = c.spark()
        assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
        app_id = spark.sparkContext.applicationId

        server = _start_server(tmp_path, "server", [
            "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"],
            {"HUAWEICLOUD_CREDENTIALS_FILE": str(hwc.dir / "credentials")})
        prefix = f"/cloudtik/spark/{name}/"
        base = server.url.rstrip("/") + prefix
        listed = server.get(f"clusters/{name}").json()
        assert listed["spark_ui_link"] == prefix  # the panel's "Spark UI" link
        assert listed["dashboard_link"] == f"/cloudtik/dashboard/{name}/status"

        # the master page, its workers, its links under the route
        page = requests.get(base, headers=server.headers(), timeout=60)
        assert page.status_code == 200, page.text[:500]
        assert re.search(r"Workers:</strong>\s*1 Alive", page.text), page.text[:3000]
        assert f'href="{prefix}static/' in page.text and app_id in page.text
        state = requests.get(base + "json/", headers=server.headers(), timeout=60).json()
        assert state["url"] == extra["spark"]["master_url"] and state["aliveworkers"] == 1
        # the running application's UI (the driver in this process), through the master
        jobs = requests.get(base + f"proxy/{app_id}/", headers=server.headers(), timeout=60)
        assert jobs.status_code == 200, jobs.text[:500]
        assert urlsplit(jobs.url).path.startswith(f"{prefix}proxy/{app_id}/jobs"), jobs.url
        assert "Completed Jobs" in jobs.text, jobs.text[:2000]
        # ...and Dask's dashboard of the same cluster through the same relay
        dash = requests.get(f"{server.url}cloudtik/dashboard/{name}/json/identity.json",
                            headers=server.headers(), timeout=60)
        assert dash.status_code == 200 and dash.json()["type"] == "Scheduler", dash.text

        # an attacker's view: no login, then hostile names and paths; nothing reaches
        # another host (the canary)
        anon = requests.get(base, allow_redirects=False, timeout=30)
        assert anon.status_code in (302, 403) and "Spark Master" not in anon.text
        canary = Canary()
        other_host = f"127.0.0.1:{canary.port}"
        hostile = [
            "/cloudtik/spark/../api/status", "/cloudtik/spark/%2e%2e/",
            f"/cloudtik/spark/{other_host}/", f"/cloudtik/spark/{name}%2F..%2Fother/",
            "/cloudtik/spark/..%2F..%2Fapi%2Fstatus", "/cloudtik/spark/someone-elses/",
            f"/cloudtik/spark/{name}/../../api/status",
            f"/cloudtik/spark/{name}/..%2F..%2F..%2Fetc%2Fpasswd",
            f"/cloudtik/spark/{name}/http://{other_host}/x",
            f"/cloudtik/spark/{name}//{other_host}/x",
            f"/cloudtik/spark/{name}/proxy/http:%2F%2F{other_host}/",
            f"/cloudtik/spark/{name}/proxy/{other_host}/",
            f"/cloudtik/spark/http:%2F%2F{other_host}/",
        ]
        answers = {p: _raw_get(server.url, p, server.headers()) for p in hostile}
        assert not {p: s for p, s in answers.items() if not 400 <= s < 500}, answers
        # (Spark's master would serve its own page for "//host/x": refused before it)
        assert answers[f"/cloudtik/spark/{name}//{other_host}/x"] == 400, answers
        # an absolute URL as the request target: this server's own route, not that host
        assert _raw_get(server.url, f"http://{other_host}{prefix}json/",
                        server.headers()) in (200, 400, 404)
        assert canary.hits == 0, answers

        spark.stop()
        spark = None
        stop_s = time.monotonic()
        c.down(progress=False)
        print(f"spark UI on huaweicloud: up {up_s:.1f}s, down {time.monotonic() - stop_s:.1f}s,"
              f" module {time.monotonic() - t_start:.1f}s")
        assert not [p for p in jvms if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        gone = requests.get(base, headers=server.headers(), timeout=30)
        assert gone.status_code == 404 and gone.json()["reason"] == "not_found"
        assert "servers" not in leftovers(hwc, ws)
        Workspace.get(ws, backend=backend).delete(progress=False)
        assert leftovers(hwc, ws) == {}
    finally:
        if spark is not None:
            spark.stop()
        if canary is not None:
            canary.close()
        problems = _stop(server) if server is not None else []
        try:
            if backend.get(name).state != "stopped":
                Cluster(name, backend).down(progress=False)
        except Exception:  # never there, or already down
            pass
        backend.runner.stop()
    assert not problems, problems
