"""The admin catalogue: what the hub's admins offer, to whom, with which credentials.

A resource is ``(kind, name)`` with a public ``spec`` (what users may see), the names of
its secret fields (values live in the secret store under ``hub:<kind>:<name>``, never in
the catalogue table, an answer or a log), and who may use it: ``users`` and ``groups``
(``"*"`` in either means every hub user).  Kinds:

* ``provider`` — a provider account: ``{"type": "local"|"huaweicloud"|..., "config": {...}}``
  plus ``credentials`` (e.g. a Huawei Cloud AK/SK) that only the sidekick uses.
* ``template`` — a cluster template: ``{"provider": <provider name>, "config": {...},
  "limits": {"max_workers", "max_price", "idle_timeout_minutes"}}``.
* ``storage`` — an rclone storage with its credentials (created in the sidekick's storage
  catalogue; users browse and copy through the sidekick).
* ``hpc`` — an HPC backend instance users may submit to (configured in ``c.HPC``).
* ``sidekick`` — a side-kick service users may start (see ``docs/hub-sidekicks.md``).
* ``kernel`` — an interactive HPC kernel profile: ``{"backend": <hpc item>, "cores",
  "time", "memory", "partition", "gpus", "account", "display_name", "custom"}`` (as
  ``c.HPCKernels.profiles``); using it needs a grant on it *and* on its backend.

Quotas (per user or group: clusters, cores, spend per day) and the audit log of admin
actions live beside it, in the sidekick's own state DB.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError, NotFoundError
from ..core.grants import Caller
from ..core.secrets import SecretStore
from ..core.store import Store, dumps, loads

KINDS = ("provider", "template", "storage", "hpc", "sidekick", "kernel")
NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
EVERYONE = "*"
SECRET = "<secret>"
READ_ONLY = "read_only_credentials."

MIGRATIONS = [
    """
    CREATE TABLE hub_resources (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        spec TEXT NOT NULL DEFAULT '{}',
        secret_fields TEXT NOT NULL DEFAULT '[]',
        users TEXT NOT NULL DEFAULT '[]',
        groups TEXT NOT NULL DEFAULT '[]',
        description TEXT NOT NULL DEFAULT '',
        updated_by TEXT,
        updated_at REAL NOT NULL,
        PRIMARY KEY (kind, name)
    );
    CREATE TABLE hub_quotas (
        subject TEXT PRIMARY KEY,
        max_clusters INTEGER,
        max_cores REAL,
        max_spend_per_day REAL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE hub_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX hub_audit_at ON hub_audit (at);
    CREATE TABLE hub_egress_rules (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        port INTEGER,
        path_prefix TEXT NOT NULL DEFAULT '/',
        header TEXT NOT NULL,
        users TEXT NOT NULL DEFAULT '[]',
        groups TEXT NOT NULL DEFAULT '[]',
        owner TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # the groups a user had at their last request: what a background action of theirs
    # (a scale of their cluster by the reaper, a job's stage-out) is granted on
    """
    CREATE TABLE hub_callers (
        name TEXT PRIMARY KEY,
        groups TEXT NOT NULL DEFAULT '[]',
        admin INTEGER NOT NULL DEFAULT 0,
        seen_at REAL NOT NULL
    );
    """,
]


@dataclass
class Resource:
    kind: str
    name: str
    spec: dict[str, Any]
    secret_fields: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    description: str = ""
    updated_by: str | None = None
    updated_at: float = 0.0

    def to_dict(self, *, admin: bool = False) -> dict[str, Any]:
        """What an answer shows: secrets as ``"<secret>"``; who may use it, to admins."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "spec": self.spec,
                               "description": self.description,
                               "secrets": {f: SECRET for f in self.secret_fields}}
        if admin:
            out.update(users=self.users, groups=self.groups, updated_by=self.updated_by,
                       updated_at=self.updated_at)
        return out


def _str_list(value: Any, fieldname: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{fieldname}: expected a list of names, got {value!r}",
                          field=fieldname)
    return sorted(set(value))


class Catalog:
    """Resources, quotas and the audit log, in the sidekick's state DB."""

    def __init__(self, store: Store, secrets: SecretStore | None) -> None:
        """``secrets`` None: a reader (the access policy), which never writes."""
        self.store = store
        self.secrets = secrets
        store.ensure_schema("hub", MIGRATIONS)

    # resources ----------------------------------------------------------------------------
    @staticmethod
    def scope(kind: str, name: str) -> str:
        return f"hub:{kind}:{name}"

    def put(self, kind: str, name: str, body: dict[str, Any], *, actor: str) -> Resource:
        """Create or replace a resource.  Secret values not repeated are kept (so an admin
        can change who may use a provider without typing its keys again)."""
        if kind not in KINDS:
            raise ConfigError(f"kind: {kind!r} is not one of {', '.join(KINDS)}",
                              field="kind", value=kind)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(f"name: {name!r} is not a valid name (a lowercase letter, then "
                              "up to 62 lowercase letters, digits, '-' or '_')",
                              field="name", value=name)
        spec = body.get("spec", {})
        if not isinstance(spec, dict):
            raise ConfigError(f"spec: expected an object, got {type(spec).__name__}",
                              field="spec")
        secrets = body.get("secrets") or {}
        if not isinstance(secrets, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
            raise ConfigError("secrets: expected an object of text values", field="secrets")
        read_only = body.get("read_only_credentials")
        if read_only is not None:
            if kind != "storage" or not isinstance(read_only, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in read_only.items()):
                raise ConfigError("read_only_credentials: a storage's object of text values",
                                  field="read_only_credentials")
            # kept under names of their own (shown as "<secret>"); the storage manager
            # keeps the values a node may receive (storage/catalog.py read_only_scope)
            secrets = {**secrets, **{f"{READ_ONLY}{k}": v for k, v in read_only.items()}}
        validate_spec(kind, name, spec)
        users = _str_list(body.get("users"), "users")
        groups = _str_list(body.get("groups"), "groups")
        description = str(body.get("description") or "")[:500]
        scope = self.scope(kind, name)
        for key, value in secrets.items():
            if value and value != SECRET:
                self.secrets.put(scope, key, value)
        secret_fields = sorted(self.secrets.names(scope))
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hub_resources (kind, name, spec, secret_fields, users, groups,"
                " description, updated_by, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(kind, name) DO UPDATE SET spec = excluded.spec,"
                " secret_fields = excluded.secret_fields, users = excluded.users,"
                " groups = excluded.groups, description = excluded.description,"
                " updated_by = excluded.updated_by, updated_at = excluded.updated_at",
                (kind, name, dumps(spec), dumps(secret_fields), dumps(users), dumps(groups),
                 description, actor, now))
        self.audit(actor, f"{kind}.put", f"{kind}:{name}",
                   {"users": users, "groups": groups, "secret_fields": secret_fields})
        return self.get(kind, name)

    def delete(self, kind: str, name: str, *, actor: str) -> None:
        self.get(kind, name)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM hub_resources WHERE kind = ? AND name = ?", (kind, name))
        self.secrets.delete(self.scope(kind, name))
        self.audit(actor, f"{kind}.delete", f"{kind}:{name}", {})

    def get(self, kind: str, name: str) -> Resource:
        row = self.store.query_one(
            "SELECT * FROM hub_resources WHERE kind = ? AND name = ?", (kind, name))
        if row is None:
            raise NotFoundError(f"no {kind} named '{name}' in the hub catalogue",
                                field="name", value=name)
        return _resource(row)

    def list(self, kind: str | None = None) -> list[Resource]:
        if kind is None:
            rows = self.store.query("SELECT * FROM hub_resources ORDER BY kind, name")
        else:
            rows = self.store.query(
                "SELECT * FROM hub_resources WHERE kind = ? ORDER BY name", (kind,))
        return [_resource(r) for r in rows]

    def visible(self, caller: Caller, kind: str | None = None) -> list[Resource]:
        return [r for r in self.list(kind) if caller.may_use(r.users, r.groups)]

    def find(self, kind: str, name: str) -> Resource | None:
        try:
            return self.get(kind, name)
        except NotFoundError:
            return None

    # callers ------------------------------------------------------------------------------
    def remember(self, caller: Caller) -> None:
        """Keep the groups ``caller`` has now, for background actions of theirs."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO hub_callers (name, groups, admin, seen_at)"
                         " VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET"
                         " groups = excluded.groups, admin = excluded.admin,"
                         " seen_at = excluded.seen_at",
                         (caller.name, dumps(list(caller.groups)), int(caller.admin),
                          time.time()))

    def remembered(self, name: str) -> Caller | None:
        row = self.store.query_one("SELECT * FROM hub_callers WHERE name = ?", (name,))
        if row is None:
            return None
        return Caller(row["name"], tuple(loads(row["groups"], [])), bool(row["admin"]))

    # quotas -------------------------------------------------------------------------------
    def set_quota(self, subject: str, limits: dict[str, Any], *, actor: str) -> dict[str, Any]:
        if not re.match(r"^(user|group):[^\s]{1,128}$|^default$", subject):
            raise ConfigError(f"subject: {subject!r} must be 'user:NAME', 'group:NAME' or "
                              "'default'", field="subject", value=subject)
        values = {}
        for key in ("max_clusters", "max_cores", "max_spend_per_day"):
            v = limits.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or v < 0):
                raise ConfigError(f"{key}: {v!r} is not a number >= 0 (or null for no "
                                  "limit)", field=key, value=v)
            values[key] = v
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hub_quotas (subject, max_clusters, max_cores, max_spend_per_day,"
                " updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT(subject) DO UPDATE SET"
                " max_clusters = excluded.max_clusters, max_cores = excluded.max_cores,"
                " max_spend_per_day = excluded.max_spend_per_day,"
                " updated_at = excluded.updated_at",
                (subject, values["max_clusters"], values["max_cores"],
                 values["max_spend_per_day"], time.time()))
        self.audit(actor, "quota.put", subject, values)
        return {"subject": subject, **values}

    def quotas(self) -> list[dict[str, Any]]:
        return [{"subject": r["subject"], "max_clusters": r["max_clusters"],
                 "max_cores": r["max_cores"], "max_spend_per_day": r["max_spend_per_day"]}
                for r in self.store.query("SELECT * FROM hub_quotas ORDER BY subject")]

    def quota_for(self, caller: Caller) -> dict[str, Any]:
        """The limits that apply: the user's own row, else the most generous of their
        groups' rows, else ``default``; a missing value means no limit."""
        rows = {r["subject"]: r for r in self.quotas()}
        if f"user:{caller.name}" in rows:
            return rows[f"user:{caller.name}"]
        group_rows = [rows[f"group:{g}"] for g in caller.groups if f"group:{g}" in rows]
        if group_rows:
            merged: dict[str, Any] = {"subject": "groups"}
            for key in ("max_clusters", "max_cores", "max_spend_per_day"):
                vals = [r[key] for r in group_rows]
                merged[key] = None if any(v is None for v in vals) else max(vals)
            return merged
        return rows.get("default", {"subject": "none", "max_clusters": None,
                                    "max_cores": None, "max_spend_per_day": None})

    # audit --------------------------------------------------------------------------------
    def audit(self, actor: str, action: str, target: str, detail: dict[str, Any]) -> None:
        """Record an admin action: who, what, when; ``detail`` must hold no secret value
        (callers pass names of secret fields, never their values)."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO hub_audit (at, actor, action, target, detail)"
                         " VALUES (?, ?, ?, ?, ?)",
                         (time.time(), actor, action, target, dumps(detail)))

    def audit_log(self, limit: int = 200, after: int = 0) -> list[dict[str, Any]]:
        rows = self.store.query("SELECT * FROM hub_audit WHERE id > ? ORDER BY id DESC"
                                " LIMIT ?", (after, limit))
        return [{"id": r["id"], "at": r["at"], "actor": r["actor"], "action": r["action"],
                 "target": r["target"], "detail": loads(r["detail"], {})} for r in rows]


def _resource(row: Any) -> Resource:
    return Resource(kind=row["kind"], name=row["name"], spec=loads(row["spec"], {}),
                    secret_fields=loads(row["secret_fields"], []),
                    users=loads(row["users"], []), groups=loads(row["groups"], []),
                    description=row["description"], updated_by=row["updated_by"],
                    updated_at=row["updated_at"])


def validate_spec(kind: str, name: str, spec: dict[str, Any]) -> None:
    """Shape checks that name the bad field; deeper checks happen where a spec is used
    (a template's config by the cluster schema, a storage's options by rclone's)."""
    def need(key: str, typ: type | tuple[type, ...], what: str) -> Any:
        value = spec.get(key)
        if not isinstance(value, typ):
            raise ConfigError(f"spec.{key}: {kind} '{name}' needs {what}, got {value!r}",
                              field=f"spec.{key}", value=value)
        return value

    if kind == "provider":
        need("type", str, "a provider type (e.g. 'local', 'huaweicloud')")
        if "config" in spec:
            need("config", dict, "an object of provider settings")
        if "price_per_core_hour" in spec:
            need("price_per_core_hour", (int, float), "a number")
    elif kind == "template":
        need("provider", str, "the name of a provider in the catalogue")
        if "config" in spec:
            need("config", dict, "a cluster config object")
        limits = spec.get("limits", {})
        if not isinstance(limits, dict):
            raise ConfigError("spec.limits: expected an object", field="spec.limits")
        for key in ("max_workers", "idle_timeout_minutes", "max_price"):
            v = limits.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or v < 0):
                raise ConfigError(f"spec.limits.{key}: {v!r} is not a number >= 0",
                                  field=f"spec.limits.{key}", value=v)
    elif kind == "storage":
        need("type", str, "an rclone backend type (e.g. 's3', 'webdav')")
        if "options" in spec:
            need("options", dict, "an object of rclone options (no secrets: put those "
                                  "under 'secrets')")
    elif kind == "hpc":
        v = spec.get("shared_account_kernels")
        if v is not None and not isinstance(v, bool):
            raise ConfigError(f"spec.shared_account_kernels: {v!r} is not true or false",
                              field="spec.shared_account_kernels", value=v)
    elif kind == "kernel":
        # deferred: start-up (hpc.kernels.profiles ~8 ms, loads the HPC job model)
        from ..hpc.kernels.profiles import parse_profile

        if "name" in spec:
            raise ConfigError("spec.name: a kernel profile is named by its catalogue name",
                              field="spec.name")
        parse_profile({"name": name, **spec}, 0, where="spec")
    elif kind == "sidekick":
        # deferred: start-up (hub.sidekicks ~53 ms, loads asyncio, psutil)
        from .sidekicks import SidekickSpec

        SidekickSpec.from_dict({"name": name, **spec})
