"""The node's start-up helper (userdata.NODE_TOOL), run as a node runs it: a mismatch of
the client's Python is one clear line naming both versions, before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.providers.huaweicloud.userdata import NODE_TOOL
from jupyter_cloudtik.runtime.environment import expected


def _run(tmp_path, *args, env=None):
    tool = tmp_path / "cloudtik_node.py"
    tool.write_text(NODE_TOOL)
    return subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_python_mismatch_is_one_line_naming_both(tmp_path):
    want = expected()
    want["python"] = "3.9"
    p = _run(tmp_path, "runtime", "http://127.0.0.1:9", "m.json", json.dumps(want))
    assert p.returncode == 1
    here = "{}.{}".format(*sys.version_info[:2])
    assert p.stderr.strip() == (f"[cloudtik] version mismatch: this node has Python {here}, "
                                "the client has Python 3.9; use an image with Python 3.9")


def test_matching_environment_needs_nothing(tmp_path):
    p = _run(tmp_path, "runtime", "http://127.0.0.1:9", "m.json", json.dumps(expected()))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("[cloudtik] runtime matches the client: Python ")


def test_missing_package_without_metadata_service_says_so(tmp_path):
    want = expected()
    want["packages"]["dask"] = "0.0.1"
    p = _run(tmp_path, "runtime", "http://127.0.0.1:9", "m.json", json.dumps(want),
             env={"PATH": "/usr/bin:/bin", "CLOUDTIK_OBS_BUCKET": "b",
                  "CLOUDTIK_OBS_ENDPOINT": "http://obs.invalid"})
    assert p.returncode == 1
    assert p.stderr.strip().startswith("[cloudtik] no agency credentials from the metadata "
                                       "service"), p.stderr


def _answering(text: bytes):
    """A one-line TCP server on the loopback answering ``text`` to every connection."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(text)

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_web_ui_relay_routes_by_alpn_and_requires_the_clusters_certificate(tmp_path):
    """The head's relay (port 8788 on a cloud head) in front of two UIs: Dask's dashboard
    for a client that offers no ALPN (the dashboard proxy), the Spark master's UI for one
    offering ``cloudtik-spark`` (the Spark UI proxy); no client certificate, or another
    cluster's, is refused in the handshake; it ends with the last runtime it watches."""
    import socket
    import ssl
    import time

    from jupyter_cloudtik.providers.huaweicloud.userdata import RELAY_ROUTES, relay_command
    from jupyter_cloudtik.runtime.spark import NODE_UI_PORT
    from jupyter_cloudtik.runtime.tls import SPARK_UI_ALPN, client_ssl_context, make_cluster_tls

    assert RELAY_ROUTES["spark"] == NODE_UI_PORT
    # what the user data runs on a head of each runtime set (one relay, one port)
    assert "dask:8787 " in relay_command(["dask"]) and "spark" not in relay_command(["dask"])
    assert " spark:8080 " in relay_command(["spark"])
    both = relay_command(["dask", "spark"])
    assert " 8788 dask:8787,spark:8080 " in both
    assert both.index("spark.pid") < both.index("dask.pid")  # the scheduler's pid last
    assert relay_command(["ray"]) == ""

    tls = make_cluster_tls("relay")
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for name, text in (("ca", tls.ca), ("cert", tls.node_cert), ("key", tls.node_key)):
        (tls_dir / f"{name}.pem").write_text(text)
    dask_ui, spark_ui = _answering(b"dask dashboard"), _answering(b"spark master")
    port = ports.free_port()
    watched = subprocess.Popen(["sleep", "60"])
    tool = tmp_path / "cloudtik_node.py"
    tool.write_text(NODE_TOOL)
    routes = f"dask:{dask_ui.getsockname()[1]},spark:{spark_ui.getsockname()[1]}"
    relay = subprocess.Popen([sys.executable, str(tool), "dashboard-relay", "127.0.0.1",
                              str(port), routes, str(tls_dir), str(watched.pid)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "web UI relay (mutual TLS)" in relay.stdout.readline()

        def ask(ctx: ssl.SSLContext) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                    ctx.wrap_socket(raw) as conn:
                conn.settimeout(5)
                conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                return conn.recv(1024)

        creds = tls.client_credentials()
        assert ask(client_ssl_context(creds)) == b"dask dashboard"
        assert ask(client_ssl_context(creds, alpn=SPARK_UI_ALPN)) == b"spark master"
        assert ask(client_ssl_context(creds, alpn="cloudtik-other")) == b"dask dashboard"
        no_cert = ssl.create_default_context(cadata=tls.ca)
        no_cert.check_hostname = False
        other = make_cluster_tls("relay")
        foreign = client_ssl_context({"ca": tls.ca, "cert": other.client_cert,
                                      "key": other.client_key}, alpn=SPARK_UI_ALPN)
        for ctx in (no_cert, foreign):
            try:
                answer = ask(ctx)
            except (ssl.SSLError, OSError):
                answer = b""
            assert answer == b"", answer  # refused before a byte reaches a UI
        watched.kill()
        watched.wait()
        assert relay.wait(15) == 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the relay still listens after its runtimes ended")
    finally:
        watched.kill()
        relay.kill()
        relay.wait()
        dask_ui.close()
        spark_ui.close()
