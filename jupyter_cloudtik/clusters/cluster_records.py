"""The rows of the ``clusters`` and ``nodes`` tables a cluster's operations write: its
state, its nodes as the provider and the scheduler report them, and the history a
freed name leaves behind (moved aside when another owner takes the name)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from ..core.errors import NotFoundError
from ..core.operations import Target
from ..core.store import dumps
from ..providers.base import NodeProvider

log = logging.getLogger("jupyter_cloudtik")


def _target(name: str) -> str:
    return str(Target("cluster", name))


class ClusterRecords:
    """The cluster's own rows (a part of ``ClusterManager``)."""

    def _row(self, name: str):
        row = self.store.query_one("SELECT * FROM clusters WHERE name = ?", (name,))
        if row is None:
            # the hint names the caller's own clusters only (a hub serves many owners)
            known = [r[0] for r in self.store.query(
                "SELECT name FROM clusters WHERE state != 'stopped'"
                " AND (owner = ? OR owner IS NULL) ORDER BY name", (self.user,))]
            hint = f"; clusters: {', '.join(known)}" if known else "; there are no clusters"
            raise NotFoundError(f"no cluster named '{name}'{hint}", field="name", value=name)
        return row

    def _archive_history(self, name: str, row: Any, prov: NodeProvider,
                         keep_reservation: str | None) -> str | None:
        """A stopped cluster's name is taken by another owner: what the old cluster left
        must not become the new owner's.  Its finished operations (and so their events)
        and placement records move to a target of their own, ``cluster:NAME@ARCHIVE``
        (the old owner still lists them among their operations); its node records and
        node logs are removed (they are the provider's, under the cluster's name, and
        would be listed by the new cluster's ``logs``)."""
        archive = f"{name}@{uuid.uuid4().hex[:12]}"
        with self.store.transaction() as conn:
            now = conn.execute("SELECT owner, state FROM clusters WHERE name = ?",
                               (name,)).fetchone()
            if now is None or now["state"] != "stopped" or now["owner"] == self.user:
                return None  # taken meanwhile (start_up refuses it under the lock)
            conn.execute(
                "UPDATE operations SET target = ? WHERE target = ? AND state NOT IN"
                " ('pending', 'running')", (_target(archive), _target(name)))
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
        self.placement.archive_cluster(name, archive, keep=keep_reservation)
        forgotten = prov.forget_history()
        log.info("cluster name '%s' passed from %s to %s: history archived as %s, "
                 "%d ended node(s) forgotten", name, row["owner"], self.user, archive,
                 forgotten)
        return archive

    def _record_node(self, cluster: str, node_id: str, node_type: str, kind: str, status: str,
                     resources: dict[str, Any], prov: NodeProvider,
                     extra: dict[str, Any] | None = None) -> None:
        row = self._node_row(cluster, node_id, node_type, kind, status, resources, prov, extra)
        with self.store.transaction() as conn:
            conn.execute(_UPSERT_NODE, row)

    def _node_row(self, cluster: str, node_id: str, node_type: str, kind: str, status: str,
                  resources: dict[str, Any], prov: NodeProvider,
                  extra: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """A node's row for ``_UPSERT_NODE`` (asks the provider: not in a transaction)."""
        info = {**prov.node_info(node_id), **(extra or {})}
        placed = self.placement.node_placement(cluster, node_id)
        if placed:
            info["placement"] = placed
        now = time.time()
        try:
            internal_ip = prov.internal_ip(node_id)
            external_ip = prov.external_ip(node_id)
        except Exception:
            internal_ip = external_ip = None
        return (cluster, node_id, node_type, kind, status, internal_ip, external_ip,
                dumps(resources), dumps(info), now, now)

    def _forget_node(self, cluster: str, node_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ? AND node_id = ?",
                         (cluster, node_id))

    def _set_state(self, name: str, state: str, reason: str | None = None) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE clusters SET state = ?, reason = ?, updated_at = ? WHERE name = ?",
                (state, reason, time.time(), name),
            )


_UPSERT_NODE = (
    "INSERT INTO nodes (cluster, node_id, node_type, kind, status, internal_ip,"
    " external_ip, resources, info, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(cluster, node_id) DO UPDATE SET status = excluded.status,"
    " internal_ip = excluded.internal_ip, external_ip = excluded.external_ip,"
    " resources = excluded.resources, info = excluded.info,"
    " updated_at = excluded.updated_at")
