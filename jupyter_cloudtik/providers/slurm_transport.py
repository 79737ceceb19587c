"""How the Slurm provider reaches Slurm: the login node of ``transport.slurm``
(``SlurmLogin`` and its ``LocalShell``/``SSHShell``, shared with the HPC backends), here
or over SSH, and the job folder there.  A named ``backend:`` (resolved by hpc's
``slurm_login`` service, since providers never import hpc) or an inline
``host:``/``user:``/``port:``; an unreachable Slurm during the up-front check is a wrong
field (``ConfigError``), later a provider error.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..core import features
from ..core.errors import BackendUnavailable, ConfigError, ProviderError

if TYPE_CHECKING:
    from ..transport.shell import Result
    from ..transport.slurm import SlurmLogin


class SlurmTransport:
    """The login node, the Slurm commands run there and the job folder (a part of
    ``SlurmNodeProvider``)."""

    def _login_config(self) -> dict:
        """The login node's fields of an inline provider (``env`` only with ``backend:``,
        whose own config hpc reads)."""
        p = self.provider_config
        if p.get("backend"):
            cfg: dict = {}
        else:
            cfg = {"type": "slurm"}
            for k in ("host", "port", "user", "known_hosts", "check_host_key",
                      "connect_timeout", "keepalive_interval", "keepalive_count_max"):
                if k in p:
                    cfg[k] = p[k]
            if cfg.get("host") and not cfg.get("user"):
                import getpass

                cfg["user"] = getpass.getuser()  # as ssh does
        cfg["env"] = dict(p.get("env") or {})
        return cfg

    @property
    def login(self) -> SlurmLogin:
        if self._login is None:
            # hpc owns the configured backends and their keys; it offers them as a service
            slurm_login = features.feature_service("slurm_login")
            self._login = slurm_login(self.context, self.provider_config.get("backend"),
                                      self._login_config())
        return self._login

    @property
    def where(self) -> str:
        p = self.provider_config
        if p.get("backend"):
            return f"backend '{p['backend']}'"
        return p.get("host") or "this machine"

    def _host_field(self) -> str:
        return "provider.backend" if self.provider_config.get("backend") else "provider.host"

    def _run(self, argv: list[str], what: str, input: bytes | None = None,
             timeout: float = 60.0) -> Result:
        try:
            return self.login.slurm(argv, what, timeout=timeout, input=input)
        except BackendUnavailable as e:
            if self._checking:  # the up-front check: the field is wrong, not the weather
                raise ConfigError(f"{self._host_field()}: cannot reach Slurm on {self.where}: "
                                  f"{e.message}", field=self._host_field()) from None
            raise ProviderError(f"Slurm on {self.where} did not answer: {e.message}") from None
        except ProviderError as e:
            if self._checking:
                raise ConfigError(f"{self._host_field()}: {e.message}",
                                  field=self._host_field()) from None
            raise

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            wd = self.provider_config.get("workdir") or "~/cloudtik-slurm"
            if wd.startswith("~"):
                wd = self.login.shell.home() + wd[1:]
            self._workdir = f"{wd.rstrip('/')}/{self.ns}-{self.cluster_name}"
        return self._workdir

    @property
    def python(self) -> str:
        """A named ``python``; over SSH the built environment's (``slurm_environment``,
        prepared first); else this machine's interpreter."""
        if self._env is not None:
            return self._env["python"]
        return self.provider_config.get("python") or (
            "python3" if self.remote else sys.executable)
