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

    ptype = cfg["provider"]["type"]
    cls = provider_class(ptype, manager.settings)
    if getattr(cls, "delivers_secrets_at_runtime", False):
        # nothing private at boot: the manager hands the config to the workers over the
        # authenticated Dask connection once they are up (attach_to_workers)
        return {"env": {"CLOUDTIK_STORAGES": ",".join(names)}}
    if not getattr(cls, "delivers_secret_files", False):
        raise ConfigError(
            f"storage.remotes: the {ptype} provider cannot yet hand credentials to its nodes "
            "privately, so storages cannot be attached to its clusters; copy data with "
            "%storage cp instead", field="storage.remotes", value=ptype)
    content, binary = rclone_config(manager, names)
    return {
        "secret_files": [{"name": CONFIG_FILE, "content": content, "env": "RCLONE_CONFIG"}],
        "env": {"CLOUDTIK_RCLONE": binary,
                "CLOUDTIK_STORAGES": ",".join(names)},
    }


def rclone_config(manager: Any, names: list[str]) -> tuple[str, str]:
    """(rclone config text with one remote per storage, the rclone binary here)."""
    from .manager import StorageManager

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
    return render_config(remotes, deterministic=True), storage.binary


async def attach_to_workers(manager: Any, cfg: dict[str, Any], info: Any) -> bool:
    """Hand the cluster's storages to its workers at run time (providers that deliver
    nothing private at boot), over the authenticated Dask connection; True if it did."""
    names = list((cfg.get("storage") or {}).get("remotes") or [])
    if not names:
        return False
    from ..core.config import provider_class

    cls = provider_class(cfg["provider"]["type"], manager.settings)
    if not getattr(cls, "delivers_secrets_at_runtime", False):
        return False
    import asyncio

    import cloudpickle

    from . import node_plugin

    content, binary = await asyncio.to_thread(rclone_config, manager, names)
    cloudpickle.register_pickle_by_value(node_plugin)  # the nodes do not have our package
    await cls.register_worker_plugin(info, node_plugin.RcloneConfigPlugin(content, names,
                                                                          binary))
    return True
