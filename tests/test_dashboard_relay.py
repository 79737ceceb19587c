"""The web UI relay waits briefly for a UI that is not listening yet (a dashboard still
starting after `up` on a busy head), instead of closing the first connection empty."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time

from jupyter_cloudtik.runtime.dashboard_relay import dashboard_relay
from jupyter_cloudtik.runtime.tls import client_ssl_context, make_cluster_tls


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ui_that_starts_late_is_reached(tmp_path):
    tls = make_cluster_tls("relay")
    for name, text in (("ca.pem", tls.ca), ("cert.pem", tls.node_cert),
                       ("key.pem", tls.node_key)):
        (tmp_path / name).write_text(text)
    ui_port = _free_port()
    bound: list[int] = []
    runtime = subprocess.Popen(["sleep", "60"])  # the relay lives as long as its runtime
    relay = threading.Thread(target=dashboard_relay, daemon=True, kwargs={"ready": bound.append},
                             args=("127.0.0.1", 0, ui_port, str(tmp_path), runtime.pid))
    relay.start()
    deadline = time.monotonic() + 10
    while not bound:
        assert time.monotonic() < deadline, "the relay did not start"
        time.sleep(0.02)

    class UI(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"the dashboard")

        def log_message(self, *args):
            pass

    def start_ui_late():
        time.sleep(1.0)  # the client connects first
        ui = http.server.HTTPServer(("127.0.0.1", ui_port), UI)
        ui.timeout = 5
        ui.handle_request()
        ui.server_close()

    late = threading.Thread(target=start_ui_late, daemon=True)
    late.start()
    ctx = client_ssl_context(tls.client_credentials())
    ctx.check_hostname = False
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", bound[0]), timeout=5) as raw, \
            ctx.wrap_socket(raw) as s:
        s.settimeout(15)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert b" 200 " in out.split(b"\r\n", 1)[0] and out.endswith(b"the dashboard"), out
    assert time.monotonic() - t0 >= 0.9  # it did wait for the UI
    late.join(5)
    runtime.kill()
    runtime.wait()
    relay.join(5)
    assert not relay.is_alive(), "the relay outlived its runtime"
