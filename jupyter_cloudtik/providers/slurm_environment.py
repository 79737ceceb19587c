"""The session's environment for a Slurm cluster's jobs over SSH (a part of
``SlurmNodeProvider``).

Why: over SSH the jobs run as the site's account on its nodes, where the system's
``python3`` has no Dask (or another version) and the session's interpreter is out of
reach; a task is a cloudpickled function that needs the client's Python major.minor and
exact dask/distributed/cloudpickle/msgpack.  So when no ``python`` is named, the
environment is built on the system as HPC jobs build theirs (hpc's
``slurm_environment`` service: the same lock, the same ``<workdir>/.cloudtik-envs`` of
the login node's HPC backend, shared with its jobs): those packages and ``runtime.pip``
(names), or every installed package with ``runtime.sync_env``, at the session's versions.
Prepared at the up-front check, before anything is queued; each job script builds it
unless it is there.  On this machine the jobs run this very Python (``runtime.pip``
must be installed here), and a named ``python`` is taken as it is.
"""

from __future__ import annotations

import importlib.metadata as md
import types
from typing import Any

from ..core import features
from ..core.errors import ConfigError
from ..runtime import environment as rtenv
from ..runtime.environment import CHECKED

#: besides runtime.CHECKED: the scheduler's dashboard, when the session has it
DASHBOARD = ("bokeh",)


def _remote(p: dict[str, Any]) -> bool:
    return bool(p.get("host") or p.get("backend"))


def _builds(p: dict[str, Any]) -> bool:
    return _remote(p) and not p.get("python")


def packages_of(runtime: dict[str, Any] | None) -> Any:
    """What the cluster's environment holds: "session" (``runtime.sync_env``) or names."""
    rt = runtime or {}
    if rt.get("sync_env"):
        return "session"
    names = list(CHECKED)
    for n in DASHBOARD:
        try:
            md.version(n)
        except md.PackageNotFoundError:
            continue
        names.append(n)
    return names + [str(e) for e in rt.get("pip") or []]


class SlurmEnvironment:
    """Which Python the jobs run, and the built environment's lines."""

    @classmethod
    def check_packages(cls, cfg: dict[str, Any]) -> None:
        """``runtime.pip`` / ``runtime.sync_env``: built on the system over SSH (names
        only: a folder or a direct reference would be built on this side), this
        machine's Python locally, refused with a named ``python``."""
        p = cfg["provider"]
        if not _builds(p):
            how = False if p.get("python") else "shared"
            rtenv.check_packages(cfg, types.SimpleNamespace(installs_packages=how))
            return
        pip = list((cfg.get("runtime") or {}).get("pip") or [])
        rtenv.check_pip_entries(pip)
        from packaging.requirements import Requirement

        for i, e in enumerate(pip):
            if rtenv.is_local(e) or Requirement(e).url is not None:
                raise ConfigError(
                    f"runtime.pip.{i}: {e!r} is not a package name; over SSH the jobs' "
                    "environment is built on the system from the session's installed "
                    "packages (give names of packages installed here)",
                    field=f"runtime.pip.{i}", value=e)

    def builds_environment(self) -> bool:
        return _builds(self.provider_config)

    def prepare_environment(self, runtime: dict[str, Any] | None) -> dict[str, Any] | None:
        """The built environment (once per provider object, from the first ``runtime``
        asked with: the cluster's, at the check or at the first node): checked and staged
        on the system; None when the jobs run a Python as it is."""
        if not self.builds_environment():
            return None
        if self._env is None:
            p = self.provider_config
            service = features.feature_service("slurm_environment")
            self._env = service(self.context, p.get("backend"), self._login_config(),
                                packages_of(runtime), login=self.login)
            self.context.log.info("the jobs' environment %s (%d packages) on %s",
                                  self._env["hash"], len(self._env["pins"]), self.where)
        return self._env
