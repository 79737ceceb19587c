"""``jupyter cloudtik up|down|status|list|adapt|scale|logs|cancel|operations``: the
clusters' commands in a terminal (``%cluster`` runs the same parsers, ``commands.py``).

The top-level ``jupyter_cloudtik.cli`` (the console script) parses the line, hands other
features' commands to their ``cli`` modules and these to :func:`run`; its exit codes apply.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..core.units import format_bytes


def _emit(args, data: Any, text: str | None = None) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    elif text is not None:
        print(text)


def _dashboard_url(info, backend=None) -> str:
    """The dashboard as a browser opens it: a server-relative link (the server serves
    every cluster's dashboard) is joined to the origin of the server the CLI talks to."""
    link = info.dashboard_link
    if not link:
        return "-"
    url = getattr(backend, "url", None)
    if link.startswith("/") and url:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}{link}"
    served = getattr(getattr(backend, "manager", None), "dashboard_prefix", None)
    if served and link.startswith(served):  # through the server of this terminal
        return link
    return link + _reach_note(link, info)


def _reach_note(link: str, info) -> str:
    """A node's own address (no Jupyter server serves this state folder's dashboards):
    say who can open it, so nobody pastes it into a remote browser and wonders."""
    from urllib.parse import urlsplit

    parts = urlsplit(link)
    host = parts.hostname or ""
    extra = (getattr(info, "connect_info", None) or {}).get("extra") or {}
    if link == extra.get("dashboard_tls_address"):
        return ("  (the head's mutual-TLS relay: open it through a Jupyter server with "
                "jupyter_cloudtik, docs/huaweicloud.md)")
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return "  (this machine only)"
    return ""


def _usage(info, backend) -> dict | None:
    fn = getattr(backend, "usage", None)
    if fn is None:
        return None
    try:
        return fn(info.name)
    except Exception:  # the cost line is extra; the status is what was asked for
        return None


def _status_text(info, backend=None) -> str:
    lines = [
        f"cluster    {info.name}",
        f"provider   {info.provider}",
        f"state      {info.state}" + (f" ({info.reason})" if info.reason else ""),
        f"workers    {info.running_workers}/{info.wanted_workers}",
        f"cores      {info.cores}",
        f"memory     {format_bytes(info.memory)}",
        f"scheduler  {info.scheduler_address or '-'}",
        f"dashboard  {_dashboard_url(info, backend)}",
    ]
    for n in info.nodes:  # a runtime's own view (Spark's master), from the last status
        for name, view in ((n.info.get("runtime") or {}) if n.kind == "head" else {}).items():
            if "error" in view:
                lines.append(f"{name:10} unreachable: {view['error']}")
                continue
            apps = ", ".join(f"{a['name']} ({a['cores']} cores)"
                             for a in view.get("running_applications") or []) or "none"
            lines.append(f"{name:10} {view.get('status')} at {view.get('master')}: "
                         f"{view.get('alive_workers')} alive workers, "
                         f"{view.get('cores_used')}/{view.get('cores')} cores, "
                         f"{view.get('memory_used_mb')}/{view.get('memory_mb')} MiB in use; "
                         f"running applications: {apps}; UI {view.get('ui')}")
    if info.placement:
        p = info.placement
        unit = f" {p['currency']}" if p.get("currency") else ""
        lines.append(f"cost       {p['cost_per_hour']:.3f}{unit} per hour (estimated; "
                     f"reservation {p['reservation_id']})")
        u = _usage(info, backend)
        if u is not None:
            lines.append(f"cost so far {u['cost_so_far']:.3f}{unit} "
                         f"({len(u['samples'])} size/price samples)")
    if info.nodes:
        lines.append("")
        lines.append(f"{'NODE':34} {'KIND':7} {'TYPE':10} {'STATUS':9} {'IP':15} PLACEMENT")
        for n in info.nodes:
            placed = n.info.get("placement") or {}
            where = "/".join(x for x in (placed.get("provider"),
                                         placed.get("availability_zone"),
                                         placed.get("flavor")) if x)
            if placed:
                where += f" {placed.get('price_per_hour', 0):.3f}/h"
            lines.append(f"{n.node_id:34} {n.kind:7} {n.node_type:10} {n.status:9} "
                         f"{n.internal_ip or '-':15} {where or '-'}")
    return "\n".join(lines)


def run(args) -> int:
    """The cluster commands (up, down, status, list, adapt, scale, logs) and the
    operations' (cancel, operations) of ``jupyter cloudtik``, parsed by its dispatcher."""
    # deferred: start-up (progress ~46 ms, loads asyncio, psutil; clusters.api ~84 ms, loads
    #   asyncio, importlib.metadata; clusters.client ~50 ms, loads asyncio, psutil)
    from ..progress import RichProgress, TextProgress, follow
    from .api import Cluster, ClusterList
    from .client import get_backend, resolve_name

    backend = get_backend()

    def view(title: str):
        if getattr(args, "json", False) or not sys.stderr.isatty():
            return TextProgress(title, stream=sys.stderr)
        return RichProgress(title)

    cmd = args.command
    if cmd == "up":
        # deferred: start-up (core.config ~35 ms, loads importlib.metadata, yaml; core.operations
        #   ~46 ms, loads asyncio, psutil; runtime.base ~33 ms, loads urllib.request, ssl;
        #   clusters.api ~80 ms, loads asyncio, yaml)
        from ..core.config import read_config_file
        from ..core.operations import started_info
        from ..runtime.base import with_runtime
        from .api import show_warnings, sized_config

        config = read_config_file(Path(args.config)) if args.config else None
        config = with_runtime(config, getattr(args, "runtime", None),
                              sync_env=bool(getattr(args, "sync_env", False)))
        config = sized_config(backend, config, args.provider, args.cores, args.memory)
        op_id = backend.start_up(config, name=args.name, workers=args.workers,
                                 provider=args.provider)
        started = started_info(backend, op_id)
        name = started.resource.name
        show_warnings(started)
        if args.no_wait:
            _emit(args, {"operation": op_id, "cluster": name},
                  f"started operation {op_id} for cluster '{name}'")
            return 0
        follow(backend, op_id, view(f"{name}: up"))
        info = backend.get(name)
        _emit(args, info.to_dict(), _status_text(info, backend))
        return 0
    if cmd == "down":
        names = [c.name for c in backend.list()] if args.all else [
            resolve_name(backend, args.name)]
        for name in names:
            follow(backend, backend.start_down(name), view(f"{name}: down"))
        _emit(args, {"stopped": names},
              "\n".join(f"cluster '{n}' is stopped" for n in names) or "no clusters to stop")
        return 0
    if cmd == "status":
        info = backend.status(resolve_name(backend, args.name))
        _emit(args, info.to_dict(), _status_text(info, backend))
        return 0
    if cmd == "list":
        infos = backend.list(include_stopped=args.all)
        clusters = ClusterList([Cluster(i.name, backend, i) for i in infos])
        _emit(args, [i.to_dict() for i in infos], repr(clusters))
        return 0
    if cmd == "adapt":
        from IPython.core.error import UsageError

        from .magics import _adapt  # deferred: start-up (clusters.magics ~55 ms, loads IPython)

        try:
            text = _adapt(Cluster(args.name, backend), args)
        except UsageError as e:
            print(f"jupyter cloudtik: {e}", file=sys.stderr)
            return 2
        _emit(args, {"cluster": args.name, "adapt": text}, text)
        return 0
    if cmd == "scale":
        op_id = backend.start_scale(args.name, args.workers, args.node_type)
        # deferred: start-up (core.operations ~46 ms, loads asyncio, psutil; clusters.api ~82 ms,
        #   loads asyncio, importlib.metadata)
        from ..core.operations import started_info
        from .api import show_warnings

        show_warnings(started_info(backend, op_id))
        if args.no_wait:
            _emit(args, {"operation": op_id}, f"started operation {op_id}")
            return 0
        follow(backend, op_id, view(f"{args.name}: scale"))
        info = backend.get(args.name)
        _emit(args, info.to_dict(), _status_text(info, backend))
        return 0
    if cmd == "logs":
        logs = backend.logs(resolve_name(backend, args.name), args.node, args.tail)
        _emit(args, logs, "\n\n".join(f"==> {n} <==\n{t}" for n, t in logs.items()))
        return 0
    if cmd == "cancel":
        op = backend.cancel(args.op_id)
        _emit(args, op.to_dict(), f"operation {op.id}: {op.state}")
        return 0
    if cmd == "operations":
        ops = backend.operations(args.cluster)
        _emit(args, [o.to_dict() for o in ops], "\n".join(
            [f"{'ID':32}  {'STARTED':19} {'TOOK':>7} {'KIND':14} {'TARGET':24} STATE"] +
            [f"{o.id:32}  {_when(o.created_at):19} {_took(o):>7} {o.kind:14} {o.target:24} "
             f"{o.state:10} {o.reason or ''}".rstrip() for o in ops]) if ops
            else "no operations")
        return 0
    raise AssertionError(cmd)  # pragma: no cover


def _when(at: float) -> str:
    """A start time as `operations` lists it: this machine's local date and time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _took(op: Any) -> str:
    """How long an operation took (or has run so far, with a trailing '+')."""
    end = op.finished_at
    seconds = (end if end is not None else time.time()) - op.created_at
    text = f"{seconds:.1f}s" if seconds < 90 else f"{seconds / 60:.1f}m"
    return text if end is not None else text + "+"
