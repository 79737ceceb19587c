"""The provider interfaces, with CloudTik / Ray cluster-launcher semantics.

A ``NodeProvider`` is the source of truth for which nodes exist: the manager never keeps
a private list it trusts, it asks ``non_terminated_nodes`` with tag filters every time.
Tags are how a node is known to belong to a cluster and what it is (head or worker, which
node type, in which status), so any process (another kernel, the CLI, the reaper) can find
a cluster it did not start.

Providers are synchronous, like the cloud SDKs they wrap; the async core calls them in
worker threads.  A provider must make ``terminate_node`` idempotent: terminating a node that
is already gone is not an error.

A ``WorkspaceProvider`` creates what clusters share (network, identity, storage) for a
workspace name.  Providers that have no such thing (local, dask-gateway) do not implement it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import NodeLaunchError, OperationTimeout
from ..core.models import ConnectInfo

if TYPE_CHECKING:
    from distributed import Client

    from ..core.operations import OperationContext
    from ..core.settings import CloudTik
    from ..core.store import Store
    from ..offers import OfferQuery, OfferSet

# Tag keys (the same names CloudTik uses) -------------------------------------------------
TAG_CLUSTER_NAME = "cloudtik-cluster-name"
TAG_NODE_KIND = "cloudtik-node-kind"
TAG_NODE_TYPE = "cloudtik-node-type"
TAG_NODE_STATUS = "cloudtik-node-status"
TAG_LAUNCH_CONFIG = "cloudtik-launch-config"
TAG_NODE_NAME = "cloudtik-node-name"

NODE_KIND_HEAD = "head"
NODE_KIND_WORKER = "worker"

STATUS_UNINITIALIZED = "uninitialized"
STATUS_SETTING_UP = "setting-up"
STATUS_UP_TO_DATE = "up-to-date"
STATUS_UPDATE_FAILED = "update-failed"


@dataclass
class ProviderContext:
    """What the core lends a provider: where to keep files, the store, settings, a logger."""

    state_dir: Path
    store: Store
    settings: CloudTik
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("jupyter_cloudtik"))


@dataclass
class Capacity:
    """What a provider can still give, for the up-front check before anything starts."""

    cpus: float | None = None  # None: no limit known
    memory: int | None = None
    gpus: int | None = None
    max_nodes: int | None = None
    description: str = ""
    in_use: dict[str, dict[str, float]] = field(default_factory=dict)  # cluster -> totals
    #: the most one node may ask for (a machine's memory): a bigger node cannot run at all
    node_memory: int | None = None


class NodeProvider:
    """Creates, finds and terminates the nodes of one cluster."""

    #: short name (the entry point name)
    provider_type: ClassVar[str] = ""
    #: JSON Schema of the ``provider:`` section (beyond ``type``); served to UIs as a form
    config_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    #: JSON Schema of a node type's ``node_config``
    node_config_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    #: can create_node deliver node_config["runtime"]["secret_files"] privately (a file only
    #: the node can read, never plain user data)?  Features that hand nodes credentials
    #: (storage.remotes) refuse providers that cannot.
    delivers_secret_files: ClassVar[bool] = False
    #: or does the manager hand them over at run time instead, as a worker plugin over the
    #: cluster's authenticated Dask connection (``register_worker_plugin``)?
    delivers_secrets_at_runtime: ClassVar[bool] = False
    #: does the manager have to wait for workers to connect to the scheduler itself?
    manages_runtime: ClassVar[bool] = True
    #: do worker nodes find the scheduler themselves from the head's node id
    #: (``node_config["runtime"]["head_node_id"]``, no ``scheduler_address``) and wait for
    #: it to come up?  Then ``up`` starts a new head's workers right after the head, before
    #: its scheduler answers (a Dask-only cluster), and cancels them if the head fails.
    workers_find_scheduler: ClassVar[bool] = False
    #: does the provider's own scheduler pick which workers go on a scale-down?  Then
    #: ``terminate_nodes`` of N workers ends *some* N of them, retired gracefully by that
    #: scheduler, and the manager neither retires the ones it meant first (the scheduler
    #: would read that as a failure and start a replacement) nor assumes which survived.
    picks_workers_to_retire: ClassVar[bool] = False
    #: ``runtime.pip`` / ``runtime.sync_env``: True (the provider stages wheels its nodes
    #: install), "shared" (its nodes run this very Python), False (it cannot: refused)
    installs_packages: ClassVar[bool | str] = False

    def __init__(
        self, provider_config: dict[str, Any], cluster_name: str, context: ProviderContext
    ) -> None:
        self.provider_config = provider_config
        self.cluster_name = cluster_name
        self.context = context

    # defaults and checks ----------------------------------------------------------------
    @classmethod
    def check_packages(cls, cfg: dict[str, Any]) -> None:
        """Refuse ``runtime.pip`` / ``runtime.sync_env`` this provider cannot honour, before
        anything starts (runtime/environment.py ``check_packages``)."""
        # deferred: start-up (runtime.environment ~24 ms, loads importlib.metadata, subprocess)
        from ..runtime.environment import check_packages

        check_packages(cfg, cls)

    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        """Node types used when a config declares none (``%cluster up --workers 4``)."""
        return {
            "head": {"node_config": {}, "resources": {"CPU": 1}},
            "worker": {"node_config": {}, "resources": {"CPU": 1}, "min_workers": 1,
                       "max_workers": 8},
        }

    @classmethod
    def fill_resources(
        cls, provider_config: dict[str, Any], node_type: dict[str, Any]
    ) -> dict[str, Any]:
        """Resources of a node type, completed from what the provider knows (e.g. flavor)."""
        return dict(node_type.get("resources") or {})

    @classmethod
    def provisioned(cls, provider_config: dict[str, Any], node_type: dict[str, Any],
                    role: str = "worker") -> dict[str, float]:
        """What a node of ``node_type`` really gets from this provider (``CPU`` cores),
        whatever its ``resources`` declare: what quotas and costs count (a declared
        ``CPU: 0`` is no free node).  Providers that know better (a flavor's vCPUs, a
        job's cores) say so; the default is the declared cores, at least one."""
        res = node_type.get("resources") or {}
        return {"CPU": max(float(res.get("CPU") or 0), 1.0)}

    @classmethod
    def placement_options(cls, provider_config: dict[str, Any],
                          node_type: dict[str, Any]) -> dict[str, Any]:
        """Placement options a node type gets unless its config says otherwise (e.g. keep
        the flavor the node type names, pack a batch into one zone).  Same keys as a
        config's ``placement:`` section; the config's own options win."""
        return {}

    def capacity(self) -> Capacity:
        """What can still be placed; ``Capacity()`` means "no limit known"."""
        return Capacity()

    def check_node_types(self, cfg: dict[str, Any]) -> None:
        """Refuse, before placement and before anything starts, node types whose
        configured machine the provider cannot give now (a flavor not on sale): placement
        alone would only say that no offer matched.  The default checks nothing."""

    def oversubscription(self, cpus: float, memory: int) -> str | None:
        """A warning when adding nodes that declare ``cpus`` cores and ``memory`` bytes
        is allowed but oversubscribes what the provider has by much (the local provider:
        this machine); None when it does not (the default)."""
        return None

    def offers(self, query: OfferQuery | None = None) -> OfferSet:
        """Where this provider can place nodes, as placement offers (docs/placement.md).

        The default is one offer made from ``capacity()``: a provider with flavors, zones,
        prices or quotas overrides it (one offer per flavor x availability zone, quotas as
        shared pools).  ``query`` says which cluster, user and node types it is for.
        """
        from ..offers import Offer, OfferSet  # deferred: start-up (offers ~9 ms)

        cap = self.capacity()
        free = {"CPU": cap.cpus, "memory": cap.memory, "GPU": cap.gpus,
                "instances": cap.max_nodes}
        return OfferSet([Offer(
            key=f"{self.provider_type or type(self).__name__}/default",
            provider=self.provider_type, free=free,
            instances=[{"cluster": c} for c in cap.in_use],
            description=cap.description)])

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Fill provider-specific settings into each node type's node_config."""
        return cluster_config

    # nodes ------------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        raise NotImplementedError

    def is_running(self, node_id: str) -> bool:
        raise NotImplementedError

    def is_terminated(self, node_id: str) -> bool:
        raise NotImplementedError

    def node_tags(self, node_id: str) -> dict[str, str]:
        raise NotImplementedError

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        raise NotImplementedError

    def set_nodes_tags(self, node_ids: list[str], tags: dict[str, str]) -> None:
        """The same tags on many nodes; clouds with batch tag APIs override this so that
        tagging N nodes is not N calls."""
        for n in node_ids:
            self.set_node_tags(n, tags)

    def internal_ip(self, node_id: str) -> str | None:
        raise NotImplementedError

    def external_ip(self, node_id: str) -> str | None:
        return None

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, dict[str, Any]]:
        """Create ``count`` nodes in one go; returns {node_id: info} of the created nodes.

        ``node_config["runtime"]`` (filled by the manager) says what the node must run:
        ``{"role": "head"|"worker", "scheduler_address": ..., "nthreads": ..., "memory_limit":
        ..., "setup_commands": [...], "dask": {...}}``.
        """
        raise NotImplementedError

    def terminate_node(self, node_id: str) -> None:
        raise NotImplementedError

    def terminate_nodes(self, node_ids: list[str]) -> None:
        for node_id in node_ids:
            self.terminate_node(node_id)

    def node_info(self, node_id: str) -> dict[str, Any]:
        """Extra facts about a node for status views (pid, ports, flavor, zone, ...)."""
        return {}

    # runtime ------------------------------------------------------------------------------
    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        """How to reach the scheduler on the head node; None while it is not up yet."""
        raise NotImplementedError

    async def wait_head_ready(
        self, head_node_id: str, ctx: OperationContext, timeout: float
    ) -> ConnectInfo:
        """Wait for the head's scheduler to answer; the default polls ``connect_info``."""
        import asyncio
        import time

        deadline = time.monotonic() + timeout
        while True:
            ctx.checkpoint()
            info = await asyncio.to_thread(self.connect_info, head_node_id)
            if info is not None:
                return info
            if not await asyncio.to_thread(self.is_running, head_node_id):
                raise NodeLaunchError(
                    f"the head node {head_node_id} stopped while starting: "
                    + self.node_failure_hint(head_node_id)
                )
            if time.monotonic() > deadline:
                raise OperationTimeout(
                    f"the head node {head_node_id} did not start its scheduler within "
                    f"{timeout:.0f}s"
                )
            await asyncio.sleep(0.02)

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        """The last ``tail`` lines of the node's runtime log (0: all), if the provider has it."""
        return ""

    def recent_nodes(self, limit: int = 50) -> list[str]:
        """Ids of this cluster's nodes, ended ones included, oldest first (for logs)."""
        return []

    def forget_history(self) -> int:
        """Forget the records and logs of this cluster's ended nodes (its name passes to
        another owner, who must not read them); the number of nodes forgotten."""
        return 0

    def sweep_orphans(self) -> int:
        """Stop anything of this cluster the provider can find but no record knows."""
        return 0

    def node_failure_hint(self, node_id: str) -> str:
        """A short explanation of why a node died (e.g. the tail of its log)."""
        return "no details"

    def client_connect_info(self, info: ConnectInfo) -> ConnectInfo:
        """A recorded connect info made usable in this process.  Called only for infos
        whose ``extra`` has ``tunnel`` (a port forwarded by the process that recorded it:
        the slurm provider's SSH tunnel); the default changes nothing."""
        return info

    @classmethod
    def make_client(cls, info: ConnectInfo, **kwargs: Any) -> Client:
        """A ``distributed.Client`` connected to the cluster; runs where the user is."""
        from distributed import Client

        # deferred: start-up (runtime.tls ~12 ms, loads ssl, socket)
        from ..runtime.tls import client_security

        sec = client_security(info)
        if sec is not None:
            kwargs.setdefault("security", sec)
        return Client(info.scheduler_address, **kwargs)

    @classmethod
    async def register_worker_plugin(cls, info: ConnectInfo, plugin: Any) -> None:
        """Register a Dask worker plugin (it also reaches later workers) over the cluster's
        own authenticated connection: mutual TLS by default, the gateway's for gateways."""
        # deferred: start-up (runtime.dask ~43 ms, loads asyncio, urllib.request)
        from ..runtime.dask import register_worker_plugin

        await register_worker_plugin(info, plugin)

    def cleanup(self) -> None:
        """Release anything left after the last node of the cluster is gone."""


class WorkspaceProvider:
    """Creates, checks and deletes the shared resources of a workspace.

    Registered under the entry point group ``jupyter_cloudtik.workspace_providers`` and
    driven by ``workspaces.manager.WorkspaceManager``, which records the workspace
    and runs create/delete as operations.  ``on_resource(key, value)`` (set by the
    manager) records each resource id as soon as it exists, so a killed create can be
    finished and nothing made is forgotten.
    """

    provider_type: ClassVar[str] = ""
    config_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    def __init__(self, provider_config: dict[str, Any], workspace_name: str,
                 context: ProviderContext) -> None:
        self.provider_config = provider_config
        self.workspace_name = workspace_name
        self.context = context

    @classmethod
    def normalize_config(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        """The provider section with defaults filled in (what is recorded and compared)."""
        return dict(provider_config)

    def on_resource(self, key: str, value: Any) -> None:
        """Record (or, with None, forget) a resource of the workspace."""

    def create_workspace(self, ctx: OperationContext, rollback: bool = True) -> dict[str, Any]:
        """Create what is missing (idempotent); on failure, delete what was made when
        ``rollback`` (the workspace never was ready)."""
        raise NotImplementedError

    def delete_workspace(self, ctx: OperationContext, delete_storage: bool = True) -> None:
        """Delete everything of the workspace (idempotent: gone is fine)."""
        raise NotImplementedError

    def check_workspace_integrity(self) -> dict[str, str]:
        """{resource: "ok" | "missing" | problem} for every resource of the workspace."""
        raise NotImplementedError

    def get_workspace_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def list_clusters(self) -> list[str]:
        raise NotImplementedError
