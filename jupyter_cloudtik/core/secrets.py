"""The secret store: credentials encrypted at rest, never shown back.

Secrets (storage passwords, cloud access keys, SSH private keys, tokens) are kept in the
state database encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``).
The key comes from ``CLOUDTIK_SECRET_KEY`` (for deployments that hold keys elsewhere) or from
``<state_dir>/secret.key``, created 0600 on first use.  ``rotate_key`` re-encrypts every
secret under a new key; old keys stay readable through ``MultiFernet`` until rotation ends,
so a crash mid-rotation loses nothing.

Callers refer to secrets by ``(scope, name)`` (e.g. ``("storage:mydata", "secret_access_key")``)
and show ``REDACTED`` wherever a value would appear.  ``Redactor`` scrubs known values out of
text (log lines, error messages, subprocess output) as a last line of defence.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from .errors import CloudTikError, ConfigError, NotFoundError
from .store import Store

REDACTED = "<secret>"
KEY_ENV = "CLOUDTIK_SECRET_KEY"
KEY_FILE = "secret.key"

SECRET_MIGRATIONS = [
    """
    CREATE TABLE secrets (
        scope TEXT NOT NULL,
        name TEXT NOT NULL,
        ciphertext BLOB NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (scope, name)
    );
    """,
]


class SecretStoreError(CloudTikError):
    reason = "secret_store"


class SecretStore:
    """Encrypted (scope, name) -> value storage in the state database."""

    def __init__(self, store: Store, key: str | bytes | None = None) -> None:
        self.store = store
        store.ensure_schema("secrets", SECRET_MIGRATIONS)
        self._explicit_key = key
        self._lock = threading.Lock()

    # keys ---------------------------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        return self.store.state_dir / KEY_FILE

    def _keys(self) -> list[bytes]:
        if self._explicit_key:
            raw = self._explicit_key
            return [k.encode() if isinstance(k, str) else k for k in _split_keys(raw)]
        env = os.environ.get(KEY_ENV)
        if env:
            return [k.encode() for k in _split_keys(env)]
        return self._file_keys(create=True)

    def _file_keys(self, create: bool) -> list[bytes]:
        path = self.key_path
        with self._lock:
            if not path.exists():
                if not create:
                    return []
                key = Fernet.generate_key()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, key + b"\n")
                finally:
                    os.close(fd)
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                raise SecretStoreError(
                    f"the secret key file {path} is readable by others (mode {mode:o}); "
                    f"run `chmod 600 {path}`"
                )
            keys = [line.strip() for line in path.read_bytes().splitlines() if line.strip()]
        if not keys:
            raise SecretStoreError(f"the secret key file {path} is empty")
        return keys

    def _fernet(self) -> MultiFernet:
        try:
            return MultiFernet([Fernet(k) for k in self._keys()])
        except (ValueError, TypeError) as e:
            raise SecretStoreError(
                f"the secret key is not a valid Fernet key ({KEY_ENV} or {self.key_path}): "
                "expected 32 url-safe base64-encoded bytes"
            ) from e

    # values -------------------------------------------------------------------------------
    def put(self, scope: str, name: str, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: a secret must be text", field=name)
        token = self._fernet().encrypt(value.encode())
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO secrets (scope, name, ciphertext, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT(scope, name) DO UPDATE SET"
                " ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
                (scope, name, token, now, now),
            )

    def get(self, scope: str, name: str) -> str:
        row = self.store.query_one(
            "SELECT ciphertext FROM secrets WHERE scope = ? AND name = ?", (scope, name))
        if row is None:
            raise NotFoundError(f"no secret '{name}' in {scope}", field=name)
        try:
            return self._fernet().decrypt(bytes(row[0])).decode()
        except InvalidToken:
            raise SecretStoreError(
                f"the secret '{name}' of {scope} cannot be decrypted with the current key "
                f"({KEY_ENV} or {self.key_path}); was the key replaced?"
            ) from None

    def get_all(self, scope: str) -> dict[str, str]:
        return {n: self.get(scope, n) for n in self.names(scope)}

    def has(self, scope: str, name: str) -> bool:
        return self.store.query_one(
            "SELECT 1 FROM secrets WHERE scope = ? AND name = ?", (scope, name)) is not None

    def names(self, scope: str) -> list[str]:
        return [r[0] for r in self.store.query(
            "SELECT name FROM secrets WHERE scope = ? ORDER BY name", (scope,))]

    def delete(self, scope: str, name: str | None = None) -> int:
        """Delete one secret, or every secret of ``scope`` when ``name`` is None."""
        with self.store.transaction() as conn:
            if name is None:
                cur = conn.execute("DELETE FROM secrets WHERE scope = ?", (scope,))
            else:
                cur = conn.execute(
                    "DELETE FROM secrets WHERE scope = ? AND name = ?", (scope, name))
            return cur.rowcount

    def rotate_key(self) -> int:
        """Encrypt every secret under a fresh key; returns how many were re-encrypted.

        Only for the key file (a key given through the environment is rotated by whoever
        manages it: put ``NEW,OLD`` in ``CLOUDTIK_SECRET_KEY``, call this, then drop OLD).
        """
        env_keys = self._explicit_key or os.environ.get(KEY_ENV)
        if env_keys:
            fernet = self._fernet()
            return self._reencrypt(fernet)
        old = self._file_keys(create=True)
        new = Fernet.generate_key()
        self._write_keys([new, *old])  # new first: encrypts; old ones still decrypt
        count = self._reencrypt(self._fernet())
        self._write_keys([new])
        return count

    def _reencrypt(self, fernet: MultiFernet) -> int:
        count = 0
        with self.store.transaction() as conn:
            for scope, name, token in conn.execute(
                    "SELECT scope, name, ciphertext FROM secrets").fetchall():
                conn.execute(
                    "UPDATE secrets SET ciphertext = ?, updated_at = ? WHERE scope = ? AND"
                    " name = ?", (fernet.rotate(bytes(token)), time.time(), scope, name))
                count += 1
        return count

    def _write_keys(self, keys: list[bytes]) -> None:
        tmp = self.key_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\n".join(keys) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(self.key_path)

    def redactor(self, scopes: Iterable[str] | None = None) -> Redactor:
        """A Redactor knowing the values of the given scopes (all scopes if None)."""
        if scopes is None:
            scopes = [r[0] for r in self.store.query("SELECT DISTINCT scope FROM secrets")]
        values = []
        for scope in scopes:
            values.extend(self.get_all(scope).values())
        return Redactor(values)


def _split_keys(raw: str | bytes) -> list[str]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return [k.strip() for k in text.split(",") if k.strip()]


def generate_key() -> str:
    return Fernet.generate_key().decode()


class Redactor:
    """Replaces known secret values (and their base64 forms) in text with ``<secret>``."""

    MIN_LENGTH = 4  # shorter values would redact ordinary words

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*values)

    def add(self, *values: str) -> None:
        for v in values:
            if v and len(v) >= self.MIN_LENGTH:
                self._values.add(v)
                self._values.add(base64.b64encode(v.encode()).decode())
        if self._values:
            alts = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in alts))

    def __call__(self, text: str) -> str:
        if not text or self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secret values from every record it sees."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        cleaned = self.redactor(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True
