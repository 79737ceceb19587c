"""``jupyter cloudtik ...`` (also ``python -m jupyter_cloudtik``).

Exit codes: 0 success; 1 the operation failed (provider error, timeout, cancelled);
2 bad usage, bad config, unknown name, conflict or not enough capacity (nothing changed);
130 interrupted (the operation was cancelled).
"""

from __future__ import annotations

import json
import os
import sys

from ._version import __version__
from .clusters.commands import add_cluster_commands
from .core.arguments import Parser, UsageProblem
from .core.errors import (
    USER_ERRORS,
    CloudTikError,
    OperationCancelled,
)


def _feature_modules():
    """Features add their own sub-commands (``jupyter_cloudtik.features`` entry points): a
    module with COMMANDS (a set of top-level command names), add_commands(subparsers) and
    run(args) -> exit code."""
    # deferred: start-up (`import jupyter_cloudtik.cli` light: core.features ~35 ms)
    from .core.features import cli_modules

    return cli_modules()


def build_parser() -> Parser:
    parser = Parser(prog="jupyter cloudtik",
                    description="Clusters from the command line; the same clusters the "
                                "%cluster magics and the JupyterLab panel show.")

    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    add_cluster_commands(sub, cli=True)
    p = sub.add_parser("cancel", help="cancel a running operation")
    p.add_argument("op_id")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("operations", help="recent operations and their state")
    p.add_argument("--cluster", help="only this cluster")
    p.add_argument("--json", action="store_true")
    for module in _feature_modules():
        module.add_commands(sub)
    return parser


def run(argv: list[str]) -> int:
    # deferred: start-up (`import jupyter_cloudtik.cli` light: clusters.cli ~4 ms, +25%)
    from .clusters import cli as clusters_cli

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageProblem as e:
        print(str(e), file=sys.stderr)
        return 2
    for module in _feature_modules():
        if args.command in module.COMMANDS:
            return module.run(args)
    return clusters_cli.run(args)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    json_out = "--json" in argv
    try:
        code = run(argv)
    except OperationCancelled as e:
        _report(e, json_out)
        code = 130 if "interrupted" in e.message else 1
    except USER_ERRORS as e:
        _report(e, json_out)
        code = 2
    except CloudTikError as e:
        _report(e, json_out)
        code = 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        code = _pipe_closed()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _pipe_closed()
    sys.exit(code)


def _pipe_closed() -> int:
    """The reader of stdout went away (``... | head``): no traceback, and the exit code a
    program killed by SIGPIPE has (141).  What was left to print goes nowhere, also at the
    interpreter's own last flush."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _report(e: CloudTikError, json_out: bool) -> None:
    if json_out:
        print(json.dumps({"error": e.to_dict()}, indent=2))
    print(f"error: {e.message}", file=sys.stderr)


if __name__ == "__main__":
    main()
