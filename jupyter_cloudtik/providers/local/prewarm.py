"""Starting the launcher daemon before the first ``up`` needs it (``%load_ext``, the
Jupyter server's start), so that ``up`` does not wait for Dask to be imported."""

from __future__ import annotations

import os
import sys
import threading

from . import launcher
from .node import scrub_environment
from .settings import LocalProvider


def prewarm_in_background(settings) -> threading.Thread:
    """``prewarm_launcher`` in a daemon thread: a face that will likely need the launcher
    (``%load_ext``, the Jupyter server's start) starts it without waiting for it."""

    def run() -> None:
        try:
            prewarm_launcher(settings)
        except Exception:  # only an optimisation: `up` starts the launcher anyway
            pass

    t = threading.Thread(target=run, name="cloudtik-prewarm", daemon=True)
    t.start()
    return t


def prewarm_launcher(settings) -> bool:
    """Start the local launcher now if this setup will use it; True if it was asked to."""
    local = LocalProvider(parent=settings)
    if not (local.prewarm and local.launch_method == "fork"
            and settings.default_provider == "local" and sys.platform.startswith("linux")):
        return False
    launcher.ensure_running(settings.state_dir, local.launcher_idle_seconds,
                            env=scrub_environment(dict(os.environ)))
    return True
