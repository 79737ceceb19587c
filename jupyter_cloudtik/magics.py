"""IPython magics: ``%cluster up|down|status|list|scale|client|logs``.

Load with ``%load_ext jupyter_cloudtik``.  Errors are shown as ``UsageError`` (one line, no
traceback); state is never changed by a command that fails its checks.
"""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from .commands import UsageProblem, cluster_parser
from .core.errors import CloudTikError, OperationCancelled


def _parser():
    return cluster_parser("%cluster")


def _help() -> str:
    return _parser().format_help()


@magics_class
class CloudTikMagics(Magics):
    @line_magic
    def cluster(self, line: str) -> Any:
        """Manage compute clusters from the notebook.

        Sub-commands::

          %cluster up [CONFIG] [--name N] [--workers N] [--provider P] [--no-wait]
              Start a cluster (or repair it to match its config) and return it;
              `c = %cluster up --workers 2` keeps the Cluster object.
          %cluster down [NAME | --all]      stop a cluster and every node of it
          %cluster status [NAME]            live state, nodes, dashboard link
          %cluster list [--all]             all clusters (--all: stopped ones too)
          %cluster scale NAME N [--node-type T]   change the number of workers
          %cluster client [NAME]            a distributed.Client connected to it
          %cluster logs [NAME] [--node ID] [--tail N]   node logs

        NAME may be left out when exactly one cluster exists.  Ctrl-C / "interrupt
        kernel" during up, scale or down cancels the operation; running `up` again
        finishes it.  Run `%cluster <command> --help` for the options of a command.
        """
        from .cluster import Cluster
        from .session import get_backend, resolve_name

        try:
            args = _parser().parse_args(shlex.split(line))
        except UsageProblem as e:
            raise UsageError(str(e)) from None
        except ValueError as e:  # unbalanced quotes
            raise UsageError(f"%cluster: {e}") from None
        except SystemExit:  # --help printed its text
            return None
        try:
            backend = get_backend()
            cmd = args.command
            if cmd == "up":
                c = Cluster.up(args.config, name=args.name, workers=args.workers,
                               provider=args.provider, wait=not args.no_wait,
                               backend=backend)
                return c
            if cmd == "down":
                names = [c.name for c in backend.list()] if args.all else [
                    resolve_name(backend, args.name)]
                for name in names:
                    Cluster(name, backend).down()
                    print(f"cluster '{name}' is stopped")
                if args.all and not names:
                    print("no clusters to stop")
                return None
            if cmd == "status":
                c = Cluster(resolve_name(backend, args.name), backend)
                c.refresh()
                return c
            if cmd == "list":
                return Cluster.list(include_stopped=args.all, backend=backend)
            if cmd == "scale":
                return Cluster(args.name, backend).scale(args.workers, args.node_type,
                                                          wait=not args.no_wait)
            if cmd == "client":
                return Cluster(resolve_name(backend, args.name), backend).client()
            if cmd == "logs":
                logs = backend.logs(resolve_name(backend, args.name), args.node, args.tail)
                for node_id, text in logs.items():
                    print(f"==> {node_id} <==\n{text}\n")
                return None
        except OperationCancelled as e:
            print(f"cancelled: {e.message}")
            return None
        except CloudTikError as e:
            raise UsageError(e.message) from None
        raise UsageError(_help())  # pragma: no cover - argparse rejects unknown commands


# Features add their magics here: (module, Magics class name).
FEATURE_MAGICS: tuple[tuple[str, str], ...] = (
    ("jupyter_cloudtik.storage.magics", "StorageMagics"),
    ("jupyter_cloudtik.hpc.magics", "HPCMagics"),
    ("jupyter_cloudtik.hub.magics", "SidekickMagics"),
)


def register(ipython) -> None:
    import importlib

    ipython.register_magics(CloudTikMagics)
    for module, cls in FEATURE_MAGICS:
        ipython.register_magics(getattr(importlib.import_module(module), cls))
    _prewarm()


def _prewarm() -> None:
    """Start the local launcher in the background: the first `%cluster up` is then fast."""
    import os
    import threading

    from .session import API_URL_ENV

    if os.environ.get(API_URL_ENV):  # the server owns the clusters
        return

    def run() -> None:
        try:
            from .core.settings import default_settings
            from .providers.local.provider import prewarm_launcher

            prewarm_launcher(default_settings())
        except Exception:  # only an optimisation: `up` starts the launcher anyway
            pass

    threading.Thread(target=run, name="cloudtik-prewarm", daemon=True).start()
