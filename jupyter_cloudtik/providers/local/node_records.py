"""The local provider's "cloud": the ``local_nodes`` table and each node's folder.  A
node exists while its recorded process (pid and start time) is alive; one whose process
is gone is marked terminated with the reason it ended, so ``up`` replaces it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import psutil

from ...core.store import dumps, loads
from .processes import is_alive

LOCAL_MIGRATIONS = [
    """
    CREATE TABLE local_nodes (
        node_id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        tags TEXT NOT NULL,
        state TEXT NOT NULL,
        pid INTEGER,
        pid_started REAL,
        resources TEXT NOT NULL DEFAULT '{}',
        info TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        terminated_at REAL,
        exit_reason TEXT
    );
    CREATE INDEX local_nodes_cluster ON local_nodes(cluster, state);
    """,
]

PENDING_GRACE_SECONDS = 60.0


class LocalNodeRecords:
    """Node records, tags, info and logs (a part of ``LocalNodeProvider``)."""

    # records --------------------------------------------------------------------------
    def _rows(self, states: tuple[str, ...] = ("pending", "running"), cluster: str | None = None):
        marks = ",".join("?" * len(states))
        sql = f"SELECT * FROM local_nodes WHERE state IN ({marks})"
        params: list[Any] = list(states)
        if cluster is not None:
            sql += " AND cluster = ?"
            params.append(cluster)
        return self.store.query(sql, params)

    def _row(self, node_id: str):
        return self.store.query_one("SELECT * FROM local_nodes WHERE node_id = ?", (node_id,))

    def _node_dir(self, node_id: str) -> Path:
        return self.nodes_dir / node_id

    def _mark_terminated(self, node_id: str, reason: str) -> None:
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE local_nodes SET state = 'terminated', terminated_at = ?, updated_at = ?,"
                " exit_reason = COALESCE(exit_reason, ?) WHERE node_id = ? AND state != "
                "'terminated'",
                (now, now, reason, node_id),
            )

    def _refresh(self, row) -> bool:
        """Is the node still there?  Marks it terminated when its process is gone."""
        if row["state"] == "running":
            if is_alive(row["pid"], row["pid_started"]):
                return True
            self._mark_terminated(row["node_id"], self._exit_reason(row["node_id"]))
            return False
        # pending: the launch may still be under way, or its requester died mid-way (a
        # sandboxed node's own pid is one of its namespace's: only what Popen gave counts)
        pidfile = self._node_dir(row["node_id"]) / "pid"
        if pidfile.exists() and self.sandbox is None:
            try:
                pid = int(pidfile.read_text())
            except ValueError:
                pid = 0
            if is_alive(pid):
                started = psutil.Process(pid).create_time()
                with self.store.transaction() as conn:
                    conn.execute(
                        "UPDATE local_nodes SET state = 'running', pid = ?, pid_started = ?,"
                        " updated_at = ? WHERE node_id = ?",
                        (pid, started, time.time(), row["node_id"]),
                    )
                return True
        if time.time() - row["created_at"] < PENDING_GRACE_SECONDS:
            return True
        self._mark_terminated(row["node_id"], "never started")
        return False

    def _exit_reason(self, node_id: str) -> str:
        d = self._node_dir(node_id)
        killed = d / "killed"
        if killed.exists():
            return f"killed: {killed.read_text().strip()}"
        code = d / "exitcode"
        if code.exists():
            value = code.read_text().strip()
            if value.startswith("-"):
                import signal

                try:
                    return f"killed by {signal.Signals(-int(value)).name}"
                except ValueError:
                    pass
            return f"exited with code {value}"
        return "process ended"

    # NodeProvider -------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        out = []
        for row in self._rows(cluster=self.cluster_name):
            tags = loads(row["tags"], {})
            if any(tags.get(k) != v for k, v in tag_filters.items()):
                continue
            if self._refresh(row):
                out.append(row["node_id"])
        return out

    def is_running(self, node_id: str) -> bool:
        row = self._row(node_id)
        return bool(row) and row["state"] == "running" and is_alive(row["pid"], row["pid_started"])

    def is_terminated(self, node_id: str) -> bool:
        row = self._row(node_id)
        return row is None or row["state"] == "terminated" or not self._refresh(row)

    def node_tags(self, node_id: str) -> dict[str, str]:
        row = self._row(node_id)
        return loads(row["tags"], {}) if row else {}

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT tags FROM local_nodes WHERE node_id = ?", (node_id,)
            ).fetchone()
            if row is None:
                return
            merged = {**loads(row["tags"], {}), **tags}
            conn.execute(
                "UPDATE local_nodes SET tags = ?, updated_at = ? WHERE node_id = ?",
                (dumps(merged), time.time(), node_id),
            )

    def node_info(self, node_id: str) -> dict[str, Any]:
        row = self._row(node_id)
        if row is None:
            return {}
        info = loads(row["info"], {})
        info.update({"pid": row["pid"], "state": row["state"]})
        for t in info.get("runtimes") or ():  # what a runtime's node wrote (its ports)
            if t != "dask":
                try:
                    info[t] = json.loads(
                        (self._node_dir(node_id) / f"runtime-{t}.json").read_text())
                except (OSError, ValueError):
                    pass
        if row["exit_reason"]:
            info["exit_reason"] = row["exit_reason"]
        return info

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        log = self._node_dir(node_id) / "node.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:]) if tail else "\n".join(lines)

    def recent_nodes(self, limit: int = 50) -> list[str]:
        rows = self.store.query(
            "SELECT node_id FROM (SELECT node_id, created_at FROM local_nodes WHERE cluster = ?"
            " ORDER BY created_at DESC LIMIT ?) ORDER BY created_at",
            (self.cluster_name, limit),
        )
        return [r[0] for r in rows]

    def node_failure_hint(self, node_id: str) -> str:
        reason = self._exit_reason(node_id)
        tail = self.node_logs(node_id, tail=8)
        return f"{reason}; log {self._node_dir(node_id) / 'node.log'} ends with:\n{tail}"

    def forget_history(self) -> int:
        """Every ended node of this cluster: its folder (log included) and its record."""
        rows = self.store.query(
            "SELECT node_id FROM local_nodes WHERE cluster = ? AND state = 'terminated'",
            (self.cluster_name,))
        for r in rows:
            shutil.rmtree(self._node_dir(r["node_id"]), ignore_errors=True)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM local_nodes WHERE cluster = ? AND state = 'terminated'",
                         (self.cluster_name,))
        return len(rows)
