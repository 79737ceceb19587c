"""How the Slurm provider reaches Slurm: the HPC backends' own Slurm commands
(``hpc.slurm.SlurmBackend`` and its ``LocalShell``/``SSHShell``), here or on a login
node over SSH, and the job folder there.  A named ``backend:`` or an inline
``host:``/``user:``/``port:``; an unreachable Slurm during the up-front check is a
wrong field (``ConfigError``), later a provider error.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..core.errors import ConfigError, ProviderError

if TYPE_CHECKING:
    from ..hpc.shell import Result
    from ..hpc.slurm import SlurmBackend


class SlurmTransport:
    """The login node, the Slurm commands run there and the job folder (a part of
    ``SlurmNodeProvider``)."""

    @property
    def backend(self) -> SlurmBackend:
        if self._backend is None:
            from ..core.secrets import SecretStore
            from ..hpc.base import BackendContext
            from ..hpc.settings import hpc_settings
            from ..hpc.slurm import SlurmBackend

            p = self.provider_config
            name = p.get("backend") or "slurm"
            if p.get("backend"):
                configs = hpc_settings(parent=self.context.settings).backend_configs()
                cfg = configs.get(name)
                if cfg is None or cfg.get("type") != "slurm":
                    slurms = sorted(n for n, c in configs.items() if c.get("type") == "slurm")
                    raise ConfigError(
                        f"provider.backend: '{name}' is not a configured HPC backend of type "
                        f"slurm (slurm backends: {', '.join(slurms) or 'none'})",
                        field="provider.backend", value=name)
                cfg = dict(cfg)
            else:
                cfg = {"type": "slurm"}
                for k in ("host", "port", "user", "known_hosts", "check_host_key",
                          "connect_timeout", "keepalive_interval", "keepalive_count_max"):
                    if k in p:
                        cfg[k] = p[k]
                if cfg.get("host") and not cfg.get("user"):
                    import getpass

                    cfg["user"] = getpass.getuser()  # as ssh does
            cfg["env"] = {**(cfg.get("env") or {}), **(p.get("env") or {})}
            ctx = BackendContext(state_dir=self.context.state_dir,
                                 secrets=SecretStore(self.context.store), log=self.context.log,
                                 settings=self.context.settings, name=name)
            self._backend = SlurmBackend(name, cfg, ctx)
        return self._backend

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
        from ..core.errors import BackendUnavailable

        try:
            return self.backend._slurm(argv, what, timeout=timeout, input=input)
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
                wd = self.backend.shell.home() + wd[1:]
            self._workdir = f"{wd.rstrip('/')}/{self.ns}-{self.cluster_name}"
        return self._workdir

    @property
    def python(self) -> str:
        return self.provider_config.get("python") or (
            "python3" if self.remote else sys.executable)
