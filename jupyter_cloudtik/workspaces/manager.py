"""WorkspaceManager: create, delete, inspect workspaces, as recorded operations.

A workspace is what the clusters of one provider account share: network, identities,
storage.  The manager records the desired workspace first (table ``workspaces``, store
area "workspaces"), then runs the provider's create or delete as an operation with
progress events (kind ``workspace.create`` / ``workspace.delete``, target
``workspace:NAME``).  Resource ids are written to the record as soon as each resource
exists, so a create that was killed is finished by running it again, and a delete finds
everything.  Credentials given with a workspace config go to the secret store and are
dropped from the recorded config.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core import plugins
from ..core.config import config_diff, config_hash, read_config_file, validate_against
from ..core.errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
)
from ..core.features import feature_service
from ..core.identity import ActsForUser, os_user
from ..core.operations import OperationContext, OperationInfo, Operations, Target
from ..core.runner import OperationHandle, OperationRunner
from ..core.secrets import SecretStore
from ..core.settings import CloudTik, default_settings
from ..core.store import Store, StoreError, dumps, loads
from ..providers.base import ProviderContext, WorkspaceProvider

log = logging.getLogger("jupyter_cloudtik")

WORKSPACE_MIGRATIONS = [
    """
    CREATE TABLE workspaces (
        name TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        config TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        resources TEXT NOT NULL DEFAULT '{}',
        ever_ready INTEGER NOT NULL DEFAULT 0,
        owner TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
]
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$")
WORKSPACE_STATES = ("creating", "ready", "failed", "deleting", "deleted")


def _target(name: str) -> str:
    return str(Target("workspace", name))


@dataclass
class WorkspaceInfo:
    name: str
    provider: str
    state: str
    reason: str | None
    config: dict[str, Any]
    resources: dict[str, Any] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0
    last_operation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkspaceInfo:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


def workspace_record(store: Store, name: str) -> dict[str, Any] | None:
    """The recorded workspace (config, resources, state) for providers; None if unknown."""
    store.ensure_schema("workspaces", WORKSPACE_MIGRATIONS)
    row = store.query_one("SELECT * FROM workspaces WHERE name = ?", (name,))
    if row is None:
        return None
    return {"name": row["name"], "provider": row["provider"], "state": row["state"],
            "config": loads(row["config"], {}), "resources": loads(row["resources"], {})}


def workspaces_of(store: Store, provider: str) -> list[str]:
    store.ensure_schema("workspaces", WORKSPACE_MIGRATIONS)
    return [r[0] for r in store.query(
        "SELECT name FROM workspaces WHERE provider = ? AND state != 'deleted' ORDER BY name",
        (provider,))]


def workspace_provider_class(provider_type: str) -> type[WorkspaceProvider]:
    return plugins.load(plugins.WORKSPACE_PROVIDERS, provider_type, field="provider.type",
                        what="workspace provider")


class WorkspaceManager(ActsForUser):
    """Creates and deletes workspaces; one per process is typical."""

    def __init__(self, settings: CloudTik | None = None, store: Store | None = None,
                 user: str | None = None) -> None:
        self.settings = settings or default_settings()
        self.store = store or Store(self.settings.state_dir)
        self.store.ensure_schema("workspaces", WORKSPACE_MIGRATIONS)
        self.ops = Operations(self.store)
        self.secrets = SecretStore(self.store)
        self.user = user or os_user()
        # deleting a workspace is cooperative: it gets a minute to stop by itself
        self.runner = OperationRunner(
            self.ops, timeout=lambda: self.settings.operation_timeout, cancel_grace=60.0,
            on_failed=lambda op, err: self._set_state(op.resource.name, "failed",
                                                      err.message),
            on_cancelled=lambda op: self._set_state(
                op.resource.name, "failed", f"{op.kind} was cancelled; run it again to "
                "finish, or delete the workspace"),
            what="workspace operation")
        self.context = ProviderContext(state_dir=self.store.state_dir, store=self.store,
                                       settings=self.settings, log=log)

    # reading ------------------------------------------------------------------------------
    def _row(self, name: str):
        row = self.store.query_one("SELECT * FROM workspaces WHERE name = ?", (name,))
        if row is None:
            known = [r[0] for r in self.store.query(
                "SELECT name FROM workspaces WHERE state != 'deleted' ORDER BY name")]
            hint = f"; workspaces: {', '.join(known)}" if known else "; there are none"
            raise NotFoundError(f"no workspace named '{name}'{hint}", field="name", value=name)
        return row

    def get(self, name: str) -> WorkspaceInfo:
        """The recorded view (no cloud calls)."""
        return self._info(self._row(name))

    def list(self, include_deleted: bool = False) -> list[WorkspaceInfo]:
        sql = "SELECT * FROM workspaces"
        if not include_deleted:
            sql += " WHERE state != 'deleted'"
        return [self._info(r) for r in self.store.query(sql + " ORDER BY created_at")]

    def _info(self, row) -> WorkspaceInfo:
        last = self.store.query_one(
            "SELECT id, kind, state, reason, created_at, finished_at FROM operations"
            " WHERE target = ? ORDER BY created_at DESC LIMIT 1", (_target(row["name"]),))
        return WorkspaceInfo(
            name=row["name"], provider=row["provider"], state=row["state"],
            reason=row["reason"], config=loads(row["config"], {}),
            resources=loads(row["resources"], {}), clusters=self._clusters_using(row["name"]),
            created_at=row["created_at"], updated_at=row["updated_at"],
            last_operation=dict(last) if last else None)

    def _clusters_using(self, name: str) -> list[str]:
        """The clusters (not stopped) whose provider config names this workspace.

        It guards ``delete``: a store that cannot be read, or a cluster whose recorded
        config cannot, is an error that says so (``StoreError``), never "no clusters"
        (the clusters table is the core's, made with the store: it is always there)."""
        try:
            rows = feature_service("live_cluster_configs")(self.store)
        except sqlite3.Error as e:
            raise StoreError(f"workspace '{name}': cannot tell which clusters use it (the "
                             f"state database's clusters could not be read: {e})") from None
        using = []
        for cname, config in rows:
            try:
                cfg = loads(config, {})
                provider = cfg.get("provider") or {}
                workspace = provider.get("workspace_name")
            except (ValueError, AttributeError) as e:
                raise StoreError(
                    f"workspace '{name}': cannot tell whether cluster '{cname}' uses it "
                    f"(its recorded config cannot be read: {type(e).__name__}: {e})"
                ) from None
            if workspace == name:
                using.append(cname)
        return sorted(using)

    def provider_for(self, name: str, cfg: dict[str, Any]) -> WorkspaceProvider:
        prov = cfg["provider"]
        cls = workspace_provider_class(prov["type"])
        wp = cls(prov, name, self.context)

        def on_resource(key: str, value: Any) -> None:
            with self.store.transaction() as conn:
                row = conn.execute("SELECT resources FROM workspaces WHERE name = ?",
                                   (name,)).fetchone()
                res = loads(row[0], {}) if row else {}
                if value is None:
                    res.pop(key, None)
                else:
                    res[key] = value
                conn.execute("UPDATE workspaces SET resources = ?, updated_at = ?"
                             " WHERE name = ?", (dumps(res), time.time(), name))

        wp.on_resource = on_resource  # type: ignore[attr-defined]
        return wp

    # config -------------------------------------------------------------------------------
    def build_config(self, name: str, config: str | dict[str, Any] | None,
                     provider: str | None) -> tuple[dict[str, Any], dict[str, str]]:
        """(normalised config, secrets to keep apart) from the user's words."""
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(
                f"name: {name!r} is not a valid workspace name; use 2 to 24 lower-case "
                "letters, digits and '-', starting with a letter", field="name", value=name)
        if config is None:
            raw: dict[str, Any] = {}
        elif isinstance(config, dict):
            raw = copy.deepcopy(config)
        else:
            raw = read_config_file(config)
        unknown = set(raw) - {"provider", "workspace_name"}
        if unknown:
            raise ConfigError(f"unknown field {', '.join(sorted(map(repr, unknown)))} in the "
                              "workspace config (allowed: provider, workspace_name)",
                              field=sorted(unknown)[0])
        if raw.get("workspace_name") not in (None, name):
            raise ConfigError(f"workspace_name: the config says '{raw['workspace_name']}' but "
                              f"'{name}' was asked for", field="workspace_name")
        prov = raw.setdefault("provider", {})
        if not isinstance(prov, dict):
            raise ConfigError("provider: must be a mapping", field="provider")
        if provider:
            if prov.get("type") not in (None, provider):
                raise ConfigError(f"provider: the config says '{prov['type']}' but "
                                  f"'{provider}' was asked for", field="provider.type")
            prov["type"] = provider
        if not prov.get("type"):
            names = ", ".join(plugins.installed(plugins.WORKSPACE_PROVIDERS)) or "none"
            raise ConfigError(f"provider.type: missing; workspace providers: {names}",
                              field="provider.type")
        if self.settings.allowed_providers and prov["type"] not in self.settings.allowed_providers:
            raise ConfigError(f"provider.type: '{prov['type']}' is not allowed here; allowed: "
                              f"{', '.join(self.settings.allowed_providers)}",
                              field="provider.type")
        creds = prov.pop("credentials", None) or {}
        if not isinstance(creds, dict):
            raise ConfigError("provider.credentials: must be a mapping",
                              field="provider.credentials")
        cls = workspace_provider_class(prov["type"])
        schema = copy.deepcopy(cls.config_schema)
        schema.get("properties", {}).pop("credentials", None)
        validate_against({k: v for k, v in prov.items() if k != "type"},
                         _without_type(schema), prefix="provider")
        return {"workspace_name": name, "provider": cls.normalize_config(prov)}, {
            k: str(v) for k, v in creds.items() if v}

    # operations -----------------------------------------------------------------------------
    async def start_create(self, name: str, config: str | dict[str, Any] | None = None,
                           provider: str | None = None) -> OperationHandle:
        cfg, creds = self.build_config(name, config, provider)
        chash = config_hash(cfg)
        row = self.store.query_one("SELECT * FROM workspaces WHERE name = ?", (name,))
        live = row is not None and row["state"] not in ("deleted", "failed")
        if live and row["config_hash"] != chash:
            diff = "; ".join(config_diff(loads(row["config"], {}), cfg))
            raise ConflictError(
                f"workspace '{name}' exists with a different config ({diff}); delete it first "
                "or choose another name", field="name", value=name)
        for op in self.ops.active_for(_target(name)):
            if op.kind == "workspace.create" and op.params.get("config_hash") == chash:
                return self.runner.handle(op.id)
        if creds:
            self.secrets.delete(f"provider:{cfg['provider']['type']}:{name}")
            for k, v in creds.items():
                self.secrets.put(f"provider:{cfg['provider']['type']}:{name}", k, v)
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO workspaces (name, provider, config, config_hash, state, owner,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 'creating', ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET provider = excluded.provider,"
                " config = excluded.config, config_hash = excluded.config_hash,"
                " state = 'creating', reason = NULL, updated_at = excluded.updated_at,"
                " ever_ready = CASE WHEN workspaces.state = 'deleted' THEN 0"
                " ELSE workspaces.ever_ready END,"
                " resources = CASE WHEN workspaces.state = 'deleted' THEN '{}'"
                " ELSE workspaces.resources END",
                (name, cfg["provider"]["type"], dumps(cfg), chash, self.user, now, now))
        op = self.ops.start("workspace.create", _target(name), {"config_hash": chash},
                            user=self.user)
        wp = self.provider_for(name, cfg)
        rollback = not bool(self.store.query_one(
            "SELECT ever_ready FROM workspaces WHERE name = ?", (name,))[0])
        return self._launch(op, self._create(OperationContext(self.ops, op.id), wp, rollback))

    async def start_delete(self, name: str, delete_storage: bool = True) -> OperationHandle:
        row = self._row(name)
        if row["state"] == "deleted":
            op = self.ops.start("workspace.delete", _target(name), {}, user=self.user,
                                exclusive=False)
            self.ops.finish(op.id, "succeeded", result={"workspace": name, "already": True})
            return self.runner.handle(op.id)
        clusters = self._clusters_using(name)
        if clusters:
            raise ConflictError(
                f"workspace '{name}' is used by cluster(s) {', '.join(clusters)}; run "
                "`down` on them first", field="name", value=name)
        for op in self.ops.active_for(_target(name)):
            await self.cancel(op.id)
        cfg = loads(row["config"], {})
        wp = self.provider_for(name, cfg)
        op = self.ops.start("workspace.delete", _target(name),
                            {"delete_storage": delete_storage}, user=self.user)
        self._set_state(name, "deleting")
        return self._launch(op, self._delete(OperationContext(self.ops, op.id), wp,
                                             delete_storage))

    def _launch(self, op: OperationInfo, coro) -> OperationHandle:
        return self.runner.launch(op, coro)

    async def _create(self, ctx: OperationContext, wp: WorkspaceProvider,
                      rollback: bool) -> Any:
        name = wp.workspace_name
        ctx.progress("start", f"creating workspace '{name}' ({wp.provider_type})", 0.01)
        resources = await asyncio.to_thread(wp.create_workspace, ctx, rollback=rollback)
        with self.store.transaction() as conn:
            conn.execute("UPDATE workspaces SET state = 'ready', reason = NULL, ever_ready = 1,"
                         " updated_at = ? WHERE name = ?", (time.time(), name))
        ctx.progress("ready", f"workspace '{name}' is ready", 1.0)
        return {"workspace": name, "resources": resources}

    async def _delete(self, ctx: OperationContext, wp: WorkspaceProvider,
                      delete_storage: bool) -> Any:
        name = wp.workspace_name
        await asyncio.to_thread(wp.delete_workspace, ctx, delete_storage=delete_storage)
        with self.store.transaction() as conn:
            conn.execute("UPDATE workspaces SET state = 'deleted', reason = NULL,"
                         " resources = '{}', ever_ready = 0, updated_at = ? WHERE name = ?",
                         (time.time(), name))
        self.secrets.delete(f"provider:{wp.provider_type}:{name}")
        ctx.progress("deleted", f"workspace '{name}' is deleted", 1.0)
        return {"workspace": name}

    async def status(self, name: str) -> dict[str, Any]:
        """Ask the cloud which of the workspace's resources exist (live)."""
        row = self._row(name)
        info = self._info(row)
        if row["state"] == "deleted":
            return {**info.to_dict(), "integrity": {}, "healthy": False}
        wp = self.provider_for(name, loads(row["config"], {}))
        integrity = await asyncio.to_thread(wp.check_workspace_integrity)
        clusters = await asyncio.to_thread(wp.list_clusters)
        healthy = all(v == "ok" for v in integrity.values())
        out = info.to_dict()
        out.update(integrity=integrity, healthy=healthy,
                   clusters=sorted(set(info.clusters) | set(clusters)))
        return out

    async def wait(self, op_id: str, poll: float = 0.1) -> Any:
        return await self.runner.wait(op_id, poll)

    async def cancel(self, op_id: str) -> OperationInfo:
        return await self.runner.cancel(op_id)

    async def create(self, name: str, config: str | dict[str, Any] | None = None,
                     provider: str | None = None) -> WorkspaceInfo:
        await (await self.start_create(name, config, provider)).wait()
        return self.get(name)

    async def delete(self, name: str, delete_storage: bool = True) -> None:
        await (await self.start_delete(name, delete_storage)).wait()

    def _set_state(self, name: str, state: str, reason: str | None = None) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE workspaces SET state = ?, reason = ?, updated_at = ?"
                         " WHERE name = ?", (state, reason, time.time(), name))


def _without_type(schema: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(schema)
    (s.get("properties") or {}).pop("type", None)
    return s
