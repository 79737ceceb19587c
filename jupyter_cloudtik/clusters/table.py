"""The ``clusters`` table as other features read it.

The cluster manager writes the table; other parts of the tree need a few facts from it
(who owns a cluster, which clusters are live and with what config, a user's clusters for
quotas and spend).  They ask here, in the clusters' own words, instead of writing SQL
against another feature's table: a change of the table changes this module only.  Layers
below the features (providers) and sideways (storage, workspaces) reach these through the
registry (``feature_service("cluster_owner")`` and the others ``clusters/feature.py``
names); the hosts import them.

Each function raises the store's own error when the table cannot be read: a caller that
decides on the answer (a workspace delete, a quota) must never read "cannot tell" as "no
clusters".
"""

from __future__ import annotations

from typing import Any

LIVE = "state != 'stopped'"

#: the clusters feature's tables (area ``clusters``).  ``IF NOT EXISTS``: state folders
#: made before the tables moved here got them from the core area's first step
CLUSTER_MIGRATIONS = [
    # 1: clusters and the manager's view of their nodes
    """
    CREATE TABLE IF NOT EXISTS clusters (
        name TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        config TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        target_workers TEXT NOT NULL DEFAULT '{}',
        head_address TEXT,
        dashboard_link TEXT,
        reason TEXT,
        owner TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        last_activity_at REAL
    );
    CREATE TABLE IF NOT EXISTS nodes (
        cluster TEXT NOT NULL,
        node_id TEXT NOT NULL,
        node_type TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        internal_ip TEXT,
        external_ip TEXT,
        resources TEXT NOT NULL DEFAULT '{}',
        info TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (cluster, node_id)
    );
    """,
]


def ensure(store: Any) -> Any:
    """``store`` with the clusters' tables (made or migrated once per store handle)."""
    store.ensure_schema("clusters", CLUSTER_MIGRATIONS)
    return store


def owner_and_state(store: Any, name: str) -> tuple[str | None, str] | None:
    """(owner, state) of the cluster named ``name``, or None when none was ever recorded."""
    row = ensure(store).query_one("SELECT owner, state FROM clusters WHERE name = ?",
                                  (name,))
    return None if row is None else (row["owner"], row["state"])


def owners(store: Any) -> dict[str, str | None]:
    """Every recorded cluster's owner (stopped ones included), by cluster name."""
    return {r[0]: r[1] for r in ensure(store).query("SELECT name, owner FROM clusters")}


def live_configs(store: Any) -> list[tuple[str, str]]:
    """(name, recorded config as JSON text) of every cluster that is not stopped."""
    return [(r["name"], r["config"])
            for r in ensure(store).query(f"SELECT name, config FROM clusters WHERE {LIVE}")]


def sizing(store: Any, name: str) -> tuple[str, str] | None:
    """(config, target_workers) as recorded (JSON texts) for ``name``, or None."""
    row = ensure(store).query_one(
        "SELECT config, target_workers FROM clusters WHERE name = ?", (name,))
    return None if row is None else (row["config"], row["target_workers"])


def clusters_of(store: Any, owner: str, *, stopped_since: float | None = None) -> list[dict]:
    """``owner``'s live clusters (and, with ``stopped_since``, those stopped after it):
    name, provider, config, target_workers, created_at, updated_at and state."""
    ensure(store)
    sql = ("SELECT name, provider, config, target_workers, created_at, updated_at, state"
           " FROM clusters WHERE owner = ? AND ")
    if stopped_since is None:
        rows = store.query(sql + LIVE, (owner,))
    else:
        rows = store.query(sql + f"({LIVE} OR updated_at > ?)", (owner, stopped_since))
    return [dict(r) for r in rows]
