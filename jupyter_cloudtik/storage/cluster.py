"""The ``storage:`` section of cluster configs: nodes get the same remotes as the notebook.

``storage: {remotes: [mydata, results]}`` gives every node of the cluster an rclone config
with one remote per storage, named after it and rooted at its source, so code on a worker
runs ``rclone copy mydata:inputs /tmp/in`` (with ``$CLOUDTIK_RCLONE``, the same rclone
binary) or hands ``$RCLONE_CONFIG`` to any rclone-based library.  The config, with the
credentials, travels in ``node_config["runtime"]["secret_files"]``: the provider writes it
where only the node can read it (the local provider: a 0600 file in the node's own folder),
never into plain user data or the state database.

A node runs whatever its cluster's owner asks of it, so it receives only what the access
policy grants that owner (``core/grants.py``): a storage they may write, its credential; a
storage they may only read, its read-only credential — or, if it has none, the ``up`` is
refused with a message naming the field and what an admin can add.  An unknown storage and
another group's get the same answer, which lists nothing.
"""

from __future__ import annotations

from typing import Any

from ..core import env as envnames
from ..core.errors import ConfigError, NotFoundError, PermissionDeniedError
from ..core.features import feature_service
from ..core.grants import policy_for
from ..core.secrets import open_secret_store
from .manager import StorageManager
from .rclone import Remote, render_config

CONFIG_FILE = "rclone.conf"
BASE_PREFIX = "cloudtik-base-"


def node_runtime(manager: Any, cfg: dict[str, Any], role: str) -> dict[str, Any]:
    """What a node needs for the cluster's storages (called by the ClusterManager)."""
    names = list((cfg.get("storage") or {}).get("remotes") or [])
    if not names:
        return {}
    from ..core.config import provider_class  # deferred: start-up (core.config ~10 ms, loads yaml)

    ptype = cfg["provider"]["type"]
    cls = provider_class(ptype, manager.settings)
    node_grants(manager, cfg)  # what the owner may not give a node is refused at `up`
    if getattr(cls, "delivers_secrets_at_runtime", False):
        # nothing private at boot: the manager hands the config to the workers over the
        # authenticated Dask connection once they are up (attach_to_workers)
        return {"env": {envnames.STORAGES: ",".join(names)}}
    if not getattr(cls, "delivers_secret_files", False):
        raise ConfigError(
            f"storage.remotes: the {ptype} provider cannot yet hand credentials to its nodes "
            "privately, so storages cannot be attached to its clusters; copy data with "
            "%storage cp instead", field="storage.remotes", value=ptype)
    content, binary = rclone_config(manager, names, cfg)
    return {
        "secret_files": [{"name": CONFIG_FILE, "content": content, "env": "RCLONE_CONFIG"}],
        "env": {envnames.RCLONE: binary,
                envnames.STORAGES: ",".join(names)},
    }


def node_grants(manager: Any, cfg: dict[str, Any]) -> list[tuple[Any, dict[str, str]]]:
    """For each storage the config names: the owner's grant and what a node may receive
    for it (the policy's ``node_secrets``).  Writable if the owner may write it, else
    read-only (its read-only credential, or a refusal)."""
    names = list((cfg.get("storage") or {}).get("remotes") or [])
    policy = policy_for(manager.store)
    owner = _owner(manager, cfg)
    secrets = _secrets(manager)
    out = []
    for i, name in enumerate(names):
        field = f"storage.remotes[{i}]"
        if not isinstance(name, str):
            raise ConfigError(f"{field}: {name!r} is not a storage name", field=field)
        try:
            grant = policy.grant(owner, "storage", name, "write", field=field)
        except PermissionDeniedError:  # read-only for them: a read-only credential
            grant = policy.grant(owner, "storage", name, "read", field=field)
        try:
            values = policy.node_secrets(grant, secrets)
        except PermissionDeniedError as e:
            e.field = field
            raise
        out.append((grant, values))
    return out


def _owner(manager: Any, cfg: dict[str, Any]) -> Any:
    """Whom the cluster's nodes act for: its recorded owner (a scale by the reaper), or
    the caller starting it."""
    recorded = feature_service("cluster_owner")(manager.store, cfg.get("cluster_name"))
    owner = recorded[0] if recorded is not None and recorded[1] != "stopped" else None
    return policy_for(manager.store).caller(owner or manager.user)


def _secrets(manager: Any) -> Any:
    return open_secret_store(manager.settings, manager.store)


def rclone_config(manager: Any, names: list[str], cfg: dict[str, Any] | None = None
                  ) -> tuple[str, str]:
    """(rclone config text with one remote per storage, the rclone binary here), with
    only what the owner's grants let a node hold."""
    storage = StorageManager(settings=manager.settings, store=manager.store,
                             user=getattr(manager, "user", None), supervise=False)
    granted = node_grants(manager, {**(cfg or {}), "storage": {"remotes": names}})
    remotes: dict[str, Remote] = {}
    for (grant, values), name in zip(granted, names, strict=True):
        try:
            info = storage.catalog.get(name)
        except NotFoundError:
            raise ConfigError(f"storage.remotes: no storage named {name!r} that you may use",
                              field="storage.remotes", value=name) from None
        remote = storage.catalog.remote(grant, values=values)
        source = info.source.strip()
        if source:
            # NAME: is the storage's source, as in %storage ls NAME:
            remotes[BASE_PREFIX + name] = remote
            remotes[name] = Remote("alias", {"remote": f"{BASE_PREFIX}{name}:{source}"})
        else:
            remotes[name] = remote
    return render_config(remotes, deterministic=True), storage.binary


async def on_cluster_ready(manager: Any, cfg: dict[str, Any],
                           info: Any) -> tuple[str, str] | None:
    """The clusters' ``cluster_ready`` hook (registered in storage's Feature)."""
    if await attach_to_workers(manager, cfg, info):
        return ("storage", "storages handed to the workers over TLS")
    return None


async def attach_to_workers(manager: Any, cfg: dict[str, Any], info: Any) -> bool:
    """Hand the cluster's storages to its workers at run time (providers that deliver
    nothing private at boot), over the authenticated Dask connection; True if it did."""
    names = list((cfg.get("storage") or {}).get("remotes") or [])
    if not names:
        return False
    from ..core.config import provider_class  # deferred: start-up (core.config ~10 ms, loads yaml)

    cls = provider_class(cfg["provider"]["type"], manager.settings)
    if not getattr(cls, "delivers_secrets_at_runtime", False):
        return False
    import asyncio

    import cloudpickle

    # deferred: start-up (storage.node_plugin ~264 ms, loads distributed)
    from . import node_plugin

    content, binary = await asyncio.to_thread(rclone_config, manager, names, cfg)
    cloudpickle.register_pickle_by_value(node_plugin)  # the nodes do not have our package
    await cls.register_worker_plugin(info, node_plugin.RcloneConfigPlugin(content, names,
                                                                          binary))
    return True
