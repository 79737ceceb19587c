"""Stopping local nodes: every node's process group signalled at once, processes no
record knows swept, and what an ended cluster leaves (its TLS material, what its
runtimes kept, week-old node folders) removed."""

from __future__ import annotations

import shutil
import threading
import time
from typing import TYPE_CHECKING

from ...core.process_groups import GroupRef, terminate_group, writes_under
from ...core.store import loads
from ...runtime.tls import remove_cluster_tls
from .node import CANCELLED_MARK
from .processes import find_marked_processes

if TYPE_CHECKING:
    from ...runtime.base import Runtime


class LocalNodeStop:
    """Terminating nodes and cleaning up (a part of ``LocalNodeProvider``)."""

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        rows = [r for r in (self._row(n) for n in node_ids) if r is not None]
        # signal every node first, then wait for all: N nodes stop in one grace period;
        # a node whose leader died is stopped only in what still logs to its folder (its
        # group number may be somebody else's by now)
        threads = [
            threading.Thread(
                target=terminate_group,
                args=(GroupRef(r["pid"], r["pid_started"]), self.settings.terminate_grace,
                      writes_under(self._node_dir(r["node_id"]))),
            )
            for r in rows if r["pid"]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in rows:  # a launch still in flight sees this and does not start (node.py)
            try:
                (self._node_dir(r["node_id"]) / CANCELLED_MARK).touch()
            except OSError:
                pass
        # a process whose pid never reached the record (crash mid-launch) is still marked
        for pid, _node in find_marked_processes(
            self.context.state_dir, node_ids=[r["node_id"] for r in rows]
        ).items():
            terminate_group(GroupRef.of(pid), self.settings.terminate_grace,
                            writes_under(self.nodes_dir))
        for r in rows:
            self._mark_terminated(r["node_id"], "terminated")
            shutil.rmtree(self._node_dir(r["node_id"]) / "work", ignore_errors=True)

    def sweep_orphans(self) -> int:
        """Stop processes marked as this cluster's nodes that no live record knows."""
        known = {r["node_id"] for r in self._rows(cluster=self.cluster_name)}
        orphans = {
            pid: node for pid, node in find_marked_processes(
                self.context.state_dir, cluster=self.cluster_name
            ).items() if node not in known
        }
        for pid in orphans:
            terminate_group(GroupRef.of(pid), self.settings.terminate_grace,
                            writes_under(self.nodes_dir))
        return len(orphans)

    def _runtimes_run(self) -> list[Runtime]:
        """Every runtime that a node of this cluster ran here (its rows' ``runtimes``),
        each once; one no longer installed is passed over (nothing can release for it)."""
        # deferred: start-up (runtime.base ~16 ms, loads urllib.request, importlib.metadata)
        from ...runtime.base import installed, runtime_class

        types: list[str] = []
        for r in self.store.query("SELECT info FROM local_nodes WHERE cluster = ?",
                                  (self.cluster_name,)):
            for t in loads(r["info"], {}).get("runtimes") or ["dask"]:
                if t not in types:
                    types.append(t)
        have = set(installed())
        return [runtime_class(t)() for t in types if t in have]

    def cleanup(self) -> None:
        """Forget node folders of this cluster that ended more than a week ago, and its
        TLS material (a next ``up`` makes a new CA)."""
        if not self._rows(cluster=self.cluster_name):
            remove_cluster_tls(self.context.state_dir, self.cluster_name)
            for rt in self._runtimes_run():
                rt.release_local(self.context.state_dir, self.cluster_name)
        cutoff = time.time() - 7 * 24 * 3600
        rows = self.store.query(
            "SELECT node_id FROM local_nodes WHERE cluster = ? AND state = 'terminated'"
            " AND terminated_at < ?",
            (self.cluster_name, cutoff),
        )
        for r in rows:
            shutil.rmtree(self._node_dir(r["node_id"]), ignore_errors=True)
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM local_nodes WHERE cluster = ? AND state = 'terminated'"
                " AND terminated_at < ?",
                (self.cluster_name, cutoff),
            )
