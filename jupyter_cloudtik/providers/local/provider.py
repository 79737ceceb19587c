"""The embedded ``local`` provider: a node is a group of processes on this machine.

The head node runs ``dask scheduler`` (with its dashboard), each worker node one
``dask worker`` limited to its declared threads and memory.  The "cloud" this provider asks
is the ``local_nodes`` table plus the process table: a node exists while its recorded
process (pid and start time) is alive, so a node that crashed is seen as gone and ``up``
replaces it.

Nodes share this machine the way ``distributed.LocalCluster``'s workers do: by default a
worker gets ``ceil(cores / workers)`` threads and a share of the memory such that the
workers of one cluster never declare more than the machine has (``fill_resources``).
Declared cores and memory are limits the nodes run under, not reservations: several
clusters at once may declare more than the machine in total (oversubscription).  That is
allowed, with a loud warning once the live local nodes of every cluster in the same state
folder would declare more than ``oversubscription_warning`` (2) times this machine's cores
or memory.  Refused before anything starts is only what cannot run at all: one node asking
more memory than the machine has, GPUs (there are none), or more nodes than the machine's
memory holds processes for (``NODE_MEMORY_FLOOR`` each).  An administrator who sets
``cpu_overcommit`` / ``memory_overcommit`` makes the declared totals a hard limit again
(this machine's cores / memory times the factor).

``LocalNodeProvider`` is assembled from one part per job: ``capacity`` (this machine's
shares, limits, warnings and offer), ``node_records`` (the ``local_nodes`` table and node
folders), ``node_start`` (command lines and launching), ``node_stop`` (terminating and
cleaning up) and ``head_connect`` (reaching the head); its settings are ``settings`` and
starting the launcher early is ``prewarm``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ...core.sandbox import sandbox_for
from ...runtime.tls import is_loopback
from ..base import NodeProvider, ProviderContext
from . import launcher
from .capacity import LocalCapacity
from .head_connect import LocalHeadConnect
from .node import scrub_environment
from .node_records import LOCAL_MIGRATIONS, LocalNodeRecords
from .node_start import LocalNodeStart
from .node_stop import LocalNodeStop
from .settings import LocalProvider


class LocalNodeProvider(LocalCapacity, LocalNodeRecords, LocalNodeStart, LocalNodeStop,
                        LocalHeadConnect, NodeProvider):
    provider_type = "local"
    delivers_secret_files = True  # 0600 files in the node's own folder
    #: runtime.pip / sync_env: the nodes run this very Python, nothing to install
    installs_packages = "shared"
    #: a new head's workers are forked right after it and read its scheduler file
    #: themselves (node.py: ``scheduler_address``): the first ``up`` does not wait for
    #: the scheduler to answer before it starts the workers
    workers_find_scheduler = True
    config_schema = {
        "type": "object",
        "title": "Local machine",
        "description": "Nodes are processes on the machine running Jupyter.",
        "additionalProperties": False,
        "properties": {
            "type": {"const": "local"},
            "host": {
                "type": "string",
                "title": "Listen address",
                "description": "Address the scheduler and workers bind to.",
                "default": "127.0.0.1",
            },
            "launch_method": {
                "enum": ["fork", "exec"],
                "title": "Launch method",
                "description": "fork (fast, from a preloaded launcher) or exec.",
            },
        },
    }
    node_config_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string", "x-cloudtik-names": "command"},
                "description": "Extra environment variables for the node's processes.",
            },
        },
    }

    def __init__(
        self, provider_config: dict[str, Any], cluster_name: str, context: ProviderContext
    ) -> None:
        super().__init__(provider_config, cluster_name, context)
        self.settings = LocalProvider(parent=context.settings)
        self.store = context.store
        self.store.ensure_schema("local", LOCAL_MIGRATIONS)
        self.host = provider_config.get("host") or self.settings.host
        self.launch_method = provider_config.get("launch_method") or self.settings.launch_method
        self.nodes_dir = launcher.local_dir(context.state_dir) / "nodes"
        # a state folder shared by many users (the hub sidekick) runs each node in its
        # own sandbox (core/sandbox.py): started one by one (no shared warm launcher),
        # and spoken to over TLS even on loopback, so nobody else on this machine can
        # give its workers tasks (and read what they were given)
        self.sandbox = sandbox_for(context.state_dir)
        if self.sandbox is not None:
            self.launch_method = "exec"
        # off loopback, nothing answers without the cluster's certificate (runtime.tls)
        self.tls = not is_loopback(self.host) or self.sandbox is not None

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Nodes are about to be launched (an ``up`` or a scale): the launcher, if none
        runs, starts loading Dask now, while the operation places and records them."""
        if self.launch_method == "fork" and sys.platform.startswith("linux"):
            launcher.start_soon(self.context.state_dir, self.settings.launcher_idle_seconds,
                                scrub_environment(dict(os.environ)))
        return cluster_config

    def internal_ip(self, node_id: str) -> str | None:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
