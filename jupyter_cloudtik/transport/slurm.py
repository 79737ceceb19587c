"""Slurm's commands on a login node: the shell there (this machine, or SSH with a key from
the secret store) and each command's answer, with "Slurm cannot be reached" told apart
from "Slurm said no".

Shared by the ``slurm`` HPC backend (``hpc/slurm.py``) and the Slurm node provider
(``providers/slurm_transport.py``), so both read the same config fields (``host``,
``port``, ``user``, ``known_hosts``, ``check_host_key``, ``connect_timeout``,
``keepalive_*``, ``env``) the same way and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import BackendUnavailable
from .shell import KEEPALIVE_COUNT_MAX, KEEPALIVE_INTERVAL, LocalShell, Result, SSHShell

UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
               "Zero Bytes were transmitted", "slurm_load_jobs error")


def slurm_int(value: object) -> int | None:
    """A count Slurm printed (``CPUTot=2``), or None for anything else (``UNLIMITED``,
    ``N/A``, ``²``, which ``str.isdigit`` accepts and ``int`` refuses, 40 digits)."""
    if isinstance(value, str) and value.isascii() and value.isdecimal() and len(value) <= 18:
        return int(value)
    return None


def parse_kv(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` lines: space-separated KEY=VALUE (values without spaces)."""
    out = {}
    for token in line.split():
        if "=" in token:
            k, v = token.split("=", 1)
            out[k] = v
    return out


class SlurmLogin:
    """The login node of one Slurm config: its shell, opened on first use and kept, and
    the Slurm commands run there.  ``secret(key)`` answers the config's own credentials
    (``ssh_key``, ``ssh_key_passphrase``) or None; the caller decides whose they are."""

    def __init__(self, config: dict[str, Any],
                 secret: Callable[[str], str | None]) -> None:
        self.config = config
        self.remote = bool(config.get("host"))
        self._secret = secret
        self._shell: LocalShell | SSHShell | None = None

    @property
    def shell(self) -> LocalShell | SSHShell:
        if self._shell is None:
            env = dict(self.config.get("env") or {})
            if self.remote:
                self._shell = SSHShell(
                    self.config["host"], user=self.config.get("user"),
                    port=int(self.config.get("port", 22)),
                    private_key=self._secret("ssh_key"),
                    passphrase=self._secret("ssh_key_passphrase"),
                    known_hosts=self.config.get("known_hosts"),
                    check_host_key=self.config.get("check_host_key", True),
                    connect_timeout=float(self.config.get("connect_timeout", 15)), env=env,
                    keepalive_interval=float(self.config.get(
                        "keepalive_interval", KEEPALIVE_INTERVAL)),
                    keepalive_count_max=int(self.config.get(
                        "keepalive_count_max", KEEPALIVE_COUNT_MAX)))
            else:
                self._shell = LocalShell(env)
        return self._shell

    def slurm(self, argv: list[str], what: str, timeout: float = 60.0,
              input: bytes | None = None, cwd: str | None = None) -> Result:
        """Run one Slurm command; an answer saying the controller cannot be reached is
        ``BackendUnavailable`` (try later), any other answer is returned as it is."""
        r = self.shell.run(argv, input=input, timeout=timeout, cwd=cwd)
        if r.rc != 0 and any(s in r.stderr for s in UNREACHABLE):
            raise BackendUnavailable(f"{what}: {r.message}")
        return r

    def close(self) -> None:
        if self._shell is not None:
            self._shell.close()
            self._shell = None
