"""The ``sidekick`` commands, shared by ``%sidekick`` and ``jupyter cloudtik sidekick``:
the hub's side-kick services, and the egress rules acting on the user's sessions."""

from __future__ import annotations

from typing import Any

from ..core.arguments import Parser, UsageProblem


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
    q = sub.add_parser("egress", help="egress rules acting on your sessions (yours, "
                                      "shared with you, admins'); accept or decline a "
                                      "rule another user offered you — a hub takes that "
                                      "only from your browser (its egress page) unless "
                                      "its admin allows tokens")
    q.add_argument("what", nargs="?", choices=("list", "accept", "decline"), default="list")
    q.add_argument("rule", nargs="?", help="the rule id (accept, decline)")
    return p


def _run_egress(client: Any, args: Any) -> tuple[str, Any]:
    if args.what in ("accept", "decline"):
        if not args.rule:
            raise UsageProblem(f"egress {args.what}: say which rule (its id, as "
                               "`egress` lists it)")
        share = (client.accept_egress_share if args.what == "accept"
                 else client.decline_egress_share)(args.rule)
        return (f"egress rule {share['id']} of {share['owner']} "
                f"({share['header']} on {_where(share)}): {share['share']}"), share
    info = client.egress_applies()
    rows = [f"{'RULE':<20} {'FROM':<12} {'STATE':<10} HEADER ON"]
    for r in info["own"]:
        rows.append(f"{r['id']:<20} {'you':<12} {'applied':<10} {r['header']} on "
                    f"{_where(r)}")
    for r in info["admin"]:
        rows.append(f"{r['id']:<20} {'admin':<12} {'applied':<10} {r['header']} on "
                    f"{_where(r)}")
    for r in info["shared"]:
        rows.append(f"{r['id']:<20} {r['owner']:<12} {r['share']:<10} {r['header']} on "
                    f"{_where(r)}")
    if len(rows) == 1:
        return "no egress rule acts on your sessions", info
    return "\n".join(rows), info


def _where(rule: dict[str, Any]) -> str:
    port = f":{rule['port']}" if rule.get("port") else ""
    return f"{rule['host']}{port}{rule.get('path_prefix') or '/'}"


def run_sidekick(client: Any, args: Any) -> tuple[str, Any]:
    """(text for people, value for code) of one sub-command."""
    if args.action == "egress":
        return _run_egress(client, args)
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
