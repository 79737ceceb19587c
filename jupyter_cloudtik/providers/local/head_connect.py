"""How to reach a local cluster's head: Dask's scheduler file, what every other
runtime's head wrote, and the cluster's TLS credentials attached."""

from __future__ import annotations

import json

from ...core.models import ConnectInfo
from ...core.store import loads
from ...runtime.tls import attach


class LocalHeadConnect:
    """Connect info of a head node (a part of ``LocalNodeProvider``)."""

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        row = self._row(head_node_id)
        types = (loads(row["info"], {}) if row else {}).get("runtimes") or ["dask"]
        if types != ["dask"]:
            return self._runtimes_connect_info(head_node_id, types)
        return self._dask_connect_info(head_node_id)

    def _runtimes_connect_info(self, head_node_id: str,
                               types: list[str]) -> ConnectInfo | None:
        """Dask's scheduler file plus what every other runtime's head wrote (None until
        all of them are up)."""
        # deferred: start-up (runtime.base ~21 ms, loads urllib.request, http.client)
        from ...runtime.base import runtime_class

        host = self.internal_ip(head_node_id) or "127.0.0.1"
        extra = {}
        for t in types:
            if t == "dask":
                continue
            part = runtime_class(t)().head_info(self._node_dir(head_node_id), host)
            if part is None:
                return None
            extra[t] = part
        if "dask" in types:
            info = self._dask_connect_info(head_node_id)
            if info is not None:
                info.extra.update(extra)
            return info
        first = extra[types[0]]
        return ConnectInfo(scheduler_address=first.get("master_url") or "",
                           dashboard_link=first.get("ui"), http_address=first.get("ui"),
                           extra=extra)

    def _dask_connect_info(self, head_node_id: str) -> ConnectInfo | None:
        path = self._node_dir(head_node_id) / "scheduler.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        host = self.internal_ip(head_node_id)
        port = (data.get("services") or {}).get("dashboard")
        address = data["address"]
        if self.host in ("0.0.0.0", ""):
            scheme = address.split("://", 1)[0]
            address = f"{scheme}://{host}:{address.rsplit(':', 1)[1]}"
        dash = "127.0.0.1" if self.tls else host
        info = ConnectInfo(
            scheduler_address=address,
            dashboard_link=f"http://{dash}:{port}/status" if port else None,
            http_address=f"http://{dash}:{port}" if port else None,
            extra={"tls": True} if self.tls else {},
        )
        return attach(info, self.context.state_dir, self.cluster_name)
