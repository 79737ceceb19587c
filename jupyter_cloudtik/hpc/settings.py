"""HPC settings and the configured backends.

Backends are configured by name, each with a ``type`` (the plugin: local, slurm, firecrest,
arc, dask) and that plugin's options, so one kind can have several instances::

    # jupyter_cloudtik_config.py (or jupyter_server_config.py)
    c.HPC.backends = {
        "daint": {"type": "slurm", "host": "daint.example.org", "user": "me",
                  "partition": "normal", "workdir": "/scratch/me/jobs"},
        "eiger": {"type": "firecrest", "url": "https://api.example.org/firecrest/v2",
                  "system": "eiger", "token_uri": "https://auth.example.org/token",
                  "client_id": "my-client"},
    }

or the same under ``backends:`` in a YAML file named by ``c.HPC.config_file`` (or
``$CLOUDTIK_HPC_CONFIG``).  Secrets (SSH keys, OIDC client secrets, tokens) never go in
these files: ``jupyter cloudtik jobs secret BACKEND KEY`` puts them in the secret store.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Float, Int, Unicode
from traitlets.config import Configurable

from ..core import env, plugins
from ..core.errors import ConfigError
from ..core.settings import load_user_config
from .base import ENTRY_POINT_GROUP, BackendContext, HPCBackend

CONFIG_ENV = env.HPC_CONFIG
# always there unless configured otherwise: this machine, and the Dask clusters of this
# state folder ("dask" = the only running one; "dask:NAME" picks one)
DEFAULT_BACKENDS = {"local": {"type": "local"}, "dask": {"type": "dask"}}


class HPC(Configurable):
    """Settings of HPC jobs, shared by every face."""

    backends = Dict(
        default_value={},
        help="Configured HPC backends: {name: {type: local|slurm|firecrest|arc|dask, ...}}. "
             "'local' exists unless configured otherwise.",
    ).tag(config=True)

    config_file = Unicode(
        "", help=f"YAML file with a 'backends:' mapping (default: ${CONFIG_ENV})."
    ).tag(config=True)

    default_backend = Unicode(
        "local", help="Backend used when a job names none."
    ).tag(config=True)

    poll_interval = Float(
        0.25, help="Seconds before a backend is asked again after something changed."
    ).tag(config=True)

    poll_interval_fresh = Float(
        0.1, help="Seconds between polls while a job submitted in the last "
                  "`fresh_seconds` waits to start (it usually starts soon)."
    ).tag(config=True)

    fresh_seconds = Float(
        10.0, help="How long after its submission a queued job counts as fresh."
    ).tag(config=True)

    poll_interval_max = Float(
        15.0, help="Longest wait between two polls of a backend while nothing changes."
    ).tag(config=True)

    poll_backoff = Float(
        1.5, help="Factor the wait between polls grows by while nothing changes."
    ).tag(config=True)

    retry_interval_max = Float(
        60.0, help="Longest wait before asking a backend that did not answer again."
    ).tag(config=True)

    results_dir = Unicode(
        "hpc-jobs", help="Folder (relative to the session's folder) `fetch` copies results "
                         "into: <results_dir>/<job id>/."
    ).tag(config=True)

    provenance = Bool(
        True, help="Write a provenance crate (RO-Crate, Process Run Crate) into "
                   "<results_dir>/<job id>/ when a job ends (docs/hpc.md, Provenance). "
                   "Off: no crate, and no backend calls to read the job's checksums."
    ).tag(config=True)

    max_sweep_elements = Int(
        1000, help="Most elements one parameter sweep may have; a bigger grid is refused "
                   "before anything is recorded (a typo in a grid multiplies quickly)."
    ).tag(config=True)

    sweep_max_concurrent = Int(
        32, help="How many elements of a sweep run at once unless the sweep says "
                 "(max_concurrent): Slurm's --array=0-N%LIMIT (Slurm, FirecREST); on backends "
                 "without job arrays (local, ARC, Dask), at most this many of its jobs are "
                 "submitted and not yet ended. Also the ceiling: a sweep asking for more "
                 "is refused."
    ).tag(config=True)

    sweep_results_max_bytes = Int(
        64 << 20, help="Most bytes of executed notebooks one sweep's results table reads "
                       "(the values they recorded), all elements together: it is read in "
                       "the server for whoever asks. Rows past it say their values were "
                       "not read (fetch those notebooks to see them)."
    ).tag(config=True)

    def backend_configs(self) -> dict[str, dict[str, Any]]:
        configs: dict[str, dict[str, Any]] = {k: dict(v) for k, v in DEFAULT_BACKENDS.items()}
        path = self.config_file or os.environ.get(CONFIG_ENV, "")
        if path:
            configs.update(_read_backends_file(Path(path).expanduser()))
        for name, cfg in self.backends.items():
            if not isinstance(cfg, dict):
                raise ConfigError(f"HPC.backends.{name}: expected a mapping, got {cfg!r}",
                                  field=f"backends.{name}")
            configs[name] = dict(cfg)
        for name, cfg in configs.items():
            if not cfg.get("type"):
                raise ConfigError(
                    f"backends.{name}.type: missing; one of {', '.join(installed_types())}",
                    field=f"backends.{name}.type")
        return configs


def _read_backends_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"HPC config file {path} does not exist", field="config_file") from None
    return parse_backends_text(text, str(path))


def parse_backends_text(text: str, path: str) -> dict[str, dict[str, Any]]:
    """The ``backends:`` mapping of an HPC config file's text (``path`` names it in errors)."""
    import yaml

    from ..core.config import load_yaml  # deferred: start-up (core.config ~13 ms, loads yaml)

    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"HPC config file {path}: {e}", field="config_file") from None
    backends = data.get("backends") if isinstance(data, dict) else None
    if not isinstance(backends, dict):
        raise ConfigError(f"HPC config file {path}: expected a 'backends:' mapping",
                          field="config_file")
    out: dict[str, dict[str, Any]] = {}
    for k, v in backends.items():
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"HPC config file {path}: backends.{k} must be a mapping of "
                              f"settings (type: slurm, ...), not {type(v).__name__}",
                              field=f"backends.{k}")
        out[str(k)] = dict(v or {})
    return out


def installed_types() -> list[str]:
    return plugins.installed(ENTRY_POINT_GROUP)


def hpc_settings(parent=None) -> HPC:
    """HPC settings for a face outside a Jupyter server (CLI, plain IPython, kernels)."""
    if parent is not None:
        return HPC(parent=parent)

    return HPC(config=load_user_config())


class BackendRegistry:
    """Creates configured backends on first use and keeps them (they hold connections)."""

    def __init__(self, hpc: HPC, state_dir: Path, secrets: Any, log: Any,
                 settings: Any = None) -> None:
        self.hpc = hpc
        self.state_dir = state_dir
        self.secrets = secrets
        self.log = log
        self.settings = settings
        self._backends: dict[str, HPCBackend] = {}
        self._lock = threading.Lock()

    def configs(self) -> dict[str, dict[str, Any]]:
        return self.hpc.backend_configs()

    def names(self) -> list[str]:
        return sorted(self.configs())

    def resolve(self, name: str | None) -> str:
        name = name or self.hpc.default_backend
        configs = self.configs()
        if name not in configs and name.startswith("dask:") and len(name) > 5:
            return name
        if name not in configs:
            raise ConfigError(
                f"backend: unknown backend '{name}'; configured: {', '.join(sorted(configs))}",
                field="backend", value=name)
        return name

    def get(self, name: str | None) -> HPCBackend:
        name = self.resolve(name)
        with self._lock:
            if name in self._backends:
                return self._backends[name]
            configs = self.configs()
            cfg = configs[name] if name in configs else {"type": "dask", "cluster": name[5:]}
            cls = plugins.load(ENTRY_POINT_GROUP, cfg["type"], field=f"backends.{name}.type",
                               what="HPC backend type")
            ctx = BackendContext(state_dir=self.state_dir, secrets=self.secrets, log=self.log,
                                 settings=self.settings, name=name)
            backend = cls(name, cfg, ctx)
            self._backends[name] = backend
            return backend

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for name in self.names():
            try:
                out.append({**self.get(name).describe(), "available": True,
                            "default": name == self.hpc.default_backend})
            except Exception as e:  # a broken config must not hide the others
                out.append({"name": name, "type": self.configs()[name].get("type"),
                            "available": False, "reason": getattr(e, "message", str(e)),
                            "default": name == self.hpc.default_backend})
        return out

    def close(self) -> None:
        with self._lock:
            for backend in self._backends.values():
                try:
                    backend.close()
                except Exception:
                    pass
            self._backends.clear()
