"""What callers see of a cluster without asking its provider: the recorded view (the
links to its dashboards, through the server that serves them when there is one), how
a client in this process reaches its scheduler, and its nodes' logs."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..core.errors import ConflictError, NotFoundError
from ..core.models import ClusterInfo, ConnectInfo, NodeInfo
from ..core.store import dumps, loads
from ..runtime.tls import attach
from .cluster_records import _target


class ClusterView:
    """Reading clusters (a part of ``ClusterManager``)."""

    def get(self, name: str) -> ClusterInfo:
        """The recorded view of a cluster (no provider calls: cheap)."""
        return self._info(self._row(name))

    def list(self, include_stopped: bool = False) -> list[ClusterInfo]:
        sql = "SELECT * FROM clusters"
        if not include_stopped:
            sql += " WHERE state != 'stopped'"
        return [self._info(r) for r in self.store.query(sql + " ORDER BY created_at")]

    def _info(self, row) -> ClusterInfo:
        nodes = [
            NodeInfo(
                node_id=n["node_id"], node_type=n["node_type"], kind=n["kind"],
                status=n["status"], internal_ip=n["internal_ip"], external_ip=n["external_ip"],
                resources=loads(n["resources"], {}), info=loads(n["info"], {}),
            )
            for n in self.store.query(
                "SELECT * FROM nodes WHERE cluster = ? ORDER BY kind, created_at, node_id",
                (row["name"],),
            )
        ]
        last = self.store.query_one(
            "SELECT id, kind, state, reason, created_at, finished_at, params FROM operations"
            " WHERE target = ? ORDER BY created_at DESC LIMIT 1",
            (_target(row["name"]),),
        )
        if last is not None:  # its warnings (oversubscription) are shown with the cluster
            last = dict(last)
            last["warnings"] = list(loads(last.pop("params"), {}).get("warnings") or [])
        cfg = loads(row["config"], {})
        connect = loads(self._connect_blob(row["name"]), None)
        types = list((cfg.get("runtime") or {}).get("types") or ["dask"])
        spark_ui = (((connect or {}).get("extra") or {}).get("spark") or {}).get("ui")
        if spark_ui and self.spark_ui_prefix:
            spark_ui = self.spark_ui_prefix + quote(row["name"], safe="") + "/"
        # a Spark-only cluster's dashboard is its Spark UI (not Dask's route)
        dask_prefix = self.dashboard_prefix if "dask" in types else None
        return ClusterInfo(
            name=row["name"],
            provider=row["provider"],
            state=row["state"],
            reason=row["reason"],
            config=cfg,
            target_workers=loads(row["target_workers"], {}),
            scheduler_address=row["head_address"],
            dashboard_link=(dask_prefix + quote(row["name"], safe="") + "/status"
                            if dask_prefix and row["dashboard_link"]
                            else spark_ui if "dask" not in types and spark_ui
                            else row["dashboard_link"]),
            connect_info=connect,
            nodes=nodes,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            last_operation=last,
            placement=self.placement.summary(row["name"]),
            spark_ui_link=spark_ui if "spark" in types else None,
            owner=row["owner"],
        )

    def _connect_blob(self, name: str) -> str | None:
        row = self.store.query_one(
            "SELECT info FROM nodes WHERE cluster = ? AND kind = 'head' AND status = 'running'"
            " ORDER BY created_at DESC LIMIT 1",
            (name,),
        )
        if row is None:
            return None
        return dumps(loads(row[0], {}).get("connect_info"))

    def connect_info(self, name: str) -> tuple[str, ConnectInfo]:
        """(provider type, how to reach the scheduler) of a running cluster."""
        info = self.get(name)
        if info.state == "stopped":
            raise ConflictError(
                f"cluster '{name}' is stopped; start it with `up` first", field="name"
            )
        if not info.connect_info:
            raise ConflictError(
                f"cluster '{name}' has no running scheduler yet (state: {info.state})",
                field="name",
            )
        return info.provider, self.usable_connect_info(info.config, name,
                                                       info.connect_info)

    def usable_connect_info(self, cfg: dict[str, Any], name: str,
                            recorded: dict[str, Any]) -> ConnectInfo:
        """A recorded connect info as a client in this process uses it: the cluster's TLS
        credentials attached, and a tunnel another process had forwarded (the slurm
        provider's SSH tunnel to a scheduler job) opened here."""
        info = attach(ConnectInfo.from_dict(recorded), self.store.state_dir, name)
        if (info.extra or {}).get("tunnel"):
            info = self.provider_for(cfg).client_connect_info(info)
        return info

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        info = self.get(name)
        provider = self.provider_for(info.config)
        ids = provider.recent_nodes() or [n.node_id for n in info.nodes]
        if node_id is not None:
            if node_id not in ids:
                raise NotFoundError(
                    f"cluster '{name}' has no node '{node_id}'; nodes: {', '.join(ids)}",
                    field="node_id",
                )
            ids = [node_id]
        return {n: provider.node_logs(n, tail) for n in ids[-50:]}
