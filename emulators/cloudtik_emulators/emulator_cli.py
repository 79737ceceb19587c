"""``jupyter cloudtik emulator huaweicloud [run|status|stop]`` (a feature's ``cli``)."""

from __future__ import annotations

import argparse

COMMANDS = {"emulator"}


def add_commands(sub) -> None:
    p = sub.add_parser("emulator", help="run an emulated cloud API for dry runs and tests")
    em = p.add_subparsers(dest="emulator", metavar="CLOUD", parser_class=type(p))
    em.required = True
    from .huaweicloud.cli import add_arguments

    add_arguments(em.add_parser("huaweicloud", help="the Huawei Cloud APIs the huaweicloud "
                                "provider uses (ECS, VPC, EIP, NAT, IAM, IMS, KPS, OBS)"))


def run(args: argparse.Namespace) -> int:
    from .huaweicloud.cli import run as run_huaweicloud

    return run_huaweicloud(args)
