"""The cluster sub-commands, defined once for ``%cluster`` and ``jupyter cloudtik``."""

from __future__ import annotations

import argparse

from ..core.arguments import Parser


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use 0 or more")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 cores: use 1 or more")
    return value


def add_cluster_commands(sub, cli: bool) -> None:
    """Add up/down/status/list/scale/logs (and client for magics) to a subparsers object."""

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if cli:
            p.add_argument("--json", action="store_true", help="print JSON instead of tables")
        return p

    p = add("up", "start a cluster, or repair an existing one to match its config")
    p.add_argument("config", nargs="?", help="YAML cluster config file (optional)")
    p.add_argument("--name", "-n", help="cluster name (default: 'default' or the config's)")
    p.add_argument("--workers", "-w", type=_non_negative_int, help="number of workers")
    p.add_argument("--provider", "-p", help="provider type (default: local)")
    p.add_argument("--cores", type=_positive_int,
                   help="cores of each worker (the worker node type's resources.CPU)")
    p.add_argument("--memory",
                   help="memory of each worker, e.g. 2GiB (resources.memory)")
    p.add_argument("--runtime", "-r",
                   help="what the nodes run: dask (default), spark, or dask,spark")
    p.add_argument("--sync-env", action="store_true",
                   help="replicate every package installed here on the nodes, at the "
                        "exact versions (runtime.sync_env)")
    p.add_argument("--no-wait", action="store_true",
                   help="return once the operation has started")

    p = add("down", "stop a cluster and all of its nodes")
    p.add_argument("name", nargs="?", help="cluster name (default: the only cluster)")
    p.add_argument("--all", action="store_true", help="stop every cluster")

    p = add("status", "show a cluster's live state and nodes")
    p.add_argument("name", nargs="?", help="cluster name (default: the only cluster)")

    p = add("list", "list clusters")
    p.add_argument("--all", action="store_true", help="include stopped clusters")

    p = add("scale", "change the number of workers")
    p.add_argument("name", help="cluster name")
    p.add_argument("workers", type=_non_negative_int, help="number of workers wanted")
    p.add_argument("--node-type", "-t", help="worker node type (if the cluster has several)")
    p.add_argument("--no-wait", action="store_true",
                   help="return once the operation has started")

    p = add("adapt", "scale with the scheduler's load between --min and --max workers "
                     "(run by the Jupyter server, or with no server by the reaper daemon: "
                     "it goes on when the kernel or this command is gone)")
    p.add_argument("name", help="cluster name")
    p.add_argument("--min", dest="minimum", type=_non_negative_int, help="fewest workers")
    p.add_argument("--max", dest="maximum", type=_non_negative_int, help="most workers")
    p.add_argument("--interval", type=float, help="seconds between decisions (default 1)")
    p.add_argument("--wait-count", type=int,
                   help="lower targets in a row before scaling down (default 3)")
    p.add_argument("--off", action="store_true", help="stop adaptive scaling")

    p = add("logs", "show the logs of a cluster's nodes")
    p.add_argument("name", nargs="?", help="cluster name (default: the only cluster)")
    p.add_argument("--node", help="only this node")
    p.add_argument("--tail", type=_non_negative_int, default=50,
                   help="lines per node (0: all; default 50)")

    if not cli:
        p = add("client", "return a distributed.Client connected to the cluster")
        p.add_argument("name", nargs="?", help="cluster name (default: the only cluster)")


def cluster_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, add_help=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    add_cluster_commands(sub, cli=False)
    return parser
