"""The state store: one SQLite file shared by every process that drives clusters.

Kernels, the CLI, the Jupyter server, the launcher and the reaper daemons all open the same
file at the same time.  WAL mode lets readers proceed while one process writes; writes take
the lock up front (``BEGIN IMMEDIATE``) so two writers queue on the busy timeout instead of
failing half way with "database is locked" when a read transaction tries to upgrade.

Each feature area (core, storage, hpc, placement, hub, ...) owns its tables and its list
of migrations; ``ensure_schema`` applies the missing ones under the write lock, so two
processes starting at once cannot both migrate.  A migration list only ever grows.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import CloudTikError

Migration = str | Callable[[sqlite3.Connection], None]

DB_FILENAME = "state.db"
BUSY_TIMEOUT_SECONDS = 30.0

CORE_MIGRATIONS: list[Migration] = [
    # 1: operations and their events (the clusters' tables are the clusters feature's:
    # clusters/table.py; state folders made before kept them here, created by this step)
    """
    CREATE TABLE operations (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        params TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL,
        reason TEXT,
        result TEXT,
        owner_pid INTEGER,
        owner_host TEXT,
        owner_started REAL,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        user TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX operations_target ON operations(target, created_at);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        op_id TEXT NOT NULL REFERENCES operations(id) ON DELETE CASCADE,
        ts REAL NOT NULL,
        step TEXT NOT NULL,
        message TEXT NOT NULL,
        fraction REAL,
        level TEXT NOT NULL DEFAULT 'info',
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_op ON events(op_id, id);
    """,
]


class StoreError(CloudTikError):
    reason = "state_store"


class Store:
    """A handle on the state database; cheap to create, safe to use from many threads.

    Each thread gets its own connection (sqlite3 connections must not cross threads), and
    each process its own after ``fork`` (the pid is part of the key).
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_FILENAME
        self._local = threading.local()
        self._ensured: set[str] = set()
        self._lock = threading.Lock()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StoreError(
                f"cannot create the state folder {self.state_dir}: {e.strerror}",
                field="state_dir",
            ) from e
        self.ensure_schema("core", CORE_MIGRATIONS)

    # connections ---------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        try:
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None,
                check_same_thread=True,
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the state database {self.path}: {e}") from e
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":  # pragma: no cover - filesystems without shared memory
            raise StoreError(f"the state database {self.path} cannot use WAL mode ({mode})")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        try:
            os.chmod(self.path, 0o600)
        except OSError:
            pass
        self._local.conn = conn
        self._local.pid = os.getpid()
        self._local.depth = 0
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the database lock from its first statement.

        Nested use joins the outer transaction.
        """
        conn = self._connection()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield conn
            finally:
                self._local.depth -= 1
            return
        self._begin_immediate(conn)
        self._local.depth = 1
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")
        finally:
            self._local.depth = 0

    @staticmethod
    def _begin_immediate(conn: sqlite3.Connection) -> None:
        # sqlite's own busy handler covers BEGIN IMMEDIATE, but a WAL checkpoint racing with
        # another writer can still surface SQLITE_BUSY at once; retry for the same budget.
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if time.monotonic() > deadline:
                    raise StoreError(
                        "the state database stayed locked by another process for "
                        f"{BUSY_TIMEOUT_SECONDS:.0f}s"
                    ) from e
                time.sleep(0.05)

    def change_token(self) -> tuple[int, int]:
        """A value that changes whenever anything was committed, by any process.

        ``PRAGMA data_version`` changes when another connection committed, this
        connection's ``total_changes`` when it did: two cheap calls that tell whether a
        cached read is still current.
        """
        conn = self._connection()
        return conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        return self._connection().execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        return self._connection().execute(sql, params).fetchall()

    def query_one(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> sqlite3.Row | None:
        return self._connection().execute(sql, params).fetchone()

    # schema ---------------------------------------------------------------------------
    def ensure_schema(self, area: str, migrations: Sequence[Migration]) -> None:
        """Bring ``area``'s tables to the newest version; a no-op once done in this process."""
        with self._lock:
            if area in self._ensured:
                return
            with self.transaction() as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_versions "
                    "(area TEXT PRIMARY KEY, version INTEGER NOT NULL)"
                )
                row = conn.execute(
                    "SELECT version FROM schema_versions WHERE area = ?", (area,)
                ).fetchone()
                current = row[0] if row else 0
                if current > len(migrations):
                    raise StoreError(
                        f"the state database {self.path} has schema version {current} for "
                        f"'{area}', newer than this jupyter_cloudtik knows "
                        f"({len(migrations)}); upgrade jupyter_cloudtik"
                    )
                for version in range(current + 1, len(migrations) + 1):
                    step = migrations[version - 1]
                    if callable(step):
                        step(conn)
                    else:
                        for statement in _split_sql(step):
                            conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_versions(area, version) VALUES (?, ?) "
                        "ON CONFLICT(area) DO UPDATE SET version = excluded.version",
                        (area, version),
                    )
            self._ensured.add(area)

    def schema_version(self, area: str) -> int:
        row = self.query_one("SELECT version FROM schema_versions WHERE area = ?", (area,))
        return row[0] if row else 0


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (executescript would COMMIT our txn)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def loads(value: str | None, default: Any = None) -> Any:
    if value is None:
        return default
    return json.loads(value)
