"""IPython magics: ``%cluster up|down|status|list|scale|client|logs``.

Load with ``%load_ext jupyter_cloudtik``.  Errors are shown as ``UsageError`` (one line, no
traceback); state is never changed by a command that fails its checks.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..core.errors import CloudTikError, OperationCancelled
from ..ipython_errors import install as one_line_errors
from ..magic_line import parse_magic_line
from ..magic_typos import install
from .commands import cluster_parser


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

          %cluster up [CONFIG] [--name N] [--workers N] [--cores C] [--memory M]
                      [--provider P] [--runtime R]
                      [--sync-env]
                      [--no-wait]
              Start a cluster (or repair it to match its config) and return it;
              `c = %cluster up --workers 2` keeps the Cluster object.
          %cluster down [NAME | --all]      stop a cluster and every node of it
          %cluster status [NAME]            live state, nodes, dashboard link
          %cluster list [--all]             all clusters (--all: stopped ones too)
          %cluster scale NAME N [--node-type T]   change the number of workers
          %cluster adapt NAME --min N --max M [--off]   scale with the load (run by
              the server, so it goes on when this kernel is gone)
          %cluster client [NAME]            the runtime's client (distributed.Client,
                                            SparkSession)
          %cluster logs [NAME] [--node ID] [--tail N]   node logs

        NAME may be left out when exactly one cluster exists.  Ctrl-C / "interrupt
        kernel" during up, scale or down cancels the operation; running `up` again
        finishes it.  `%cluster` alone lists the commands; `%cluster <command> --help`
        gives the options of one.  The line is read like a shell's: a trailing `# comment`
        is ignored, quotes group words (`jupyter_cloudtik/magic_line.py`).
        """
        # deferred: start-up (clusters.api ~61 ms, loads asyncio, yaml; clusters.client ~33 ms,
        #   loads asyncio, psutil)
        from .api import Cluster, ClusterStatus
        from .client import get_backend, resolve_name

        args = parse_magic_line("%cluster", _parser(), line)
        if args is None:  # help was printed
            return None
        try:
            backend = get_backend()
            cmd = args.command
            if cmd == "up":
                c = Cluster.up(args.config, name=args.name, workers=args.workers,
                               provider=args.provider, runtime=args.runtime,
                               sync_env=args.sync_env,
                               cores=args.cores, memory=args.memory,
                               wait=not args.no_wait,
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
                return ClusterStatus(c)  # the cluster's row and a row per node
            if cmd == "list":
                return Cluster.list(include_stopped=args.all, backend=backend)
            if cmd == "scale":
                return Cluster(args.name, backend).scale(args.workers, args.node_type,
                                                          wait=not args.no_wait)
            if cmd == "adapt":
                print(_adapt(Cluster(args.name, backend), args))
                return None
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


def _adapt(cluster: Any, args: Any) -> str:
    """Run an ``adapt`` command (magic or CLI); the line to print."""
    if args.off:
        cluster.adapt(off=True)
        return f"adaptive scaling of '{cluster.name}' is off"
    if args.minimum is None or args.maximum is None:
        raise UsageError("adapt: give --min and --max (or --off)")
    spec = cluster.adapt(args.minimum, args.maximum, interval=args.interval,
                         wait_count=args.wait_count)
    return (f"cluster '{cluster.name}' adapts between {spec['minimum']} and "
            f"{spec['maximum']} workers (every {spec['interval']:g} s)")


def register(ipython) -> None:
    """Every feature's magics (``jupyter_cloudtik.features`` entry points; this module's
    ``CloudTikMagics`` is the clusters feature's)."""
    _prewarm()  # first: the launcher's start overlaps the magics' imports
    # deferred: start-up (core.features ~14 ms, loads importlib.metadata)
    from ..core.features import magics_classes

    ours = []
    for cls in magics_classes():
        ipython.register_magics(cls)
        ours += [*cls.magics.get("line", {}), *cls.magics.get("cell", {})]

    install(ipython, ours)  # %clsuter: "did you mean %cluster?"

    one_line_errors(ipython)  # Cluster.up(...) failing: its message, not a traceback


def _prewarm() -> None:
    """Start the local launcher in the background: the first `%cluster up` is then fast."""
    import os
    import threading

    # deferred: start-up (clusters.client ~31 ms, loads asyncio, psutil)
    from .client import API_URL_ENV

    if os.environ.get(API_URL_ENV):  # the server owns the clusters
        return

    def run() -> None:
        try:  # the imports too: %load_ext returns at once
            # deferred: start-up (core.settings ~6 ms, loads jupyter_core, platformdirs;
            #   providers.local.prewarm ~16 ms, loads psutil, subprocess)
            from ..core.settings import default_settings
            from ..providers.local.prewarm import prewarm_launcher

            prewarm_launcher(default_settings())
        except Exception:  # only an optimisation: `up` starts the launcher anyway
            pass

    threading.Thread(target=run, name="cloudtik-prewarm", daemon=True).start()
