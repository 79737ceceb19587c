"""``%storage add|list|ls|cp|sync|mount|unmount|remove|test|backends|options``.

Transfers and mounts show a progress bar (bytes, files, rate, ETA); "interrupt kernel"
cancels them.  Errors are one-line ``UsageError``s.  Keep credentials out of the notebook:
``%storage add NAME s3://bucket --ask secret_access_key`` asks for the value without
echoing it (IPython's ``$var`` expansion also works: ``-o secret_access_key=$sk``).  In a
kernel of a Jupyter server (whose token may not add storages) the server checks the
request first, then the cell shows a form in which the user types the asked values and
presses Add, in the browser (``notebook_add``).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..core.errors import CloudTikError, OperationCancelled
from ..magic_line import parse_magic_line
from ..progress import follow, make_view
from .client import get_storage_client
from .commands import describe, run_command, storage_parser
from .notebook_add import add_in_notebook


@magics_class
class StorageMagics(Magics):
    @line_magic
    def storage(self, line: str) -> Any:
        """Storages (rclone remotes): add, browse, copy with progress, mount.

        Sub-commands::

          %storage add NAME [URL] [-b BACKEND] [-o KEY=VALUE ...] [--ask KEY]
                       [--source PATH] [--read-write] [--mount-path P]
          %storage list                   storages and their mounts
          %storage ls NAME:path           browse (--offset/--limit page through)
          %storage cp SRC DST             copy (NAME:path or local paths), with progress
          %storage sync SRC DST           make DST like SRC (deletes extra files in DST)
          %storage mount NAME [--mode sync]   FUSE mount at the storage's mount path
          %storage unmount NAME
          %storage remove NAME            unmount and forget it and its credentials
          %storage test NAME              check it answers with its credentials
          %storage backends | options BACKEND [--provider P]

        `%storage` alone lists the commands; `%storage <command> --help` gives the options
        of one.  A trailing `# comment` is ignored, as in a shell.
        """
        args = parse_magic_line("%storage", storage_parser("%storage"), line)
        if args is None:  # help was printed
            return None
        try:
            client = get_storage_client()
            kind, value = run_command(
                args, client, lambda op_id, title: follow(client, op_id, make_view(title)),
                add_by_user=_add_by_user(client))
        except OperationCancelled as e:
            print(f"cancelled: {e.message}")
            return None
        except CloudTikError as e:
            raise UsageError(e.message) from None
        if kind in ("list", "ls", "storage"):
            return value
        if kind == "shown":  # the cell's output already shows the result line
            return None
        print(describe(kind, value))
        return None


def _add_by_user(client: Any) -> Any:
    """A kernel of a Jupyter server (the REST client) adds through the user's browser."""
    if getattr(client, "kind", None) != "rest":
        return None

    return add_in_notebook
