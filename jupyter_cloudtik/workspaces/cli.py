"""``jupyter cloudtik workspace create|delete|info|status|list`` (a feature's ``cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COMMANDS = {"workspace"}


def add_commands(sub) -> None:
    p = sub.add_parser("workspace", help="create, inspect and delete workspaces (network, "
                       "identity and storage shared by a cloud's clusters)")
    ws = p.add_subparsers(dest="workspace_command", metavar="ACTION", parser_class=type(p))
    ws.required = True

    c = ws.add_parser("create", help="create a workspace, or finish creating it")
    c.add_argument("name")
    c.add_argument("config", nargs="?", help="YAML file with a provider: section")
    c.add_argument("--provider", "-p", help="provider type (e.g. huaweicloud)")
    c.add_argument("--region", help="cloud region")
    c.add_argument("--endpoint", help="one endpoint for every service (e.g. the emulator)")
    c.add_argument("--allowed-ssh-source", action="append", metavar="CIDR",
                   help="who may reach SSH (repeatable)")
    c.add_argument("--allowed-dashboard-source", action="append", metavar="CIDR",
                   help="who may reach the Dask scheduler and dashboard (repeatable)")
    c.add_argument("--peer-vpc-id", help="VPC to peer with (same region)")
    c.add_argument("--no-storage", action="store_true", help="no managed bucket")
    c.add_argument("--no-wait", action="store_true")
    c.add_argument("--json", action="store_true")

    d = ws.add_parser("delete", help="delete a workspace and everything it made")
    d.add_argument("name")
    d.add_argument("--keep-storage", action="store_true", help="keep the managed bucket")
    d.add_argument("--no-wait", action="store_true")
    d.add_argument("--json", action="store_true")

    for action, help_ in (("info", "what is recorded about a workspace"),
                          ("status", "ask the cloud which resources exist")):
        q = ws.add_parser(action, help=help_)
        q.add_argument("name")
        q.add_argument("--json", action="store_true")
    q = ws.add_parser("list", help="list workspaces")
    q.add_argument("--json", action="store_true")


def _config(args: argparse.Namespace) -> dict[str, Any]:
    # deferred: start-up (core.config ~39 ms, loads importlib.metadata, yaml)
    from ..core.config import read_config_file

    cfg = read_config_file(args.config) if args.config else {}
    prov = cfg.setdefault("provider", {})
    for key, value in (("region", args.region), ("endpoint", args.endpoint),
                       ("allowed_ssh_sources", args.allowed_ssh_source),
                       ("allowed_dashboard_sources", args.allowed_dashboard_source),
                       ("peer_vpc_id", args.peer_vpc_id)):
        if value:
            prov[key] = value
    if args.no_storage:
        prov["managed_storage"] = False
    return cfg


def _info_text(info) -> str:
    lines = [f"workspace  {info.name}", f"provider   {info.provider}",
             f"state      {info.state}" + (f" ({info.reason})" if info.reason else ""),
             f"clusters   {', '.join(info.clusters) or '-'}"]
    for k, v in sorted(info.resources.items()):
        lines.append(f"  {k:22} {v}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # deferred: start-up (progress ~50 ms, loads asyncio, psutil; workspaces.api ~97 ms, loads
    #   asyncio, yaml)
    from ..progress import TextProgress, follow
    from .api import workspace_backend

    backend = workspace_backend()
    out_json = getattr(args, "json", False)

    def emit(data: Any, text: str) -> None:
        print(json.dumps(data, indent=2, default=str) if out_json else text)

    cmd = args.workspace_command
    if cmd == "create":
        op_id = backend.start_workspace_create(args.name, _config(args), args.provider)
        if args.no_wait:
            emit({"operation": op_id}, f"started operation {op_id}")
            return 0
        follow(backend, op_id, TextProgress(f"workspace {args.name}: create", sys.stderr))
        info = backend.workspace_get(args.name)
        emit(info.to_dict(), _info_text(info))
        return 0
    if cmd == "delete":
        op_id = backend.start_workspace_delete(args.name, not args.keep_storage)
        if args.no_wait:
            emit({"operation": op_id}, f"started operation {op_id}")
            return 0
        follow(backend, op_id, TextProgress(f"workspace {args.name}: delete", sys.stderr))
        emit({"deleted": args.name}, f"workspace '{args.name}' is deleted")
        return 0
    if cmd == "info":
        info = backend.workspace_get(args.name)
        emit(info.to_dict(), _info_text(info))
        return 0
    if cmd == "status":
        st = backend.workspace_status(args.name)
        text = [f"workspace  {st['name']} ({st['state']}): "
                + ("healthy" if st["healthy"] else "NOT healthy")]
        text += [f"  {k:22} {v}" for k, v in st["integrity"].items()]
        text.append(f"clusters   {', '.join(st['clusters']) or '-'}")
        emit(st, "\n".join(text))
        return 0 if st["healthy"] else 1
    if cmd == "list":
        infos = backend.workspace_list()
        emit([i.to_dict() for i in infos], "\n".join(
            f"{i.name:24} {i.provider:12} {i.state}" for i in infos) or "no workspaces")
        return 0
    raise AssertionError(cmd)
