"""``jupyter cloudtik zone ...`` and ``jupyter cloudtik reservations ...``.

    zone add NAME URL [--offset X] [--scale Y] [--token-env VAR | --token-file F] [--replace]
    zone list | zone remove NAME | zone rotate-key | zone retire-keys [--keep N]
    reservations show ID | reservations list [--cluster C] | reservations release ID

Tokens toward child zones go to the encrypted secret store; they are read from an
environment variable or a file, never from the command line (``ps`` shows arguments).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.store import Store
from .settings import Placement

COMMANDS = {"zone", "reservations"}


def add_commands(sub) -> None:
    p = sub.add_parser("zone", help="child zones this installation places into")
    zs = p.add_subparsers(dest="zone_command", metavar="ACTION")
    zs.required = True
    a = zs.add_parser("add", help="add (or with --replace, change) a child zone")
    a.add_argument("name")
    a.add_argument("url", help="base URL of the child's server, e.g. https://zone-b.example/")
    a.add_argument("--offset", type=float, default=0.0,
                   help="added to the child's weights (default 0)")
    a.add_argument("--scale", type=float, default=1.0,
                   help="multiplies the child's weights (default 1)")
    g = a.add_mutually_exclusive_group()
    g.add_argument("--token-env", metavar="VAR",
                   help="environment variable holding the token for the child")
    g.add_argument("--token-file", metavar="FILE", help="file holding the token")
    a.add_argument("--replace", action="store_true", help="change an existing zone")
    a.add_argument("--json", action="store_true")
    r = zs.add_parser("remove", help="forget a child zone (and its token)")
    r.add_argument("name")
    r.add_argument("--json", action="store_true")
    lst = zs.add_parser("list", help="child zones and their health")
    lst.add_argument("--json", action="store_true")
    k = zs.add_parser("rotate-key", help="seal new hints with a new key (old hints still "
                                         "open until retire-keys)")
    k.add_argument("--json", action="store_true")
    k = zs.add_parser("retire-keys", help="forget old sealing keys")
    k.add_argument("--keep", type=int, default=1)
    k.add_argument("--json", action="store_true")

    p = sub.add_parser("reservations", help="placement reservations and their instances")
    rs = p.add_subparsers(dest="reservations_command", metavar="ACTION")
    rs.required = True
    s = rs.add_parser("show", help="a reservation: each instance's offer, node and price")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    s = rs.add_parser("list", help="recent reservations")
    s.add_argument("--cluster")
    s.add_argument("--json", action="store_true")
    s = rs.add_parser("release", help="give a reservation's unused claims back")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")


def _services():
    # deferred: start-up (core.settings ~5 ms, loads jupyter_core, platformdirs; placement.zones
    #   ~22 ms, loads cryptography, jupyter_core)
    from ..core.settings import default_settings
    from .zones import ZoneService

    settings = default_settings()
    store = Store(settings.state_dir)
    return ZoneService(store, settings, Placement(parent=settings))


def _emit(args, data: Any, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def _token(args) -> str | None:
    if args.token_env:
        value = os.environ.get(args.token_env)
        if not value:
            raise ConfigError(f"--token-env: ${args.token_env} is not set or empty",
                              field="token_env")
        return value.strip()
    if args.token_file:
        try:
            value = Path(args.token_file).expanduser().read_text().strip()
        except OSError as e:
            raise ConfigError(f"--token-file: cannot read {args.token_file}: "
                              f"{e.strerror}", field="token_file") from None
        if not value:
            raise ConfigError(f"--token-file: {args.token_file} is empty", field="token_file")
        return value
    return None


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = max(time.time() - ts, 0)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def run(args) -> int:
    svc = _services()
    if args.command == "zone":
        return _zone(args, svc)
    return _reservations(args, svc)


def _zone(args, svc) -> int:
    cmd = args.zone_command
    reg = svc.registry
    if cmd == "add":
        z = reg.add(args.name, args.url, args.offset, args.scale, _token(args),
                    replace=args.replace)
        _emit(args, z.to_dict(), f"zone '{z.name}' -> {z.url} (offset {z.offset:g}, scale "
                                 f"{z.scale:g}, token: {'yes' if z.has_token else 'none'})")
        return 0
    if cmd == "remove":
        reg.remove(args.name)
        _emit(args, {"removed": args.name}, f"zone '{args.name}' removed")
        return 0
    if cmd == "list":
        zones = reg.list()
        lines = [f"this zone: {svc.name}"]
        if zones:
            lines.append(f"{'ZONE':16} {'STATE':10} {'OFFSET':>7} {'SCALE':>6} {'TOKEN':6} "
                         f"{'LAST OK':10} URL")
            for z in zones:
                state = z.state
                if z.state == "unhealthy" and z.retry_at:
                    state += f" (retry in {max(z.retry_at - time.time(), 0):.0f}s)"
                lines.append(f"{z.name:16} {state:10} {z.offset:7g} {z.scale:6g} "
                             f"{'yes' if z.has_token else 'no':6} {_ago(z.last_ok):10} "
                             f"{z.url}")
                if z.last_error and z.state == "unhealthy":
                    lines.append(f"{'':16} last error: {z.last_error}")
        else:
            lines.append("no child zones; add one with `jupyter cloudtik zone add NAME URL`")
        _emit(args, {"zone": svc.name, "children": [z.to_dict() for z in zones]},
              "\n".join(lines))
        return 0
    if cmd == "rotate-key":
        n = svc.keys.rotate()
        _emit(args, {"keys": n}, f"new sealing key in use; {n} key(s) open hints "
                                 "(retire old ones with `zone retire-keys` after "
                                 f"{svc.placement.hint_ttl:.0f}s)")
        return 0
    if cmd == "retire-keys":
        n = svc.keys.retire(args.keep)
        _emit(args, {"keys": n}, f"{n} sealing key(s) kept")
        return 0
    raise AssertionError(cmd)  # pragma: no cover


def _reservations(args, svc) -> int:
    res = svc.reservations
    cmd = args.reservations_command
    if cmd == "show":
        r = res.get(args.id)
        # the nodes and their states, here and in every child zone it was booted in
        servers = asyncio.run(svc.servers(args.id, public=False))
        _emit(args, {**r.to_dict(), "servers": servers["servers"],
                     "unreachable": servers["unreachable"]},
              reservation_text(r, servers))
        return 0
    if cmd == "list":
        rs = res.list(cluster=args.cluster)
        lines = [f"{'ID':12} {'STATE':9} {'CLUSTER':16} {'INST':>4} {'PER HOUR':>9} CREATED"]
        for r in rs:
            lines.append(f"{r.id:12} {r.state:9} {r.cluster or '-':16} {r.instances:4d} "
                         f"{_price(r.price_per_hour, r.currency):>9} {_ago(r.created_at)}")
        _emit(args, [r.to_dict() for r in rs],
              "\n".join(lines) if rs else "no reservations")
        return 0
    if cmd == "release":
        # deferred: start-up (placement.zones ~22 ms, loads cryptography, jupyter_core)
        from .zones import BOOTED_SOURCES

        r = res.get(args.id)
        if r.source in BOOTED_SOURCES:  # its nodes end too, here and in the children
            asyncio.run(svc.release_booted(args.id, "released by the admin"))
            r = res.get(args.id)
        else:
            r = res.release(args.id)
        _emit(args, r.to_dict(), f"reservation {r.id}: {r.state}")
        return 0
    raise AssertionError(cmd)  # pragma: no cover


def _price(p: float, currency: str) -> str:
    return f"{p:.3f}{(' ' + currency) if currency else ''}"


def reservation_text(r, servers: dict[str, Any] | None = None) -> str:
    expires = ""
    if r.state == "active" and r.expires_at:
        expires = f", claims expire in {max(r.expires_at - time.time(), 0):.0f}s"
    lines = [f"reservation {r.id} ({r.state}{expires})",
             f"cluster     {r.cluster or '-'}   user {r.user or '-'}   source {r.source}",
             f"instances   {r.instances}   estimated {_price(r.price_per_hour, r.currency)}"
             " per hour"]
    if r.claims:
        lines.append("")
        lines.append(f"{'#':>3} {'TYPE':10} {'STATE':9} {'PROVIDER':12} {'ZONE':14} "
                     f"{'FLAVOR':14} {'PER HOUR':>9} NODE")
        for c in r.claims:
            lines.append(f"{c.index:3d} {c.node_type or '-':10} {c.state:9} "
                         f"{c.provider or '-':12} {c.availability_zone or '-':14} "
                         f"{c.flavor or '-':14} {_price(c.price_per_hour, c.currency):>9} "
                         f"{c.node_id or '-'}"
                         + (f"  ({c.reason})" if c.reason and c.state != "bound" else ""))
    for part in r.remote:
        lines.append(f"  zone {part['zone']}: {part['count']} instance(s), reservation "
                     f"{part['remote_id']} ({part['state']})")
    nodes = [s for s in (servers or {}).get("servers", []) if s.get("node_id")
             or s.get("state") == "unknown"]
    if nodes:
        lines.append("")
        lines.append(f"{'ZONE':16} {'STATE':11} NODE")
        for s in nodes:
            lines.append(f"{s['zone']:16} {s['state']:11} {s.get('node_id') or '-'}")
    for u in (servers or {}).get("unreachable", []):
        lines.append(f"  zone {u['zone']}: {u['count']} node(s) not listed ({u['reason']})")
    return "\n".join(lines)


