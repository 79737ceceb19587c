"""Loopback upstream servers for proxy tests: an echo server (plain or TLS) that answers
with the request it received, and a test CA of the upstreams' own (not the deployment CA).

The echo is what a reflecting upstream does, so the egress proxy masks injected values in
it (hub/egress/scrub.py); what the upstream really received is kept here, in this process,
under the answer's ``record`` id: ``received(answer)``."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import ssl
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# -- loopback upstreams ------------------------------------------------------------------
RECORDS: dict[str, dict] = {}


def received(answer) -> dict:
    """What the echo server received for ``answer`` (a ``requests``/``httpx`` response, its
    JSON as a dict, or JSON text): path, method, headers (values as received, unmasked)."""
    if hasattr(answer, "json"):
        answer = answer.json()
    elif isinstance(answer, (str, bytes)):
        answer = json.loads(answer)
    return RECORDS[answer["record"]]


class Echo(BaseHTTPRequestHandler):
    """Answers with what it received: path, headers, body length and digest."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stall

    def _echo(self) -> None:
        body = b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        elif self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        record = {"path": self.path, "method": self.command,
                  "headers": [[k, v] for k, v in self.headers.items()],
                  "body_len": len(body), "body_sha": hashlib.sha256(body).hexdigest(),
                  "record": uuid.uuid4().hex}
        RECORDS[record["record"]] = record
        payload = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(payload), 7):
                piece = payload[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _echo

    def log_message(self, *args) -> None:
        pass


class EchoServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # failed handshakes are part of the tests


def serve(ctx: ssl.SSLContext | None) -> tuple[EchoServer, threading.Thread]:
    srv = EchoServer(("127.0.0.1", 0), Echo)
    if ctx is not None:
        # the handshake runs in the handler thread, not in the accept loop
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    return srv, t


def make_test_ca(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA of the upstreams' own (not the deployment CA) and a server context from it."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test upstream CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_path = directory / "upstream-ca.pem"
    ca_path.write_bytes(ca.public_bytes(pem))
    chain = directory / "upstream-leaf.pem"
    chain.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()) + leaf.public_bytes(pem))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain)
    return ca_path, ctx
