"""``jupyter cloudtik hub-service``: run the sidekick (a JupyterHub managed service)."""

from __future__ import annotations

from typing import Any

COMMANDS = {"hub-service"}


def add_commands(sub: Any) -> None:
    p = sub.add_parser("hub-service",
                       help="run the JupyterHub sidekick service (started by the hub)")
    p.add_argument("--config", help="a Python config file (c.CloudTikHub.*, c.CloudTik.*, "
                                    "c.HPC.*, c.Storage.*)")


def run(args: Any) -> int:
    from .service import main

    return main(["--config", args.config] if args.config else [])
