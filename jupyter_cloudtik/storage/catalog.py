"""The storage catalog: named rclone remotes in the state database, credentials apart.

A storage is an rclone backend type, its options, a source path (bucket first), a read-only
flag (on unless asked otherwise) and a mount path inside the user's working folder.  Options
are checked against rclone's own description of the backend (``rclone config providers``),
so the rules are the ones rclone applies — required fields, types, the s3 provider's own
options — and an error names the option.

Options rclone marks ``IsPassword`` or ``Sensitive`` go to the secret store under scope
``storage:NAME``; the ``storages`` row only records their names, and every answer shows
``"<secret>"`` in their place.  Options that would make rclone read this machine's files or
run commands here, and backends that wrap local paths or other remotes, are refused unless
an admin allowed them (``c.Storage.allowed_unsafe_options`` /
``allowed_wrapping_backends``): a storage must not become a way into the server.
"""

from __future__ import annotations

import difflib
import re
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, ConflictError, NotFoundError, PermissionDeniedError
from ..core.grants import Grant, policy_for
from ..core.identity import current_caller
from ..core.locations import contained
from ..core.secrets import REDACTED, SecretStore
from ..core.store import Store, dumps, loads
from .rclone import Backend, BackendOption, Remote, backends, config_value
from .settings import VFS_CACHE_MODES, Storage

STORAGE_MIGRATIONS = [
    """
    CREATE TABLE storages (
        name TEXT PRIMARY KEY,
        backend TEXT NOT NULL,
        options TEXT NOT NULL DEFAULT '{}',
        secret_options TEXT NOT NULL DEFAULT '[]',
        source TEXT NOT NULL DEFAULT '',
        read_only INTEGER NOT NULL DEFAULT 1,
        mount_path TEXT NOT NULL,
        vfs_cache_mode TEXT,
        description TEXT NOT NULL DEFAULT '',
        owner TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE storage_mounts (
        name TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        desired TEXT NOT NULL,
        state TEXT NOT NULL,
        mount_path TEXT NOT NULL,
        pid INTEGER,
        pid_started REAL,
        reason TEXT,
        restarts INTEGER NOT NULL DEFAULT 0,
        last_check REAL,
        mounted_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
NAME_RULE = ("letters, digits, '-' and '_', 1 to 40 characters, starting with a letter or "
             "digit")
SCOPE_PREFIX = "storage:"

WRAPPING_BACKENDS = frozenset({
    "alias", "union", "crypt", "combine", "local", "memory", "chunker", "compress", "hasher",
    "cache", "archive",
})
# Options that read files or sockets on this machine, run commands here, or borrow the
# server's own identity; matched by name or by suffix.
UNSAFE_OPTION_NAMES = frozenset({
    "ssh", "env_auth", "unix_socket", "key_use_agent", "use_unix_socket",
})
UNSAFE_OPTION_SUFFIXES = ("_command", "_file", "_path")
SAFE_DESPITE_SUFFIX = frozenset({"path_override"})

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", ""}
_SIZE_RE = re.compile(r"^(off|-1|\d+(\.\d+)?\s*([bBkKMGTPE](i?[bB]?)?)?)$")
_DURATION_RE = re.compile(
    r"^(off|-?\d+(\.\d+)?|(\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|w|M|y))+)$")


def scope(name: str) -> str:
    return f"{SCOPE_PREFIX}{name}"


def read_only_scope(name: str) -> str:
    """Where a storage's read-only credential is kept (the hub catalogue's
    ``read_only_credentials``): what a node with a read grant receives."""
    return f"storage-read-only:{name}"


class _Asked:
    """The value of an option that will be asked for (a check's ``ask``): its name is
    checked like any option's, its value only by the add that has it."""

    def __repr__(self) -> str:
        return "<asked>"


ASKED: Any = _Asked()


def check_ask(ask: Any) -> list[str]:
    """``ask`` of a check: the names of the options whose values will be asked for."""
    if ask is None:
        return []
    if not isinstance(ask, (list, tuple)) or not all(isinstance(k, str) and k for k in ask):
        raise ConfigError("ask: expected a list of option names", field="ask")
    return list(dict.fromkeys(ask))


def check_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{field}: {name!r} is not a valid storage name; use {NAME_RULE}",
                          field=field, value=name)
    return name


def is_unsafe_option(name: str) -> bool:
    if name in SAFE_DESPITE_SUFFIX:
        return False
    return name in UNSAFE_OPTION_NAMES or name.endswith(UNSAFE_OPTION_SUFFIXES)


@dataclass
class StorageInfo:
    """A storage as every face shows it: secret option values are never in here."""

    name: str
    backend: str
    options: dict[str, Any]
    secret_options: list[str]
    source: str
    read_only: bool
    mount_path: str
    vfs_cache_mode: str | None
    description: str = ""
    owner: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    mount: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = {**self.options, **{k: REDACTED for k in self.secret_options}}
        return d

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.to_dict()["options"].items())
        mount = self.mount or {}
        state = f"; {mount.get('state')} at {mount.get('mount_path')}" if mount else ""
        return (f"storage {self.name!r}: {self.backend} {self.source or '/'} "
                f"({'read-only' if self.read_only else 'read-write'}), mount path "
                f"{self.mount_path}{state}; options: {opts}")

    def _repr_html_(self) -> str:
        import html

        rows = [("name", self.name), ("backend", self.backend), ("source", self.source or "/"),
                ("access", "read-only" if self.read_only else "read-write"),
                ("mount path", self.mount_path),
                ("mount", (self.mount or {}).get("state", "-")),
                *((f"option {k}", v) for k, v in self.to_dict()["options"].items())]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                       for k, v in rows)
        return f"<table>{body}</table>"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StorageInfo:
        d = dict(d)
        secret = set(d.get("secret_options") or [])
        d["options"] = {k: v for k, v in (d.get("options") or {}).items() if k not in secret}
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


@dataclass
class ParsedURL:
    backend: str
    options: dict[str, Any]
    source: str


class StorageCatalog:
    """Storages in the state database; secrets in the secret store."""

    def __init__(self, store: Store, secrets: SecretStore, settings: Storage, binary: str,
                 user: str | None = None) -> None:
        self.store = store
        self.secrets = secrets
        self.settings = settings
        self.binary = binary
        self.user = user
        store.ensure_schema("storage", STORAGE_MIGRATIONS)

    # backends ------------------------------------------------------------------------
    def backends(self) -> dict[str, Backend]:
        return backends(self.binary)

    def allowed_backends(self) -> list[str]:
        out = []
        for name in sorted(self.backends()):
            try:
                self._check_backend_allowed(name)
            except (ConfigError, PermissionDeniedError):
                continue
            out.append(name)
        return out

    def backend_schema(self, backend: str, provider: str | None = None) -> dict[str, Any]:
        """A form description of a backend: options with types, help, secret flags.

        Unsafe options are left out unless allowed; this is what a UI renders.
        """
        b = self._backend(backend)
        opts = []
        for o in b.options.values():
            if o.hide & 1 and not o.required:  # hidden from configurators by rclone
                continue
            if not o.applies_to(provider):
                continue
            if is_unsafe_option(o.name) and not self._unsafe_allowed(o.name):
                continue
            opts.append(o.to_dict())
        return {"backend": b.name, "description": b.description, "providers": b.providers,
                "options": opts}

    def _backend(self, name: Any) -> Backend:
        if not isinstance(name, str) or not name:
            raise ConfigError("backend: missing; name an rclone backend type such as s3, "
                              "webdav or sftp", field="backend")
        known = self.backends()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"backend: {name!r} is not an rclone backend{hint}",
                              field="backend", value=name)
        self._check_backend_allowed(name)
        return known[name]

    def _check_backend_allowed(self, name: str) -> None:
        s = self.settings
        if name in WRAPPING_BACKENDS and name not in s.allowed_wrapping_backends:
            raise PermissionDeniedError(
                f"backend: {name!r} reads this machine's files or other remotes' settings and "
                "is not allowed here (an admin can allow it with "
                "c.Storage.allowed_wrapping_backends)", field="backend", value=name)
        allowed = [*s.allowed_backends, *s.allowed_wrapping_backends]
        if s.allowed_backends and name not in allowed:
            raise PermissionDeniedError(
                f"backend: {name!r} is not allowed here; allowed: "
                f"{', '.join(s.allowed_backends)}", field="backend", value=name)

    def _unsafe_allowed(self, option: str) -> bool:
        allowed = self.settings.allowed_unsafe_options
        return "*" in allowed or option in allowed

    # validation ------------------------------------------------------------------------
    def validate(self, backend: str, options: dict[str, Any], ask: list[str] = ()
                 ) -> tuple[dict[str, str], dict[str, str]]:
        """Check options against rclone's schema; returns (plain options, secret options).

        ``ask``: options whose values are not known yet (a dry run's; they will be asked
        for): their names are checked as the add checks them, their values are ``ASKED``."""
        b = self._backend(backend)
        if not isinstance(options, dict):
            raise ConfigError("options: must be a mapping of option names to values",
                              field="options")
        if ask:  # in the order the add will see them: asked values replace given ones
            options = {**options, **dict.fromkeys(ask, ASKED)}
        provider = options.get("provider")
        if provider is ASKED:
            provider = None
        if provider is not None and "provider" in b.options:
            provider = str(provider)
            valid = b.providers
            if valid and provider not in valid:
                close = difflib.get_close_matches(provider, valid, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(
                    f"options.provider: {provider!r} is not a provider of the {backend} "
                    f"backend{hint}; providers: {', '.join(valid)}",
                    field="options.provider", value=provider)
        plain: dict[str, str] = {}
        secret: dict[str, str] = {}
        for key, value in options.items():
            path = f"options.{key}"
            if not isinstance(key, str) or key not in b.options:
                names = [o for o in b.options if not is_unsafe_option(o)]
                close = difflib.get_close_matches(str(key), names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigError(
                    f"{path}: the {backend} backend has no option {key!r}{hint}",
                    field=path, value=key)
            opt = b.options[key]
            if value is None:
                continue
            asked = value is ASKED
            if is_unsafe_option(key) and (asked or _truthy(value)) and (
                    not self._unsafe_allowed(key)):
                raise PermissionDeniedError(
                    f"{path}: this option makes rclone read files or run commands on this "
                    "machine and is not allowed here (an admin can allow it with "
                    "c.Storage.allowed_unsafe_options)", field=path, value=key)
            if not opt.applies_to(provider):
                raise ConfigError(
                    f"{path}: not an option of provider {provider!r} (it applies to: "
                    f"{', '.join(opt.providers or ())})", field=path, value=key)
            text = ASKED if asked else _check_value(opt, value, path, provider)
            (secret if opt.sensitive else plain)[key] = text
        for opt in b.options.values():
            if opt.required and opt.applies_to(provider) and opt.name not in options and (
                    opt.default in ("", None, [])):
                raise ConfigError(
                    f"options.{opt.name}: required by the {backend} backend "
                    f"({_first_line(opt.help)})", field=f"options.{opt.name}")
        return plain, secret

    def _mount_path(self, name: str, mount_path: str | None) -> str:
        """Mounts live inside the working folder (core.locations.contained)."""
        workdir = Path(self.settings.working_dir).expanduser().resolve()
        if not mount_path:
            return str(workdir / self.settings.mount_root / name)
        real = contained(workdir, mount_path, "mount_path")
        if real == workdir:
            raise ConfigError(f"mount_path: {mount_path!r} is the working folder itself; "
                              "choose a folder inside it", field="mount_path",
                              value=mount_path)
        return str(real)

    # reading ------------------------------------------------------------------------------
    def _row(self, name: str):
        row = self.store.query_one("SELECT * FROM storages WHERE name = ?", (name,))
        if row is None:
            # the hint names only what the caller may use (a hub serves many groups)
            known = policy_for(self.store).visible(current_caller(self.user or ""),
                                                   "storage")
            hint = f"; storages: {', '.join(known)}" if known else "; there are no storages"
            raise NotFoundError(f"no storage named {name!r}{hint}", field="name", value=name)
        return row

    def exists(self, name: str) -> bool:
        return self.store.query_one("SELECT 1 FROM storages WHERE name = ?", (name,)) is not None

    def get(self, name: str) -> StorageInfo:
        return _info(self._row(name))

    def list(self) -> list[StorageInfo]:
        return [_info(r) for r in self.store.query("SELECT * FROM storages ORDER BY name")]

    def remote(self, grant: Grant, *, values: dict[str, str] | None = None) -> Remote:
        """The storage ``grant`` is for as an rclone remote, with its secrets (for config
        files only): ``values`` when the policy chose which (a node's read-only
        credential), else the storage's own."""
        if grant.kind != "storage":
            raise PermissionDeniedError(f"{grant.kind} {grant.name!r} is not a storage",
                                        field="storage", value=grant.name)
        name = grant.name
        row = self._row(name)
        b = self.backends().get(row["backend"])
        if values is None:
            values = self.secrets.reveal(grant)
        options = dict(loads(row["options"], {}))
        secret: dict[str, str] = {}
        for key, value in values.items():
            if key.startswith("__"):
                continue
            # a read-only credential may name the account too (an access key id)
            if b is not None and key in b.options and not b.options[key].sensitive:
                options[key] = value
            else:
                secret[key] = value
        passwords = frozenset(k for k in secret if b and k in b.options and
                              b.options[k].password)
        return Remote(row["backend"], options, secret, passwords)

    def redactor_scopes(self, names: list[str]) -> list[str]:
        return [scope(n) for n in names] + [read_only_scope(n) for n in names]

    # writing ------------------------------------------------------------------------------
    def add(self, name: str, backend: str, options: dict[str, Any] | None = None, *,
            source: str = "", read_only: bool = True, mount_path: str | None = None,
            vfs_cache_mode: str | None = None, description: str = "",
            replace: bool = False,
            read_only_credentials: dict[str, Any] | None = None,
            dry_run: bool = False, ask: list[str] | None = None) -> StorageInfo:
        """``read_only_credentials``: options (an access key id, a secret) that give only
        read access, handed to nodes of users who may only read it (None: keep what was
        there; ``{}``: none).

        ``dry_run``: check everything this add checks and save nothing; the answer is the
        storage as it would be recorded.  ``ask`` (a dry run's only): options whose values
        the add will have but the check does not — their names are checked, they count as
        given, and they are listed in ``secret_options`` when rclone marks them secret."""
        check_name(name)
        ask = check_ask(ask)
        if ask and not dry_run:
            raise ConfigError("ask: only for a dry run; an add takes the values in options",
                              field="ask")
        plain, secret = self.validate(backend, dict(options or {}), ask)
        ro_credentials = None if read_only_credentials is None else \
            self._check_read_only_credentials(backend, read_only_credentials)
        source = _check_source(source)
        mount = self._mount_path(name, mount_path)
        if vfs_cache_mode is not None and vfs_cache_mode not in VFS_CACHE_MODES:
            raise ConfigError(
                f"vfs_cache_mode: {vfs_cache_mode!r} is not one of {', '.join(VFS_CACHE_MODES)}",
                field="vfs_cache_mode", value=vfs_cache_mode)
        if not isinstance(read_only, bool):
            raise ConfigError(f"read_only: {read_only!r} is not true or false",
                              field="read_only")
        if dry_run:
            if self.exists(name) and not replace:
                raise _exists(name)
            return StorageInfo(
                name=name, backend=backend,
                options={k: v for k, v in plain.items() if v is not ASKED},
                secret_options=sorted(secret), source=source, read_only=read_only,
                mount_path=mount, vfs_cache_mode=vfs_cache_mode,
                description=description or "", owner=self.user)
        now = time.time()
        with self.store.transaction() as conn:
            row = conn.execute("SELECT created_at FROM storages WHERE name = ?",
                               (name,)).fetchone()
            if row is not None and not replace:
                raise _exists(name)
            conn.execute(
                "INSERT INTO storages (name, backend, options, secret_options, source,"
                " read_only, mount_path, vfs_cache_mode, description, owner, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET backend = excluded.backend,"
                " options = excluded.options, secret_options = excluded.secret_options,"
                " source = excluded.source, read_only = excluded.read_only,"
                " mount_path = excluded.mount_path, vfs_cache_mode = excluded.vfs_cache_mode,"
                " description = excluded.description, updated_at = excluded.updated_at",
                (name, backend, dumps(plain), dumps(sorted(secret)), source, int(read_only),
                 mount, vfs_cache_mode, description or "", self.user, now, now),
            )
            # secrets are written in the same transaction: a failed add leaves none behind
            self.secrets.delete(scope(name))
            for key, value in secret.items():
                self.secrets.put(scope(name), key, value)
            if ro_credentials is not None or row is None:
                self.secrets.delete(read_only_scope(name))
                for key, value in (ro_credentials or {}).items():
                    self.secrets.put(read_only_scope(name), key, value)
        return self.get(name)

    def _check_read_only_credentials(self, backend: str, creds: Any) -> dict[str, str]:
        """Options of ``backend`` that make a read-only credential: each one must be an
        option of the backend (checked like ``options``), values text."""
        if not isinstance(creds, dict):
            raise ConfigError("read_only_credentials: expected a mapping of the backend's "
                              "options (e.g. access_key_id, secret_access_key)",
                              field="read_only_credentials")
        b = self._backend(backend)
        out: dict[str, str] = {}
        for key, value in creds.items():
            path = f"read_only_credentials.{key}"
            if not isinstance(key, str) or key not in b.options:
                raise ConfigError(f"{path}: the {backend} backend has no option {key!r}",
                                  field=path, value=str(key))
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{path}: expected a non-empty text value", field=path)
            out[key] = value
        return out

    def has_read_only_credentials(self, name: str) -> bool:
        return bool(self.secrets.names(read_only_scope(name)))

    def remove(self, name: str) -> None:
        self._row(name)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM storages WHERE name = ?", (name,))
            self.secrets.delete(scope(name))
            self.secrets.delete(read_only_scope(name))

    # URLs ----------------------------------------------------------------------------------
    def from_url(self, url: str) -> ParsedURL:
        return parse_url(url)


def _exists(name: str) -> ConflictError:
    return ConflictError(f"a storage named {name!r} exists; remove it first or use replace",
                         field="name", value=name)


def _info(row) -> StorageInfo:
    return StorageInfo(
        name=row["name"], backend=row["backend"], options=loads(row["options"], {}),
        secret_options=loads(row["secret_options"], []), source=row["source"],
        read_only=bool(row["read_only"]), mount_path=row["mount_path"],
        vfs_cache_mode=row["vfs_cache_mode"], description=row["description"],
        owner=row["owner"], created_at=row["created_at"], updated_at=row["updated_at"],
    )


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return bool(value)
    return str(value).strip().lower() not in _FALSE


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0].rstrip(".") if text else "no description"


def _check_source(source: Any) -> str:
    if source is None:
        return ""
    if not isinstance(source, str):
        raise ConfigError(f"source: {source!r} is not a path", field="source")
    if any(c in source for c in "\x00\n\r"):
        raise ConfigError("source: must be a single-line path", field="source")
    return source.strip()


def _check_value(opt: BackendOption, value: Any, path: str, provider: str | None) -> str:
    """The option value as rclone's config text, or a ConfigError saying what is allowed."""
    t = opt.type
    if t == "bool":
        if isinstance(value, bool):
            return "true" if value else "false"
        text = str(value).strip().lower()
        if text in _TRUE:
            return "true"
        if text in _FALSE - {""}:
            return "false"
        raise ConfigError(f"{path}: {value!r} is not true or false", field=path, value=value)
    if t == "Tristate":
        text = str(value).strip().lower() if not isinstance(value, bool) else str(value).lower()
        if text in ("true", "false", "unset"):
            return text
        raise ConfigError(f"{path}: {value!r} is not true, false or unset", field=path,
                          value=value)
    if t == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{path}: {value!r} is not a whole number", field=path)
        try:
            return str(int(str(value).strip(), 0))
        except ValueError:
            raise ConfigError(f"{path}: {value!r} is not a whole number", field=path,
                              value=value) from None
    if t == "float64":
        try:
            return repr(float(value))
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: {value!r} is not a number", field=path,
                              value=value) from None
    if t == "SizeSuffix":
        text = str(value).strip()
        if not _SIZE_RE.match(text):
            raise ConfigError(f"{path}: {value!r} is not a size such as 64M, 1G or 512Ki",
                              field=path, value=value)
        return text
    if t == "Duration":
        text = str(value).strip()
        if not _DURATION_RE.match(text):
            raise ConfigError(f"{path}: {value!r} is not a duration such as 30s, 5m or 1h",
                              field=path, value=value)
        return text
    if t in ("CommaSepList", "SpaceSepList", "stringArray") and isinstance(value, (list, tuple)):
        sep = " " if t == "SpaceSepList" else ","
        items = [str(v) for v in value]
        if any(sep in i or '"' in i for i in items):
            raise ConfigError(f"{path}: list items may not contain {sep!r} or quotes",
                              field=path)
        value = sep.join(items)
    if isinstance(value, (dict, list, tuple)):
        raise ConfigError(f"{path}: expected text, not {type(value).__name__}", field=path)
    text = config_value(opt.name, value)
    if opt.exclusive and opt.examples:
        allowed = [str(e.get("Value")) for e in opt.examples
                   if provider is None or not e.get("Provider") or
                   provider in str(e.get("Provider")).split(",")]
        if allowed and text not in allowed:
            raise ConfigError(f"{path}: {text!r} is not one of {', '.join(allowed)}",
                              field=path, value=text)
    return text


# --------------------------------------------------------------------------- from_url
def parse_url(url: str) -> ParsedURL:
    """Short forms: ``s3://bucket/path``, ``obs://bucket/path``, ``webdav+https://host/p``,
    ``sftp://user@host:port/path``.  Query parameters become options (``?endpoint=...``);
    a user and password in the URL become the storage's credentials."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"url: {url!r} is not a storage URL; use s3://bucket/path, obs://bucket/path, "
            "webdav+https://host/path or sftp://user@host/path", field="url", value=url)
    if any(c in url for c in "\x00\n\r"):
        raise ConfigError("url: must be a single line", field="url")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    query = {k: v for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)}
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password else None
    path = urllib.parse.unquote(parts.path)
    host = parts.hostname or ""
    if scheme in ("s3", "obs"):
        if not host:
            raise ConfigError(f"url: {url!r} names no bucket (s3://BUCKET/path)", field="url")
        bucket = urllib.parse.unquote(parts.netloc.rsplit("@", 1)[-1])
        options: dict[str, Any] = {"provider": "HuaweiOBS" if scheme == "obs" else "AWS"}
        if scheme == "obs" and "endpoint" not in query and "region" in query:
            query["endpoint"] = f"https://obs.{query['region']}.myhuaweicloud.com"
        options.update(query)
        if user:
            options["access_key_id"] = user
        if password:
            options["secret_access_key"] = password
        return ParsedURL("s3", options, (bucket + path).rstrip("/"))
    if scheme.startswith("webdav+"):
        inner = scheme.split("+", 1)[1]
        if inner not in ("http", "https"):
            raise ConfigError(f"url: {scheme!r}: use webdav+https:// or webdav+http://",
                              field="url")
        netloc = host + (f":{parts.port}" if parts.port else "")
        options = {"url": urllib.parse.urlunsplit((inner, netloc, parts.path, "", "")),
                   **query}
        if user:
            options["user"] = user
        if password:
            options["pass"] = password
        return ParsedURL("webdav", options, "")
    if scheme == "sftp":
        options = {"host": host, **query}
        if parts.port:
            options["port"] = str(parts.port)
        if user:
            options["user"] = user
        if password:
            options["pass"] = password
        return ParsedURL("sftp", options, path)
    raise ConfigError(
        f"url: unknown scheme {scheme!r}; use s3://, obs://, webdav+https://, sftp:// or give "
        "a backend and options", field="url", value=url)
