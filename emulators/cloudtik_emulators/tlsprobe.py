"""Knock on a Dask scheduler the ways an attacker would; every attempt must be refused.

``attempts(address, ca)`` tries: a plain ``tcp://`` Dask client; a raw TLS connection
without a client certificate that then speaks (the server must end it); and, given one,
a Dask client presenting a certificate of *another* CA.  Run as
``python -m cloudtik_emulators.tlsprobe ADDRESS CA_FILE [CERT KEY]`` (e.g. inside a
network namespace, "from another machine"); prints a JSON object label -> outcome.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys


def _host_port(address: str) -> tuple[str, int]:
    hp = address.split("://", 1)[-1]
    host, port = hp.rsplit(":", 1)
    return host.strip("[]"), int(port)


def attempts(address: str, ca_file: str, cert: str | None = None,
             key: str | None = None) -> dict[str, str]:
    from distributed import Client
    from distributed.security import Security

    host, port = _host_port(address)
    out: dict[str, str] = {}

    def dask(label: str, addr: str, **kw) -> None:
        try:
            with Client(addr, timeout=4, **kw) as c:
                out[label] = "connected: " + str(c.submit(pow, 6, 2).result(timeout=10))
        except Exception as e:
            out[label] = f"refused: {type(e).__name__}"

    dask("plain", f"tcp://{host}:{port}")
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False
    try:
        with socket.create_connection((host, port), timeout=4) as raw, \
                ctx.wrap_socket(raw) as s:
            s.settimeout(4)
            s.sendall(b"\x00" * 64)
            data = s.recv(1024)
            out["tls-no-cert"] = "refused: closed" if not data else f"answered {data[:20]!r}"
    except (OSError, ssl.SSLError) as e:
        out["tls-no-cert"] = f"refused: {type(e).__name__}"
    if cert and key:
        dask("tls-other-ca", f"tls://{host}:{port}", security=Security(
            tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
            require_encryption=True))
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(attempts(*args)))
