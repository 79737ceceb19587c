"""The secret store: credentials encrypted at rest, never shown back.

Secrets (storage passwords, cloud access keys, SSH private keys, tokens) are kept in the
state database encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``).
The key comes from ``CLOUDTIK_SECRET_KEY`` (for deployments that hold keys elsewhere) or from
``<state_dir>/secret.key``, created 0600 on first use.  ``rotate_key`` re-encrypts every
secret under a new key; old keys stay readable through ``MultiFernet`` until rotation ends,
so a crash mid-rotation loses nothing.

An admin may keep the values in HashiCorp Vault (KV version 2) instead: with
``c.VaultSecrets.enabled = True`` (or ``CLOUDTIK_SECRET_BACKEND=vault``) every scope is one
Vault secret at ``<mount_point>/<path_prefix>/<scope with ':' as '/'>`` holding name -> value;
nothing is written to the state database then.  ``open_secret_store`` picks the backend.

Values are written by ``(scope, name)`` (e.g. ``("storage:mydata", "secret_access_key")``)
and read back only with ``reveal(grant)``: a ``Grant`` made by the access policy
(``core/grants.py``) for a caller allowed to use the item, or for the service's own use.
There is no other way to read a value (``tests/test_grants.py`` checks every module).
Answers show ``REDACTED`` wherever a value would appear.  ``Redactor`` scrubs known values
out of text (log lines, error messages, subprocess output) as a last line of defence.
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
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from traitlets import Bool, Unicode, default
from traitlets.config import Configurable

from . import env
from .errors import CloudTikError, ConfigError, NotFoundError, PermissionDeniedError
from .grants import Grant
from .store import Store

log = logging.getLogger(__name__)

REDACTED = "<secret>"
KEY_ENV = env.SECRET_KEY
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

    def __init__(self, store: Store, key: str | bytes | None = None,
                 backend: VaultBackend | None = None) -> None:
        self.store = store
        store.ensure_schema("secrets", SECRET_MIGRATIONS)
        self._explicit_key = key
        self._lock = threading.Lock()
        self.backend = backend

    def daemon_env(self) -> dict[str, str]:
        """What a daemon of ours (started with a scrubbed environment) needs to read secrets."""
        if self.backend is not None:
            return self.backend.daemon_env()
        if isinstance(self._explicit_key, str):
            return {KEY_ENV: self._explicit_key}
        return {KEY_ENV: os.environ[KEY_ENV]} if os.environ.get(KEY_ENV) else {}

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
        if self.backend is not None:
            self.backend.put(scope, name, value)
            return
        token = self._fernet().encrypt(value.encode())
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO secrets (scope, name, ciphertext, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT(scope, name) DO UPDATE SET"
                " ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
                (scope, name, token, now, now),
            )

    def reveal(self, grant: Any, name: str | None = None) -> Any:
        """The values of the grant's item (``{name: value}``), or one of them (None if it
        has no such value): the only way to read a secret.  ``grant`` must come from the
        access policy (``core.grants``); anything else is refused."""
        if not isinstance(grant, Grant) or not grant.sealed():
            raise PermissionDeniedError("secrets are handed out only against a grant of the "
                                        "access policy (core/grants.py)", field="grant")
        values = self._read_all(grant.scope)
        return values if name is None else values.get(name)

    def _read(self, scope: str, name: str) -> str:
        if self.backend is not None:
            return self.backend.get(scope, name)
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

    def _read_all(self, scope: str) -> dict[str, str]:
        if self.backend is not None:
            return self.backend.get_all(scope)
        return {n: self._read(scope, n) for n in self.names(scope)}

    def has(self, scope: str, name: str) -> bool:
        if self.backend is not None:
            return name in self.backend.get_all(scope)
        return self.store.query_one(
            "SELECT 1 FROM secrets WHERE scope = ? AND name = ?", (scope, name)) is not None

    def names(self, scope: str) -> list[str]:
        if self.backend is not None:
            return sorted(self.backend.get_all(scope))
        return [r[0] for r in self.store.query(
            "SELECT name FROM secrets WHERE scope = ? ORDER BY name", (scope,))]

    def delete(self, scope: str, name: str | None = None) -> int:
        """Delete one secret, or every secret of ``scope`` when ``name`` is None."""
        if self.backend is not None:
            return self.backend.delete(scope, name)
        with self.store.transaction() as conn:
            if name is None:
                cur = conn.execute("DELETE FROM secrets WHERE scope = ?", (scope,))
            else:
                cur = conn.execute(
                    "DELETE FROM secrets WHERE scope = ? AND name = ?", (scope, name))
            return cur.rowcount

    def rename_scope(self, old: str, new: str) -> int:
        """Move every value of scope ``old`` to ``new`` (values are not decrypted)."""
        if self.backend is not None:
            values = self.backend.get_all(old)
            for name, value in values.items():
                self.backend.put(new, name, value)
            self.backend.delete(old)
            return len(values)
        with self.store.transaction() as conn:
            return conn.execute("UPDATE secrets SET scope = ? WHERE scope = ?",
                                (new, old)).rowcount

    def rotate_key(self) -> int:
        """Encrypt every secret under a fresh key; returns how many were re-encrypted.

        Only for the key file (a key given through the environment is rotated by whoever
        manages it: put ``NEW,OLD`` in ``CLOUDTIK_SECRET_KEY``, call this, then drop OLD).
        """
        if self.backend is not None:
            return 0  # Vault encrypts with its own keys and rotates them itself
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
            scopes = (self.backend.scopes() if self.backend is not None else
                      [r[0] for r in self.store.query("SELECT DISTINCT scope FROM secrets")])
        values = []
        for scope in scopes:
            values.extend(self._read_all(scope).values())
        return Redactor(values)

    def live_redactor(self) -> LiveRedactor:
        """A redactor of every secret in this store that follows it as secrets are added,
        changed or removed (for messages a feature records: job reasons, events)."""
        return LiveRedactor(self)

    def _stamp(self) -> Any:
        """Changes whenever a secret is added, changed or removed (Vault: every minute)."""
        if self.backend is not None:
            return int(time.time() // 60)
        return tuple(self.store.query(
            "SELECT count(*), max(updated_at), sum(length(ciphertext)) FROM secrets")[0])


BACKEND_ENV = env.SECRET_BACKEND


class VaultSecrets(Configurable):
    """``c.VaultSecrets.*``: keep secrets in HashiCorp Vault (KV v2) through ``hvac``."""

    enabled = Bool(help=f"Use Vault instead of the encrypted table (env {BACKEND_ENV}=vault)."
                   ).tag(config=True)
    url = Unicode(help="Vault address; default $VAULT_ADDR.").tag(config=True)
    token = Unicode(help="Vault token; default $VAULT_TOKEN (prefer the environment)."
                    ).tag(config=True)
    mount_point = Unicode(help="Mount point of the KV v2 engine (default 'secret', env "
                               "CLOUDTIK_VAULT_MOUNT).").tag(config=True)
    path_prefix = Unicode(help="Folder of our secrets inside the engine (default "
                               "'jupyter-cloudtik', env CLOUDTIK_VAULT_PREFIX)."
                          ).tag(config=True)
    namespace = Unicode("", help="Vault Enterprise namespace, if any.").tag(config=True)
    verify = Bool(True, help="Verify Vault's TLS certificate.").tag(config=True)

    @default("enabled")
    def _default_enabled(self) -> bool:
        return os.environ.get(BACKEND_ENV, "").lower() == "vault"

    @default("url")
    def _default_url(self) -> str:
        return os.environ.get("VAULT_ADDR", "")

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("VAULT_TOKEN", "")

    @default("mount_point")
    def _default_mount(self) -> str:
        return os.environ.get(env.VAULT_MOUNT, "secret")

    @default("path_prefix")
    def _default_prefix(self) -> str:
        return os.environ.get(env.VAULT_PREFIX, "jupyter-cloudtik")


class VaultBackend:
    """Secrets as Vault KV v2 entries: one Vault secret per scope, names as its keys."""

    def __init__(self, url: str, token: str, mount_point: str = "secret",
                 path_prefix: str = "jupyter-cloudtik", namespace: str = "",
                 verify: bool = True) -> None:
        try:
            import hvac
        except ImportError:
            raise ConfigError("c.VaultSecrets.enabled: the 'hvac' package is not installed "
                              "(pip install 'jupyter_cloudtik[vault]')",
                              field="VaultSecrets.enabled") from None
        if not url:
            raise ConfigError("c.VaultSecrets.url: missing (or set VAULT_ADDR)",
                              field="VaultSecrets.url")
        self.url, self.token = url, token
        self.mount_point = mount_point.strip("/")
        self.prefix = path_prefix.strip("/")
        self.namespace = namespace
        self._hvac = hvac
        self.client = hvac.Client(url=url, token=token, namespace=namespace or None,
                                  verify=verify)

    def daemon_env(self) -> dict[str, str]:
        return {BACKEND_ENV: "vault", "VAULT_ADDR": self.url, "VAULT_TOKEN": self.token,
                env.VAULT_MOUNT: self.mount_point, env.VAULT_PREFIX: self.prefix}

    def _path(self, scope: str) -> str:
        return f"{self.prefix}/{scope.replace(':', '/')}"

    def _call(self, fn, *args: Any, **kw: Any) -> Any:
        exc = self._hvac.exceptions
        try:
            return fn(*args, **kw)
        except exc.InvalidPath:
            return None
        except (exc.Forbidden, exc.Unauthorized) as e:
            raise SecretStoreError(f"Vault at {self.url} refused the token: {e.errors or e}"
                                   ) from None
        except exc.VaultError as e:
            raise SecretStoreError(f"Vault at {self.url} failed: {e.errors or e}") from None
        except OSError as e:  # requests' connection errors
            raise SecretStoreError(f"cannot reach Vault at {self.url}: {e}") from None

    def get_all(self, scope: str) -> dict[str, str]:
        kv = self.client.secrets.kv.v2
        resp = self._call(kv.read_secret_version, path=self._path(scope),
                          mount_point=self.mount_point, raise_on_deleted_version=False)
        data = ((resp or {}).get("data") or {}).get("data") or {}
        return {str(k): str(v) for k, v in data.items()}

    def get(self, scope: str, name: str) -> str:
        data = self.get_all(scope)
        if name not in data:
            raise NotFoundError(f"no secret '{name}' in {scope}", field=name)
        return data[name]

    def put(self, scope: str, name: str, value: str) -> None:
        data = self.get_all(scope)
        data[name] = value
        self._call(self.client.secrets.kv.v2.create_or_update_secret, path=self._path(scope),
                   secret=data, mount_point=self.mount_point)

    def delete(self, scope: str, name: str | None = None) -> int:
        data = self.get_all(scope)
        kv = self.client.secrets.kv.v2
        if name is None or set(data) <= {name}:
            count = len(data) if name is None else int(name in data)
            if data:
                self._call(kv.delete_metadata_and_all_versions, path=self._path(scope),
                           mount_point=self.mount_point)
            return count
        if name not in data:
            return 0
        del data[name]
        self._call(kv.create_or_update_secret, path=self._path(scope), secret=data,
                   mount_point=self.mount_point)
        return 1

    def scopes(self) -> list[str]:
        out: list[str] = []

        def walk(rel: str) -> None:
            resp = self._call(self.client.secrets.kv.v2.list_secrets,
                              path=f"{self.prefix}/{rel}".rstrip("/"),
                              mount_point=self.mount_point)
            for key in ((resp or {}).get("data") or {}).get("keys") or []:
                if key.endswith("/"):
                    walk(rel + key)
                else:
                    out.append((rel + key).replace("/", ":"))

        walk("")
        return out


def open_secret_store(settings: Any, store: Store) -> SecretStore:
    """The secret store the admin chose: the encrypted table, or Vault."""
    vault = VaultSecrets(parent=settings)
    if not vault.enabled:
        return SecretStore(store)
    return SecretStore(store, backend=VaultBackend(
        vault.url, vault.token, vault.mount_point, vault.path_prefix, vault.namespace,
        vault.verify))


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


class LiveRedactor:
    """Redacts with every value of a secret store, rebuilt when the store changes.  Fails
    closed: when the values cannot be read (no key here), a message is withheld, since
    nothing could be checked in it."""

    WITHHELD = "(message withheld: the secrets it might quote cannot be read to redact it)"

    def __init__(self, secrets: SecretStore) -> None:
        self._secrets = secrets
        self._lock = threading.Lock()
        self._stamp: Any = None
        self._redactor: Redactor | None = None

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        try:
            with self._lock:
                stamp = self._secrets._stamp()
                if self._redactor is None or stamp != self._stamp:
                    self._redactor, self._stamp = self._secrets.redactor(), stamp
                redactor = self._redactor
        except Exception:
            log.warning("cannot read the secrets to redact a message; withholding it")
            return self.WITHHELD
        return redactor(text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secret values from every record it sees."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception as e:
            # a message whose arguments do not fit: left as it is, the handler would print
            # its format and arguments unredacted ("--- Logging error ---"), so the record
            # is made into redacted text here
            try:
                message = (f"{record.msg} (log arguments {record.args!r} do not fit: "
                           f"{type(e).__name__})")
            except Exception:
                message = "(a log record that cannot be shown)"
            record.msg, record.args = self.redactor(message), ()
            return True
        cleaned = self.redactor(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True
