"""The Python API: ``Cluster.up(workers=2)``, ``cluster.client()``, ``cluster.down()``.

A ``Cluster`` is a name plus a backend; everything it shows comes from the store (through
the backend), so an object made in one kernel describes the same cluster another kernel or
the CLI started, and survives kernel restarts.
"""

from __future__ import annotations

import html
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..core.config import provider_class, read_config_file, with_worker_size
from ..core.errors import CloudTikError, ConflictError, NotFoundError
from ..core.models import ClusterInfo
from ..core.operations import started_info
from ..core.units import format_bytes
from ..progress import follow, make_view
from ..runtime.base import runtime_class, types_of, with_runtime
from .client import Backend, get_backend


class Cluster:
    """A cluster recorded in the state store."""

    def __init__(self, name: str, backend: Backend | None = None,
                 info: ClusterInfo | None = None) -> None:
        self.name = name
        self.backend = backend or get_backend()
        self._info = info

    # constructors -------------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        config: str | os.PathLike[str] | dict[str, Any] | None = None,
        *,
        name: str | None = None,
        workers: int | None = None,
        provider: str | None = None,
        runtime: str | list[str] | None = None,
        sync_env: bool = False,
        cores: int | None = None,
        memory: str | None = None,
        wait: bool = True,
        progress: str | bool = "auto",
        backend: Backend | None = None,
    ) -> Cluster:
        """Start (or reconcile) a cluster and return it once its workers have joined.

        ``config`` is a YAML file or a dict (see the README's config reference); with none,
        the provider's defaults apply.  ``runtime`` ("dask", "spark", "dask,spark") sets
        ``runtime.types``: what the nodes run; ``sync_env`` replicates every package installed
        here on the nodes (``runtime.sync_env``); ``cores`` and ``memory`` ("2GiB") size each
        worker (the worker node type's ``resources``, over the provider's default node types
        when the config has none).  Calling ``up`` again with the same config repairs
        the cluster (restarts dead workers) at the size the last ``scale`` set, or with
        ``workers`` given at that size; a different config for the same name is refused.
        """
        backend = backend or get_backend()
        if config is not None and not isinstance(config, dict):
            config = read_config_file(Path(config))
        config = with_runtime(config, runtime, sync_env=sync_env)
        config = sized_config(backend, config, provider, cores, memory)
        op_id = backend.start_up(config, name=name, workers=workers, provider=provider)
        started = started_info(backend, op_id)
        cluster_name = started.resource.name
        show_warnings(started)
        if wait:
            follow(backend, op_id, make_view(f"cluster {cluster_name}: up", progress))
        return cls(cluster_name, backend)

    @classmethod
    def get(cls, name: str, backend: Backend | None = None) -> Cluster:
        backend = backend or get_backend()
        return cls(name, backend, backend.get(name))

    @classmethod
    def list(cls, include_stopped: bool = False,
             backend: Backend | None = None) -> ClusterList:
        backend = backend or get_backend()
        return ClusterList(
            [cls(i.name, backend, i) for i in backend.list(include_stopped=include_stopped)])

    # state -------------------------------------------------------------------------------
    def refresh(self) -> ClusterInfo:
        """Ask the provider and the scheduler what is really running now."""
        self._info = self.backend.status(self.name)
        return self._info

    @property
    def info(self) -> ClusterInfo:
        if self._info is None:
            self._info = self.backend.get(self.name)
        return self._info

    @property
    def status(self) -> str:
        """The cluster's state, observed now: running, degraded, starting, stopped, ..."""
        return self.refresh().state

    @property
    def dashboard_link(self) -> str | None:
        return self.info.dashboard_link or self.refresh().dashboard_link

    @property
    def scheduler_address(self) -> str | None:
        return self.info.scheduler_address

    # actions -------------------------------------------------------------------------------
    @property
    def runtimes(self) -> list[str]:
        """What the nodes run (``runtime.types``): ["dask"], ["spark"], ["dask", "spark"]."""
        return types_of(self.info.config)

    def client(self, **kwargs: Any) -> Any:
        """The runtime's client: a ``distributed.Client`` for Dask clusters, a
        ``SparkSession`` for Spark-only ones (``spark()``)."""
        if self.runtimes == ["spark"]:
            return self.spark(**kwargs)
        if "dask" not in self.runtimes and len(self.runtimes) == 1:
            return self._runtime_client(self.runtimes[0], **kwargs)

        provider_type, info = self.backend.connect_info(self.name)
        return provider_class(provider_type).make_client(info, **kwargs)

    def spark(self, **conf: Any) -> Any:
        """A ``pyspark.sql.SparkSession`` on this cluster's Spark master (Spark properties
        as keyword arguments: ``c.spark(**{"spark.executor.memory": "2g"})``)."""
        if "spark" not in self.runtimes:
            raise ConflictError(
                f"cluster '{self.name}' runs {', '.join(self.runtimes)}, not Spark; start "
                "one with runtime 'spark' (`%cluster up --runtime spark`)", field="runtime")
        return self._runtime_client("spark", app_name=f"cloudtik-{self.name}", **conf)

    def storage_path(self, name: str) -> str:
        """The local path at which a Spark cluster's nodes mount storage ``name`` of its
        config (``storage: {remotes: [name]}``): what a Spark job reads,
        ``c.spark().read.text(c.storage_path("data") + "/words.txt")``."""
        connect = self.info.connect_info or self.refresh().connect_info
        facts = ((connect or {}).get("extra") or {}).get("spark") or {}
        paths = facts.get("storage") or {}
        if name not in paths:
            raise NotFoundError(
                f"cluster '{self.name}' mounts no storage '{name}' for Spark (mounted: "
                f"{', '.join(sorted(paths)) or 'none'}); name it in the config's "
                "storage.remotes", field="name", value=name)
        return paths[name]

    def _runtime_client(self, name: str, **kwargs: Any) -> Any:
        _provider_type, info = self.backend.connect_info(self.name)
        return runtime_class(name)().client(info, **kwargs)

    def scale(self, workers: int, node_type: str | None = None, *, wait: bool = True,
              progress: str | bool = "auto") -> Cluster:
        op_id = self.backend.start_scale(self.name, workers, node_type)
        show_warnings(started_info(self.backend, op_id))
        if wait:
            follow(self.backend, op_id, make_view(f"cluster {self.name}: scale", progress))
        self._info = None
        return self

    def adapt(self, minimum: int = 0, maximum: int | None = None, *,
              interval: float | None = None, wait_count: int | None = None,
              off: bool = False) -> dict[str, Any] | None:
        """Scale with the load between ``minimum`` and ``maximum`` workers.

        The Jupyter server runs it (not this kernel), following the scheduler's own
        adaptive target; ``off=True`` stops it and keeps the current size."""
        if off:
            self.backend.adapt_off(self.name)
            return None
        if maximum is None:
            maximum = minimum
        return self.backend.adapt(self.name, minimum, maximum, interval, wait_count)

    def down(self, *, wait: bool = True, progress: str | bool = "auto") -> None:
        self._end_sessions()
        op_id = self.backend.start_down(self.name)
        if wait:
            follow(self.backend, op_id, make_view(f"cluster {self.name}: down", progress))
        self._info = None

    def logs(self, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        return self.backend.logs(self.name, node_id, tail)

    def _end_sessions(self) -> None:
        """This process's clients of the cluster end before it does: a live SparkSession's
        driver and a Dask client would otherwise print lost-executor and lost-connection
        errors into the notebook while the nodes go.  A client that cannot be ended is
        left to its own errors: the down itself goes on and reports."""
        import logging

        log = logging.getLogger(__name__)
        try:
            info = self.info
        except Exception:  # no cluster to look at: the down says why
            return
        extra = (info.connect_info or {}).get("extra") or {}
        master = (extra.get("spark") or {}).get("master_url")
        if master and "pyspark" in sys.modules:
            try:
                from pyspark.sql import SparkSession

                active = SparkSession.getActiveSession()
                if active is not None and active.sparkContext.master == master:
                    active.stop()
            except Exception as e:
                log.info("cluster %s: the Spark session was not stopped first: %s",
                         self.name, e)
        address = info.scheduler_address
        if address and "distributed" in sys.modules:
            try:  # a private table of distributed's: if it goes, the down still goes on
                from distributed.client import _global_clients
            except ImportError:
                return
            for client in list(_global_clients.values()):
                try:
                    if client.scheduler is not None and client.scheduler.address == address:
                        client.close()
                except Exception as e:
                    log.info("cluster %s: a Dask client was not closed first: %s",
                             self.name, e)

    def widget(self):
        """An interactive view: status table, scale, shut down, dashboard link."""
        # deferred: start-up (clusters.widgets ~81 ms, loads ipywidgets, IPython)
        from .widgets import ClusterWidget

        return ClusterWidget(self)

    # display -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        i = self.info
        return {
            "name": i.name,
            "provider": i.provider,
            "state": i.state,
            "nodes": len(i.nodes),
            "workers": f"{i.running_workers}/{i.wanted_workers}",
            "cores": i.cores,
            "memory": format_bytes(i.memory),
            "runtime": ",".join(self.runtimes),
            "dashboard": i.dashboard_link,
            "age": _age(i.age_seconds),
            "cost/h": _cost(i),
        }

    def usage(self) -> dict[str, Any] | None:
        """Cost so far, cost per hour and the size/price samples of this cluster's life
        (None where nothing records them)."""
        fn = getattr(self.backend, "usage", None)
        try:
            return fn(self.name) if fn is not None else None
        except CloudTikError:
            return None

    def _repr_html_(self) -> str:
        row = self.summary()
        # cost so far is one more request: only for clusters whose nodes have a price
        u = self.usage() if self.info.cost_per_hour else None
        if u is not None and u.get("cost_per_hour") is not None:
            unit = f" {u['currency']}" if u.get("currency") else ""
            row["cost so far"] = f"{u['cost_so_far']:.3f}{unit}"
        return _html_table([row], reason=self.info.reason)

    def __repr__(self) -> str:
        try:
            s = self.summary()
        except Exception:
            return f"<Cluster {self.name!r}>"
        return (f"<Cluster {s['name']!r} {s['state']} provider={s['provider']} "
                f"workers={s['workers']} cores={s['cores']} memory={s['memory']}>")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down(progress=False)


class ClusterList(list):
    """A list of clusters that shows itself as a table."""

    def _repr_html_(self) -> str:
        if not self:
            return "<p>No clusters. Start one with <code>%cluster up</code>.</p>"
        return _html_table([c.summary() for c in self])

    def __repr__(self) -> str:
        if not self:
            return "No clusters."
        rows = [c.summary() for c in self]
        cols = ["name", "provider", "state", "workers", "cores", "memory", "age", "dashboard"]
        widths = {c: max(len(c), *(len(str(r[c] or "-")) for r in rows)) for c in cols}
        lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
        lines += ["  ".join(str(r[c] or "-").ljust(widths[c]) for c in cols) for r in rows]
        return "\n".join(lines)


def show_warnings(op, stream=None) -> None:
    """An operation allowed although it may not go as hoped (a cluster oversubscribing
    this machine) says so, loudly: ``WARNING: ...`` lines on stderr, in a notebook too
    (the magics), besides the operation's ``warning`` event."""
    for text in op.warnings:
        print(f"WARNING: {op.resource.kind} '{op.resource.name}': {text}",
              file=stream or sys.stderr, flush=True)


def _cost(info) -> str | None:
    """Estimated cost per hour of the nodes that exist (from placement), e.g. '1.250 EUR'."""
    p = info.placement
    if not p or p.get("cost_per_hour") is None:
        return None
    unit = f" {p['currency']}" if p.get("currency") else ""
    return f"{p['cost_per_hour']:.3f}{unit}"


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


_STATE_COLORS = {"running": "#2e7d32", "degraded": "#ef6c00", "failed": "#c62828",
                 "stopped": "#757575", "starting": "#1565c0", "scaling": "#1565c0",
                 "stopping": "#757575"}


class ClusterStatus:
    """What ``%cluster status`` shows: the cluster's row, then a row per node (id, kind,
    type, status, address, cores, memory) as the CLI's ``status`` lists them.  Attributes
    are the cluster's (``s = %cluster status; s.scale(2)`` works as before)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def node_rows(self) -> list[dict[str, Any]]:
        return [{"node": n.node_id, "kind": n.kind, "type": n.node_type, "status": n.status,
                 "address": n.internal_ip or "-",
                 "cores": n.resources.get("CPU", "-"),
                 "memory": format_bytes(n.resources["memory"])
                 if n.resources.get("memory") else "-"}
                for n in self.cluster.info.nodes]

    def _repr_html_(self) -> str:
        rows = self.node_rows()
        if not rows:
            return self.cluster._repr_html_()
        cols = list(rows[0])
        head = "".join(f"<th style='text-align:left'>{c}</th>" for c in cols)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(r[c]))}</td>"
                             for c in cols) + "</tr>" for r in rows)
        return (self.cluster._repr_html_() +
                f"<table class='cloudtik-nodes'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")

    def __repr__(self) -> str:
        lines = [repr(self.cluster)]
        for r in self.node_rows():
            lines.append(f"  {r['node']:34} {r['kind']:7} {r['type']:10} {r['status']:9} "
                         f"{r['address']:15} cores={r['cores']} memory={r['memory']}")
        return "\n".join(lines)


def _html_table(rows: list[dict[str, Any]], reason: str | None = None) -> str:
    cols = ["name", "provider", "state", "nodes", "workers", "cores", "memory", "cost/h",
            "dashboard", "age"]
    head = "".join(f"<th style='text-align:left'>{c}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "dashboard" and v:
                cell = (f"<a href='{html.escape(v)}' target='_blank' rel='noopener'>"
                        f"{html.escape(v)}</a>")
            elif c == "state":
                color = _STATE_COLORS.get(str(v), "#333")
                cell = f"<span style='color:{color};font-weight:bold'>{html.escape(str(v))}</span>"
            else:
                cell = html.escape(str(v if v is not None else "-"))
            cells.append(f"<td style='text-align:left'>{cell}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f"<p><small>{html.escape(reason)}</small></p>" if reason else ""
    return (f"<table class='cloudtik-clusters'><thead><tr>{head}</tr></thead><tbody>"
            f"{''.join(body)}</tbody></table>{note}")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout``; a helper for notebooks and tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def sized_config(backend: Backend, config: dict[str, Any] | None, provider: str | None,
                 cores: int | None, memory: str | None) -> dict[str, Any] | None:
    """``config`` with the worker size of ``--cores`` / ``--memory`` (see
    ``core.config.with_worker_size``), over the chosen provider's default node types as
    the server lists them (``GET providers``: the same defaults the panel's form uses)."""
    if cores is None and memory is None:
        return config
    ptype = provider or ((config or {}).get("provider") or {}).get("type")
    listed = backend.providers()
    entry = next((p for p in listed if (p.get("name") == ptype if ptype else p.get("default"))),
                 None)
    if entry is None and not (config or {}).get("available_node_types"):
        return config  # an unknown provider: `up` refuses it, naming the installed ones
    return with_worker_size(config, (entry or {}).get("default_node_types") or {},
                            cores=cores, memory=memory)
