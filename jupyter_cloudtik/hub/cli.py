"""``jupyter cloudtik hub-service`` (run the sidekick) and ``jupyter cloudtik sidekick``
(start and stop its side-kick services from a terminal of a hub session)."""

from __future__ import annotations

from typing import Any

from ..core.arguments import UsageProblem
from ..core.errors import CloudTikError
from .commands import run_sidekick, sidekick_parser

COMMANDS = {"hub-service", "sidekick"}


def add_commands(sub: Any) -> None:
    p = sub.add_parser("hub-service",
                       help="run the JupyterHub sidekick service (started by the hub)")
    p.add_argument("--config", help="a Python config file (c.CloudTikHub.*, c.CloudTik.*, "
                                    "c.HPC.*, c.Storage.*)")


    template = sidekick_parser("jupyter cloudtik sidekick")
    p = sub.add_parser("sidekick", help="start and stop the hub's side-kick services",
                       parents=[template], add_help=False,
                       description=template.description)
    del p


def run(args: Any) -> int:
    if args.command == "sidekick":
        import sys

        # deferred: start-up (hub.client ~184 ms, loads requests, urllib3)
        from .client import HubClient

        try:
            text, _ = run_sidekick(HubClient.from_environment(), args)
        except UsageProblem as e:
            print(f"usage: {e}", file=sys.stderr)
            return 2
        except CloudTikError as e:
            print(f"error: {e.message}", file=sys.stderr)
            return 1
        print(text)
        return 0
    # deferred: start-up (hub.service ~2199 ms, loads jupyter_server, jupyter_events)
    from .service import main

    return main(["--config", args.config] if args.config else [])
