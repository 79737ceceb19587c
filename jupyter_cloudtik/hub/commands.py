"""The ``sidekick`` commands, shared by ``%sidekick`` and ``jupyter cloudtik sidekick``."""

from __future__ import annotations

from typing import Any

from ..commands import Parser


def sidekick_parser(prog: str) -> Parser:
    p = Parser(prog=prog, description="side-kick services of the JupyterHub cloudtik "
                                      "sidekick: admin-defined services you may start")
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    sub.required = True
    sub.add_parser("list", help="the side-kicks you may start, and the state of yours")
    for action, text in (("start", "start it (waits until it is healthy)"),
                         ("stop", "stop it"), ("status", "its state, restarts, health"),
                         ("logs", "the last lines of its log")):
        q = sub.add_parser(action, help=text)
        q.add_argument("name")
        if action == "logs":
            q.add_argument("--tail", type=int, default=100)
    return p


def run_sidekick(client: Any, args: Any) -> tuple[str, Any]:
    """(text for people, value for code) of one sub-command."""
    if args.action == "list":
        items = client.sidekicks()
        if not items:
            return "no side-kicks are offered to you", items
        rows = [f"{'NAME':<20} {'STATE':<11} URL"]
        for s in items:
            inst = s.get("instance") or {}
            rows.append(f"{s['name']:<20} {s['state']:<11} {inst.get('url') or '-'}"
                        + (f"  {s['description']}" if s.get("description") else ""))
        return "\n".join(rows), items
    if args.action == "start":
        info = client.start_sidekick(args.name)
        return f"side-kick {args.name} is {info['state']} at {info['url']}", info
    if args.action == "stop":
        info = client.stop_sidekick(args.name)
        return f"side-kick {args.name} is {info['state']}", info
    if args.action == "status":
        info = client.sidekick(args.name)
        health = info.get("last_health") or {}
        return (f"{args.name}: {info['state']}, restarts {info['restarts']}, last health "
                f"{'ok' if health.get('ok') else health.get('detail') or '-'}"
                + (f" ({info['reason']})" if info.get("reason") else "")), info
    text = client.sidekick_logs(args.name, args.tail)
    return text, text
