"""``jupyter cloudtik emulator huaweicloud [run|status|stop]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def default_dir() -> Path:
    from jupyter_cloudtik.core.settings import default_settings

    return Path(default_settings().state_dir) / "huaweicloud-emulator"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("run", "status", "stop"), default="run",
                   help="run (default, foreground until Ctrl-C), status, or stop")
    p.add_argument("--dir", help="emulator folder: emulator.json, credentials, server "
                   "disks (default: <state dir>/huaweicloud-emulator)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    p.add_argument("--region", default="cn-north-4", help="region name (default cn-north-4)")
    p.add_argument("--no-boot", action="store_true",
                   help="servers become ACTIVE without running their user data")
    p.add_argument("--boot-seconds", type=float, default=0.3,
                   help="how long a server stays in BUILD (default 0.3)")
    p.add_argument("--realistic", action="store_true",
                   help="servers are separate hosts: network namespaces, VPC routing, "
                        "NAT gateway egress (needs root, iproute2, iptables)")
    p.add_argument("--image", metavar="SUITE",
                   help="with --realistic: servers boot from a stock Debian root of SUITE "
                        "(e.g. bookworm; debootstrap, built once and cached)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from .control import EmulatorControl
    from .server import Emulator, Options

    root = Path(args.dir).expanduser() if args.dir else default_dir()
    if args.action in ("status", "stop"):
        try:
            ctl = EmulatorControl.from_dir(root)
            state = ctl.state()
        except (OSError, RuntimeError, ValueError) as e:
            print(f"error: no emulator answers for {root}: {e}", file=sys.stderr)
            return 1
        if args.action == "stop":
            ctl.shutdown()
            print(f"emulator at {ctl.endpoint} is stopping")
            return 0
        left = ctl.leftovers(state)
        if args.json:
            print(json.dumps({"endpoint": ctl.endpoint, "resources": left,
                              "requests": state["requests"]}, indent=2))
        else:
            print(f"emulator   {ctl.endpoint}  ({state['requests']} API requests served)")
            if not left:
                print("resources  none")
            for kind, names in left.items():
                print(f"{kind:18} {len(names):4}  {', '.join(names[:6])}"
                      + (" ..." if len(names) > 6 else ""))
        return 0
    if args.port and not 0 < args.port < 65536:
        print(f"error: --port {args.port} is not a port number", file=sys.stderr)
        return 2
    opts = Options(region=args.region, host=args.host, port=args.port,
                   boot=not args.no_boot, boot_seconds=args.boot_seconds,
                   realistic=args.realistic, image=args.image)
    emu = Emulator(root, opts)

    def announce() -> None:
        emu._started.wait()
        print(f"Huawei Cloud emulator listening on {emu.endpoint} (region {args.region})\n"
              f"  credentials for the provider: {root / 'credentials'}\n"
              f"    export HUAWEICLOUD_CREDENTIALS_FILE={root / 'credentials'}\n"
              f"  endpoint for the provider:    endpoint: {emu.endpoint}\n"
              f"  state:  jupyter cloudtik emulator huaweicloud status --dir {root}\n"
              "  Ctrl-C stops it and every emulated server.", flush=True)

    import threading

    threading.Thread(target=announce, daemon=True).start()
    emu.run()
    return 0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cloudtik_emulators.huaweicloud",
                                description="Emulated Huawei Cloud APIs for dry runs and "
                                "tests.")
    add_arguments(p)
    args = p.parse_args(argv)
    os.umask(0o077)
    sys.exit(run(args))
