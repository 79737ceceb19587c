"""Process-wide settings as a traitlets ``Configurable``.

``c.CloudTik.state_dir = ...`` works in ``jupyter_server_config.py`` (the server extension
creates this object with ``parent=serverapp``) and in ``jupyter_cloudtik_config.py``
(read by the CLI and the magics from the Jupyter config path), so one setting file serves
every face.
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_core.paths import jupyter_config_path, jupyter_data_dir
from traitlets import Bool, Float, Int, List, Unicode, default, validate
from traitlets.config import Config, Configurable
from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

from . import env

STATE_DIR_ENV = env.STATE_DIR
CONFIG_FILE_BASENAME = "jupyter_cloudtik_config"


class CloudTik(Configurable):
    """Settings shared by the core managers and every face."""

    state_dir = Unicode(
        help=f"""Folder holding the state database, node logs and secrets.
        Default: ${STATE_DIR_ENV} if set, else <jupyter data dir>/cloudtik.""",
    ).tag(config=True)

    default_provider = Unicode(
        "local", help="Provider used when a cluster config names none."
    ).tag(config=True)

    allowed_providers = List(
        Unicode(),
        default_value=[],
        help="Provider types users may use; empty means every installed provider.",
    ).tag(config=True)

    max_clusters = Int(
        0, help="Most clusters that may exist at once in this state store (0 = no limit)."
    ).tag(config=True)

    max_workers_per_cluster = Int(
        0, help="Most worker nodes one cluster may have (0 = no limit)."
    ).tag(config=True)

    operation_timeout = Float(
        600.0, help="Seconds a cluster operation may take before it fails with a timeout."
    ).tag(config=True)

    reaper_interval = Float(
        30.0, help="Seconds between two checks of the idle reaper."
    ).tag(config=True)

    start_reaper = Bool(
        True, help="Start the idle reaper daemon when a cluster with idle_timeout_minutes is up."
    ).tag(config=True)

    @default("state_dir")
    def _default_state_dir(self) -> str:
        env = os.environ.get(STATE_DIR_ENV)
        if env:
            return env
        return str(Path(jupyter_data_dir()) / "cloudtik")

    @validate("state_dir")
    def _validate_state_dir(self, proposal):
        return str(Path(proposal["value"]).expanduser())

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)


def load_user_config() -> Config:
    """Read ``jupyter_cloudtik_config.{json,py}`` from the Jupyter config path.

    Used by the CLI, the magics and daemons, which have no Jupyter application to load
    config for them.  Later paths (user) override earlier ones (system), as in Jupyter.
    """
    merged = Config()
    for folder in reversed(jupyter_config_path()):
        for loader_cls, suffix in ((JSONFileConfigLoader, ".json"), (PyFileConfigLoader, ".py")):
            loader = loader_cls(CONFIG_FILE_BASENAME + suffix, path=folder)
            try:
                merged.merge(loader.load_config())
            except ConfigFileNotFound:
                continue
    return merged


def default_settings() -> CloudTik:
    """Settings for a face that runs outside a Jupyter server (CLI, plain IPython)."""
    return CloudTik(config=load_user_config())
