"""A loopback HTTP/2 upstream over TLS (ALPN h2) for egress tests: answers every request
with JSON of the headers it received and records them."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import uuid

import h2.config
import h2.connection
import h2.events

from cloudtik_emulators.upstreams import RECORDS


class H2Upstream:
    def __init__(self, ctx: ssl.SSLContext) -> None:
        ctx.set_alpn_protocols(["h2"])
        self.ctx = ctx
        self.requests: list[list[tuple[str, str]]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            raw.settimeout(10)
            tls = self.ctx.wrap_socket(raw, server_side=True)
            if tls.selected_alpn_protocol() != "h2":
                tls.close()
                return
            h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
            h2c.initiate_connection()
            tls.sendall(h2c.data_to_send())
            while True:
                data = tls.recv(65536)
                if not data:
                    return
                for ev in h2c.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        headers = [(k.decode() if isinstance(k, bytes) else k,
                                    v.decode() if isinstance(v, bytes) else v)
                                   for k, v in ev.headers]
                        self.requests.append(headers)
                        record = {"headers": headers, "http": "2", "record": uuid.uuid4().hex}
                        RECORDS[record["record"]] = record
                        body = json.dumps(record).encode()
                        h2c.send_headers(ev.stream_id, [
                            (":status", "200"), ("content-type", "application/json"),
                            ("content-length", str(len(body)))])
                        h2c.send_data(ev.stream_id, body, end_stream=True)
                tls.sendall(h2c.data_to_send())

    def close(self) -> None:
        self.sock.close()
