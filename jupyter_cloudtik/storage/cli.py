"""``jupyter cloudtik storage ...``: the same commands as ``%storage``, for terminals.

Exit codes follow ``jupyter cloudtik``: 0 done, 2 bad input / unknown name / conflict /
not allowed, 1 the storage or rclone failed, 130 interrupted (the operation was cancelled).
"""

from __future__ import annotations

import json
import sys

from ..core.arguments import Parser
from ..core.errors import USER_ERRORS, CloudTikError, OperationCancelled, PermissionDeniedError
from ..progress import RichProgress, TextProgress, follow
from .client import get_storage_client
from .commands import add_storage_commands, as_json, describe, run_command

COMMANDS = {"storage"}


def add_commands(sub) -> None:
    p = sub.add_parser("storage", help="storages: add, browse, copy, mount (rclone)",
                       description="Storages (rclone remotes): the same ones %storage and "
                                   "the JupyterLab panel show.")
    inner = p.add_subparsers(dest="storage_command", metavar="COMMAND", parser_class=Parser)
    inner.required = True
    add_storage_commands(inner, cli=True)


def run(args) -> int:
    json_out = getattr(args, "json", False)

    def view(title: str):
        if json_out or not sys.stderr.isatty():
            return TextProgress(title, stream=sys.stderr)
        return RichProgress(title)

    try:
        client = get_storage_client()
        kind, value = run_command(args, client,
                                  lambda op_id, title: follow(client, op_id, view(title)),
                                  out=sys.stdout)
    except OperationCancelled as e:
        _report(e, json_out)
        return 130 if "interrupted" in e.message else 1
    except (*USER_ERRORS, PermissionDeniedError) as e:
        _report(e, json_out)
        return 2
    except CloudTikError as e:
        _report(e, json_out)
        return 1
    if json_out:
        print(json.dumps(as_json(kind, value), indent=2, default=str))
    else:
        print(describe(kind, value))
    return 0


def _report(e: CloudTikError, json_out: bool) -> None:
    if json_out:
        print(json.dumps({"error": e.to_dict()}, indent=2))
    print(f"error: {e.message}", file=sys.stderr)
