"""The local provider's settings (``c.LocalProvider.*``): overcommit limits, the
oversubscription warning, how nodes are launched, where they listen."""

from __future__ import annotations

import os

from traitlets import Bool, Enum, Float, Unicode, default
from traitlets.config import Configurable

from ...core import env as envnames

#: the default factor of ``oversubscription_warning``
OVERSUBSCRIPTION_WARNING = 2.0


class LocalProvider(Configurable):
    """Settings of the local provider (``c.LocalProvider.*``)."""

    cpu_overcommit = Float(
        None, allow_none=True,
        help="Unset (the default): local nodes may declare any number of cores in total, "
             "as LocalCluster's workers share the machine (a warning past "
             "oversubscription_warning). Set: a hard limit, the nodes of every cluster may "
             "declare at most this machine's cores times this factor; more is refused.",
    ).tag(config=True)
    memory_overcommit = Float(
        None, allow_none=True,
        help="Unset (the default): no limit on the memory local nodes declare in total "
             "(one node may not declare more than the machine has). Set: a hard limit of "
             "this machine's memory times this factor for all of them.",
    ).tag(config=True)
    oversubscription_warning = Float(
        OVERSUBSCRIPTION_WARNING,
        help="A start or scale whose local nodes (of every cluster) would declare more "
             "than this many times this machine's cores or memory goes ahead with a "
             "warning (an event, and a message in the magics, the CLI and the panel). "
             "0: never warn.",
    ).tag(config=True)
    launch_method = Enum(
        ["fork", "exec"], default_value="fork",
        help="fork: nodes are forked from a launcher daemon with Dask preloaded (fast). "
             "exec: each node is a fresh `python` process.",
    ).tag(config=True)
    prewarm = Bool(
        True, help="Start the launcher in the background when the magics are loaded "
                   "(`%load_ext jupyter_cloudtik`) or the Jupyter server starts, so the "
                   "first `%cluster up` does not wait for Dask to be imported.",
    ).tag(config=True)
    launcher_idle_seconds = Float(
        help="Seconds the launcher daemon stays after its last node ended "
             "(env CLOUDTIK_LAUNCHER_IDLE; default 300).",
    ).tag(config=True)
    host = Unicode(
        "127.0.0.1", help="Address schedulers and workers listen on."
    ).tag(config=True)
    terminate_grace = Float(
        2.0, help="Seconds between SIGTERM and SIGKILL when stopping a node."
    ).tag(config=True)

    @default("launcher_idle_seconds")
    def _default_idle(self) -> float:
        try:
            return float(os.environ.get(envnames.LAUNCHER_IDLE, "300"))
        except ValueError:
            return 300.0
