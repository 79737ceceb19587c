"""ClusterManager: up, down, scale and status of clusters, as recorded operations.

Operations are reconcilers.  ``up`` writes the desired state first (the cluster row, its
target worker counts), then compares it with what the provider reports (nodes found by
tags) and closes the gap: it starts a missing head, replaces dead or stale workers, adds
missing ones with one ``create_node(count=N)`` per chosen offer, and waits until they have
joined the scheduler.  Running ``up`` again after a crash, a kill or a cancel therefore
finishes the job, and ``down`` finds every node by its tags, so nothing started is ever
forgotten.  Every missing node is placed first, all at once, and held as claims under a
reservation id (``jupyter_cloudtik.placement``), before anything is recorded.

The manager is asynchronous; provider calls (blocking SDKs, process management) run in
worker threads.  Faces use it through ``jupyter_cloudtik.clusters.client`` and never re-implement
any of it.

``ClusterManager`` is assembled from one part per job of its own: ``cluster_operations``
(starting up, down and scale as operations), ``cluster_reconcile`` (the work of up and
scale), ``cluster_teardown`` (the work of down), ``cluster_observe`` (status),
``cluster_capacity`` (room and oversubscription, checked before anything starts),
``cluster_placing`` (the hand-off to placement), ``cluster_node_config`` (what a node is
given to run), ``cluster_view`` (the recorded view, links and connect info) and
``cluster_records`` (the cluster's rows and a freed name's history).
"""

from __future__ import annotations

import logging
from typing import Any

from ..core import config as cfgmod
from ..core import plugins
from ..core.identity import ActsForUser, os_user
from ..core.operations import Operations
from ..core.runner import OperationRunner
from ..core.settings import CloudTik, default_settings
from ..core.store import Store
from ..providers.base import NodeProvider, ProviderContext
from . import table
from .cluster_capacity import ClusterCapacity
from .cluster_node_config import ClusterNodeConfig
from .cluster_observe import ClusterObserver
from .cluster_operations import ClusterOperations
from .cluster_placing import ClusterPlacing
from .cluster_reconcile import ClusterReconciler
from .cluster_records import ClusterRecords
from .cluster_teardown import ClusterTeardown
from .cluster_view import ClusterView
from .placing import ClusterPlacement

log = logging.getLogger("jupyter_cloudtik")


class ClusterManager(ClusterOperations, ClusterReconciler, ClusterTeardown,
                     ClusterObserver, ClusterCapacity, ClusterPlacing, ClusterNodeConfig,
                     ClusterView, ClusterRecords, ActsForUser):
    """Creates, changes, observes and removes clusters; one per process is typical."""

    #: set by a server that serves dashboards (``{base_url}cloudtik/dashboard/``): the
    #: ``dashboard_link`` of every cluster is then that URL, not the cluster's own port
    dashboard_prefix: str | None = None
    #: likewise for Spark's UI (``{base_url}cloudtik/spark/``): ``spark_ui_link``
    spark_ui_prefix: str | None = None

    def __init__(self, settings: CloudTik | None = None, store: Store | None = None,
                 user: str | None = None) -> None:
        self.settings = settings or default_settings()
        self.store = table.ensure(store or Store(self.settings.state_dir))
        self.ops = Operations(self.store)
        self.user = user or os_user()
        self.runner = OperationRunner(
            self.ops, timeout=lambda: self.settings.operation_timeout,
            on_failed=self._on_failed, on_cancelled=self._on_cancelled,
            what="cluster operation")
        self.context = ProviderContext(
            state_dir=self.store.state_dir, store=self.store, settings=self.settings, log=log
        )
        # every node is placed (filters, weighers, claims) before it is created
        self.placement = ClusterPlacement(self.store, self.settings)

    # providers --------------------------------------------------------------------------
    def provider_for(self, cfg: dict[str, Any]) -> NodeProvider:
        cls = cfgmod.provider_class(cfg["provider"]["type"], self.settings)
        return cls(cfg["provider"], cfg["cluster_name"], self.context)

    def providers(self) -> list[dict[str, Any]]:
        """Installed providers with the JSON Schemas UIs build their forms from.

        A provider that is not allowed here (``c.CloudTik.allowed_providers``) or cannot be
        imported is listed with ``available: false`` and the reason, so a UI can say why.
        """
        out: list[dict[str, Any]] = []
        for name in plugins.installed(plugins.PROVIDERS):
            try:
                cls = cfgmod.provider_class(name, self.settings)
            except Exception as e:  # not allowed here, or a broken plugin: say which
                out.append({"name": name, "available": False, "default": False,
                            "reason": getattr(e, "message", None) or str(e)})
                continue
            out.append({
                "name": name,
                "available": True,
                "default": name == self.settings.default_provider,
                "title": cls.config_schema.get("title") or name,
                "description": cls.config_schema.get("description") or "",
                "config_schema": cls.config_schema,
                "node_config_schema": cls.node_config_schema,
                "default_node_types": cls.default_node_types({"type": name}),
            })
        return out

