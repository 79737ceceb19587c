"""OIDC client-credentials tokens for backends whose SDK does not fetch its own (ARC).

The token is kept until shortly before it expires; ``invalidate()`` drops it when a
service refuses it (key rotation, revocation), so the next call gets a fresh one.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import time
import urllib.parse

from ..core.errors import BackendUnavailable, ProviderError


class _TokenConnection(http.client.HTTPConnection):
    """HTTP(S) to the token service whose opening (TCP connect, then the TLS handshake)
    has its own short limit, ``connect_timeout``: a service that accepts the connection
    but never completes TLS costs that, not the 30 s read ``timeout`` (as the CE's own
    connection, arc.py ``_Connection``)."""

    def __init__(self, uri: str, host: str, port: int, context: ssl.SSLContext | None,
                 timeout: float, connect_timeout: float) -> None:
        super().__init__(host, port, timeout=connect_timeout)
        self.uri, self.context, self.read_timeout = uri, context, timeout

    def connect(self) -> None:
        n = f"{self.timeout:g}"
        try:
            super().connect()  # TCP, within connect_timeout (self.timeout)
        except TimeoutError:
            raise BackendUnavailable(f"the token service at {self.uri} did not accept a "
                                     f"connection within {n} s") from None
        if self.context is not None:
            try:
                self.sock = self.context.wrap_socket(self.sock, server_hostname=self.host)
            except TimeoutError:
                self.close()
                raise BackendUnavailable(f"the token service at {self.uri} did not "
                                         f"complete TLS within {n} s") from None
            except BaseException:
                self.close()
                raise
        self.sock.settimeout(self.read_timeout)


class ClientCredentials:
    def __init__(self, token_uri: str, client_id: str, client_secret: str,
                 scope: str | None = None, timeout: float = 30.0,
                 min_validity: float = 10.0, context: ssl.SSLContext | None = None,
                 connect_timeout: float | None = None) -> None:
        self.token_uri, self.client_id = token_uri, client_id
        self._secret = client_secret
        self.scope, self.timeout, self.min_validity = scope, timeout, min_validity
        #: the connect and TLS handshake's own limit (never more than ``timeout``)
        self.connect_timeout = min(connect_timeout or timeout, timeout)
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()
        self.context = context  # None: the system's trust store

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        u = urllib.parse.urlsplit(self.token_uri)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ProviderError(f"token_uri {self.token_uri!r} is not an http(s) URL")
        https = u.scheme == "https"
        ctx = (self.context or ssl.create_default_context()) if https else None
        conn = _TokenConnection(self.token_uri, u.hostname, u.port or (443 if https else 80),
                                ctx, self.timeout, self.connect_timeout)
        try:
            path = u.path or "/"
            conn.request("POST", path + (f"?{u.query}" if u.query else ""), body=body,
                         headers={**headers, "Host": u.netloc})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def token(self) -> str:
        with self._lock:
            if self._token and time.time() < self._expires - self.min_validity:
                return self._token
            form = {"grant_type": "client_credentials"}
            if self.scope:
                form["scope"] = self.scope
            basic = base64.b64encode(f"{self.client_id}:{self._secret}".encode()).decode()
            try:
                status, raw = self._post(
                    urllib.parse.urlencode(form).encode(),
                    {"Content-Type": "application/x-www-form-urlencoded",
                     "Authorization": f"Basic {basic}", "Accept": "application/json"})
            except ssl.SSLCertVerificationError as e:
                raise ProviderError(
                    f"the token service's certificate is not trusted "
                    f"({e.verify_message}); add its CA to the backend's "
                    f"ca_certificates") from None
            except (OSError, TimeoutError, http.client.HTTPException) as e:
                raise BackendUnavailable(f"cannot reach the token service: {e}") from None
            if status >= 500 or status == 429:
                raise BackendUnavailable(f"the token service answered {status}")
            if status >= 400:
                raise ProviderError(
                    f"the token service refused the client credentials of '{self.client_id}' "
                    f"(HTTP {status}); check client_id and the client_secret secret")
            try:
                data = json.loads(raw)
                self._token = data["access_token"]
            except (ValueError, KeyError, TypeError):
                raise BackendUnavailable(f"the token service answered HTTP {status} "
                                         "without an access_token") from None
            self._expires = time.time() + float(data.get("expires_in", 300))
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token = None
