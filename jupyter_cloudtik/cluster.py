"""The Python API: ``Cluster.up(workers=2)``, ``cluster.client()``, ``cluster.down()``.

A ``Cluster`` is a name plus a backend; everything it shows comes from the store (through
the backend), so an object made in one kernel describes the same cluster another kernel or
the CLI started, and survives kernel restarts.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.config import read_config_file
from .core.models import ClusterInfo
from .core.units import format_bytes
from .progress import follow, make_view
from .session import Backend, get_backend

if TYPE_CHECKING:
    from distributed import Client


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
        wait: bool = True,
        progress: str | bool = "auto",
        backend: Backend | None = None,
    ) -> Cluster:
        """Start (or reconcile) a cluster and return it once its workers have joined.

        ``config`` is a YAML file or a dict (see the README's config reference); with none,
        the provider's defaults apply.  Calling ``up`` again with the same config repairs
        the cluster (restarts dead workers); a different config for the same name is
        refused.
        """
        backend = backend or get_backend()
        if config is not None and not isinstance(config, dict):
            config = read_config_file(Path(config))
        op_id = backend.start_up(config, name=name, workers=workers, provider=provider)
        op = backend.operation(op_id)
        cluster_name = op.target.split(":", 1)[1]
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
    def client(self, **kwargs: Any) -> Client:
        """A ``distributed.Client`` connected to this cluster."""
        from .core.config import provider_class

        provider_type, info = self.backend.connect_info(self.name)
        return provider_class(provider_type).make_client(info, **kwargs)

    def scale(self, workers: int, node_type: str | None = None, *, wait: bool = True,
              progress: str | bool = "auto") -> Cluster:
        op_id = self.backend.start_scale(self.name, workers, node_type)
        if wait:
            follow(self.backend, op_id, make_view(f"cluster {self.name}: scale", progress))
        self._info = None
        return self

    def down(self, *, wait: bool = True, progress: str | bool = "auto") -> None:
        op_id = self.backend.start_down(self.name)
        if wait:
            follow(self.backend, op_id, make_view(f"cluster {self.name}: down", progress))
        self._info = None

    def logs(self, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        return self.backend.logs(self.name, node_id, tail)

    def widget(self):
        """An interactive view: status table, scale, shut down, dashboard link."""
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
            "dashboard": i.dashboard_link,
            "age": _age(i.age_seconds),
            "cost/h": _cost(i),
        }

    def _repr_html_(self) -> str:
        return _html_table([self.summary()], reason=self.info.reason)

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
