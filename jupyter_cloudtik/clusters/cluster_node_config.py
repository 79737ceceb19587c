"""What a node is given to run: its ``node_config["runtime"]`` (role, threads, memory,
the scheduler to join, each runtime's part, what features contribute such as storage
mounts and credentials) and the launch hash that tells an outdated node from a current
one."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from ..core.features import node_runtime_contributors
from ..core.models import ConnectInfo
from ..runtime import base as runtimes

if TYPE_CHECKING:
    from .manager import ClusterManager


# Features that add to what every node gets: "module:function" called as
# fn(manager, cfg, role) -> dict merged into node_config["runtime"].  Credentials go in
# runtime["secret_files"] = [{"name", "content", "env"}]: a provider writes each file where
# only the node can read it and points the node's environment variable ``env`` at it (never
# into plain user_data); runtime["env"] holds plain environment variables.
# Features contribute through their ``node_runtime`` parts (core/features.py; storage's
# mounts are one), so the core names none of them.


def _contributions(manager: ClusterManager, cfg: dict[str, Any], role: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for contribute in node_runtime_contributors():
        extra = contribute(manager, cfg, role) or {}
        for key, value in extra.items():
            if isinstance(value, list):
                out[key] = [*out.get(key, []), *value]
            elif isinstance(value, dict):
                out[key] = {**out.get(key, {}), **value}
            else:
                out[key] = value
    return out


def _launch_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


class ClusterNodeConfig:
    """Node configs (a part of ``ClusterManager``)."""

    def _runtime_config(self, cfg: dict[str, Any], type_name: str, role: str,
                        scheduler_address: str | None = None,
                        head_info: ConnectInfo | None = None,
                        head_node: str | None = None) -> dict[str, Any]:
        t = cfg["available_node_types"][type_name]
        res = t["resources"]
        runtime = {
            "role": role,
            "cluster_name": cfg["cluster_name"],
            "nthreads": max(int(res.get("CPU") or 1), 1),
            "memory_limit": int(res.get("memory") or 0),
            "resources": res,
            "setup_commands": list(cfg.get("setup_commands") or []),
            "dask": dict((cfg.get("runtime") or {}).get("dask") or {}),
        }
        for key in ("pip", "sync_env"):  # packages the nodes install (providers that can)
            if (cfg.get("runtime") or {}).get(key):
                runtime[key] = cfg["runtime"][key]
        if runtimes.types_of(cfg) != list(runtimes.DEFAULT_RUNTIMES):
            runtime["types"] = runtimes.types_of(cfg)
        if head_node:  # the provider's workers find the scheduler from the head's id
            runtime["head_node_id"] = head_node
        elif scheduler_address:
            runtime["scheduler_address"] = scheduler_address
        for rt in runtimes.runtimes_of(cfg):
            if rt.name != "dask":
                runtime[rt.name] = rt.node_config(cfg, role, head_info)
        runtime.update(_contributions(self, cfg, role))
        return {**t.get("node_config", {}), "runtime": runtime}
