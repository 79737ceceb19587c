"""OIDC client-credentials tokens for backends whose SDK does not fetch its own (ARC).

The token is kept until shortly before it expires; ``invalidate()`` drops it when a
service refuses it (key rotation, revocation), so the next call gets a fresh one.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from ..core.errors import ProviderError
from .base import BackendUnavailable


class ClientCredentials:
    def __init__(self, token_uri: str, client_id: str, client_secret: str,
                 scope: str | None = None, timeout: float = 30.0,
                 min_validity: float = 10.0, context: ssl.SSLContext | None = None) -> None:
        self.token_uri, self.client_id = token_uri, client_id
        self._secret = client_secret
        self.scope, self.timeout, self.min_validity = scope, timeout, min_validity
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()
        self.context = context  # None: the system's trust store

    def token(self) -> str:
        with self._lock:
            if self._token and time.time() < self._expires - self.min_validity:
                return self._token
            form = {"grant_type": "client_credentials"}
            if self.scope:
                form["scope"] = self.scope
            basic = base64.b64encode(f"{self.client_id}:{self._secret}".encode()).decode()
            req = urllib.request.Request(
                self.token_uri, data=urllib.parse.urlencode(form).encode(), method="POST",
                headers={"Content-Type": "application/x-www-form-urlencoded",
                         "Authorization": f"Basic {basic}"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout,
                                        context=self.context) as resp:
                    data = json.loads(resp.read())
            except urllib.error.HTTPError as e:
                if e.code >= 500 or e.code == 429:
                    raise BackendUnavailable(f"the token service answered {e.code}") from None
                raise ProviderError(
                    f"the token service refused the client credentials of '{self.client_id}' "
                    f"(HTTP {e.code}); check client_id and the client_secret secret") from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, ssl.SSLCertVerificationError):
                    raise ProviderError(
                        f"the token service's certificate is not trusted "
                        f"({e.reason.verify_message}); add its CA to the backend's "
                        f"ca_certificates") from None
                raise BackendUnavailable(f"cannot reach the token service: {e}") from None
            except (OSError, TimeoutError) as e:
                raise BackendUnavailable(f"cannot reach the token service: {e}") from None
            self._token = data["access_token"]
            self._expires = time.time() + float(data.get("expires_in", 300))
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token = None
