"""The ``storage:`` section of cluster configs: nodes get the same remotes as the notebook.

``storage: {remotes: [mydata, results]}`` gives every node of the cluster an rclone config
with one remote per storage, named after it and rooted at its source, so code on a worker
runs ``rclone copy mydata:inputs /tmp/in`` (with ``$CLOUDTIK_RCLONE``, the same rclone
binary) or hands ``$RCLONE_CONFIG`` to any rclone-based library.  The config, with the
credentials, travels in ``node_config["runtime"]["secret_files"]``: the provider writes it
where only the node can read it (the local provider: a 0600 file in the node's own folder),
never into plain user data or the state database.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError, NotFoundError
from .rclone import Remote, render_config

CONFIG_FILE = "rclone.conf"
BASE_PREFIX = "cloudtik-base-"


def node_runtime(manager: Any, cfg: dict[str, Any], role: str) -> dict[str, Any]:
    """What a node needs for the cluster's storages (called by the ClusterManager)."""
    names = list((cfg.get("storage") or {}).get("remotes") or [])
    if not names:
        return {}
    from ..core.config import provider_class
    from .manager import StorageManager

    ptype = cfg["provider"]["type"]
    if not getattr(provider_class(ptype, manager.settings), "delivers_secret_files", False):
        raise ConfigError(
            f"storage.remotes: the {ptype} provider cannot yet hand credentials to its nodes "
            "privately, so storages cannot be attached to its clusters; copy data with "
            "%storage cp instead", field="storage.remotes", value=ptype)
    storage = StorageManager(settings=manager.settings, store=manager.store,
                             user=getattr(manager, "user", None), supervise=False)
    remotes: dict[str, Remote] = {}
    for name in names:
        try:
            info = storage.catalog.get(name)
        except NotFoundError as e:
            raise ConfigError(f"storage.remotes: {e.message}", field="storage.remotes",
                              value=name) from None
        remote = storage.catalog.remote(name)
        source = info.source.strip()
        if source:
            # NAME: is the storage's source, as in %storage ls NAME:
            remotes[BASE_PREFIX + name] = remote
            remotes[name] = Remote("alias", {"remote": f"{BASE_PREFIX}{name}:{source}"})
        else:
            remotes[name] = remote
    content = render_config(remotes, deterministic=True)
    return {
        "secret_files": [{"name": CONFIG_FILE, "content": content, "env": "RCLONE_CONFIG"}],
        "env": {"CLOUDTIK_RCLONE": storage.binary,
                "CLOUDTIK_STORAGES": ",".join(names)},
    }
