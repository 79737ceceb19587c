"""One interactive kernel as a Slurm batch job: submit, watch, reach, signal, cancel.

The job runs ``python -m ipykernel_launcher -f kernel.json`` in the session's environment
(``hpc/environment.py``: the interpreter itself on this machine, or the session's
packages built on the system), with the profile's sizes as ``#SBATCH`` lines.  The
connection file names ``127.0.0.1`` and port 0: the kernel binds its five ports on the
node's loopback only and writes them back into the file, which the server then reads
(SFTP or the local filesystem).  The server reaches those ports

* on a Slurm backend over SSH: through an SSH connection to the compute node, made
  through the kept connection to the login node (``ssh -J``), one forwarded local port
  per kernel port — authenticated and encrypted end to end, never ZMQ on the network;
* on a Slurm backend on this machine: directly, when the node is this machine (the
  kernel's loopback is ours); another node is refused (configure ``host:`` to go over
  SSH).

Everything here blocks (it talks to the login node): the provisioner calls it in a
thread.
"""

from __future__ import annotations

import json
import shlex
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...core import env as envnames
from ...core.errors import ConfigError, ProviderError
from ...transport.slurm import parse_kv
from .. import script
from ..base import JobRef, JobStatus, Submission
from ..environment import summary
from ..slurm import SlurmBackend
from .profiles import Profile

CONNECTION_FILE = "kernel.json"
#: the node's side of the session's storages (node_access.py, node_helper.py)
API_FILE = "cloudtik-api.json"
HELPER_FILE = "cloudtik_node.py"
NODE_API_ENV = envnames.NODE_API
#: loads ``%storage`` at the kernel's start; no name is left in the user's namespace
STORAGE_LINE = "__import__('cloudtik_node').register();"
SCRIPT = "kernel.sh"
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def warning_line(seconds: float, warn_before: float) -> str:
    """An ``exec_lines`` entry: a daemon timer in the kernel that prints, on the
    notebook's stderr, that the wall time ends soon (no name is left in the user's
    namespace; the trailing ``;`` keeps the startup silent)."""
    delay = max(0.0, seconds - warn_before)
    minutes = max(1, round(min(warn_before, seconds) / 60))
    message = (f"jupyter_cloudtik: this kernel's batch job reaches its wall time in about "
               f"{minutes} min; the kernel will then be stopped (save your work)")
    return ("(lambda t: (setattr(t, 'daemon', True), t.start()))(__import__('threading')"
            f".Timer({delay:.0f}, lambda: print({message!r}, file=__import__('sys').stderr,"
            " flush=True)));")


@dataclass
class KernelJob:
    """The batch job of one kernel on a Slurm backend."""

    backend: SlurmBackend
    profile: Profile
    key: str  # the HMAC key the kernel signs messages with
    warn_before: float = 300.0
    job_id: str = field(default_factory=lambda: KernelJob.new_id())
    native_id: str | None = None
    node: str | None = None
    address: str | None = None  # the node as SSH reaches it (node_address(), kept)
    environment: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def new_id() -> str:
        return f"kernel-{uuid.uuid4().hex[:12]}"

    @property
    def folder(self) -> str:
        return self.backend.folder(self.job_id)

    @property
    def ref(self) -> JobRef:
        return JobRef(self.job_id, self.native_id or "")

    # submitting ---------------------------------------------------------------------------
    def check(self) -> None:
        """Sizes beyond the partition are refused before anything is submitted."""
        self.backend.validate(self.profile.job_spec())

    def render(self, sub: Submission) -> str:
        folder = self.folder
        env_lines, run = script._activation(sub.environment)
        argv = ["-m", "ipykernel_launcher", "-f", f"{folder}/{CONNECTION_FILE}",
                f"--IPKernelApp.exec_lines={warning_line(self.profile.time, self.warn_before)}",
                f"--IPKernelApp.exec_lines={STORAGE_LINE}"]
        lines = ["#!/bin/bash", *self.backend.directives(sub, folder),
                 f"# jupyter_cloudtik interactive kernel {self.job_id} ({self.profile.name})",
                 "set -u", f"cd {shlex.quote(folder)} || exit 90",
                 # the session's storages (%storage): written once the server reaches it
                 f"export {NODE_API_ENV}={shlex.quote(f'{folder}/{API_FILE}')}",
                 'ct_fail() { echo "jupyter_cloudtik: $1" >&2; exit 91; }', *env_lines,
                 f'exec {run} "$CT_PYTHON" {" ".join(shlex.quote(a) for a in argv)}']
        return "\n".join(lines) + "\n"

    def submit(self) -> str:
        be, sh = self.backend, self.backend.shell
        spec = self.profile.job_spec()
        env = be.prepare_environment(be.default_environment())
        sub = Submission(job_id=self.job_id, token=self.job_id, spec=spec, environment=env)
        be.stage_environment(sub)  # a built environment's wheels and build script

        self.environment = summary({"python": env.python, "container": env.container,
                                    "setup": env.setup, "build": env.build})
        sh.mkdir(f"{self.folder}/{script.MARKER_DIR}")
        info = {"transport": "tcp", "ip": "127.0.0.1", "key": self.key,
                "signature_scheme": "hmac-sha256", **dict.fromkeys(PORT_NAMES, 0)}
        # the key signs every message: readable by the job's account only
        sh.write_bytes(f"{self.folder}/{CONNECTION_FILE}", json.dumps(info).encode(), 0o600)
        sh.write_bytes(f"{self.folder}/{SCRIPT}", self.render(sub).encode(), 0o700)
        sh.write_bytes(f"{self.folder}/{HELPER_FILE}", _helper_source(), 0o644)
        r = be._slurm(["sbatch", "--parsable", f"{self.folder}/{SCRIPT}"], "sbatch",
                      cwd=self.folder)
        if r.rc != 0:
            raise ProviderError(f"sbatch refused the kernel's job: {r.message}")
        native = r.stdout.strip().split(";", 1)[0]
        if not native.isdigit():
            raise ProviderError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
        self.native_id = native
        return native

    # watching -----------------------------------------------------------------------------
    def status(self) -> JobStatus:
        return self.backend.poll([self.ref])[self.ref.native_id]

    def connection(self) -> dict[str, Any] | None:
        """The kernel's connection file on the system, as it is now (else None)."""
        try:
            data = self.backend.shell.read_bytes(f"{self.folder}/{CONNECTION_FILE}")
            info = json.loads(data.decode())
        except (ValueError, OSError, ProviderError):
            return None
        return info if isinstance(info, dict) else None

    def ports(self) -> dict[str, int] | None:
        """The kernel's ports on the node, once it has bound them (else None)."""
        info = self.connection()
        if info is None:
            return None
        ports = {k: info.get(k) for k in PORT_NAMES}
        if all(isinstance(v, int) and 0 < v < 65536 for v in ports.values()):
            return ports
        return None

    def node_address(self) -> str:
        """The compute node the job runs on, as the login node names it for SSH."""
        r = self.backend._slurm(["squeue", "-h", "-j", self.ref.native_id, "-o", "%N"],
                                "squeue")
        node = r.stdout.strip().split(",")[0] if r.rc == 0 else ""
        if not node:
            raise ProviderError(f"Slurm does not say which node job {self.native_id} runs on")
        self.node = node
        addr = node
        template = self.backend.config.get("kernel_node_address") or "{addr}"
        if "{addr}" in template:  # else the node's NodeAddr is not used: not asked for
            n = self.backend._slurm(["scontrol", "show", "node", "-o", node], "scontrol")
            if n.rc == 0:
                addr = parse_kv(n.stdout).get("NodeAddr") or node
        self.address = template.replace("{node}", node).replace("{addr}", addr)
        return self.address

    def open_channels(self, ports: dict[str, int], folder: str | None = None
                      ) -> tuple[dict[str, Any], Any]:
        """Local ports that reach the kernel's ports, and what closes them (or None).

        With ``folder`` (a private folder of this machine), the forwards over SSH listen
        on Unix sockets there (``<folder>/<port name>``) instead of loopback ports."""
        # asked while the kernel started (the provisioner's wait), else now
        address = self.address or self.node_address()
        if not self.backend.remote:
            if address not in LOOPBACK and address not in _this_host():
                raise ConfigError(
                    f"backend: the kernel's node '{address}' is not this machine; a Slurm "
                    f"backend without host: reaches kernels on this machine only (set "
                    f"backends.{self.backend.name}.host to reach the nodes over SSH)",
                    field="backend", value=self.backend.name)
            return dict(ports), None
        port = int(self.backend.config.get("kernel_node_port", 22))
        names = list(PORT_NAMES)
        paths = [f"{folder}/{n}" for n in names] if folder is not None else None
        tunnels = self.backend.shell.forward_through(address, port, [ports[n] for n in names],
                                                     paths=paths)
        return dict(zip(names, tunnels.ports, strict=True)), tunnels

    # acting -------------------------------------------------------------------------------
    def signal(self, name: str) -> None:
        """A signal to the kernel itself (the batch step runs it with exec)."""
        if not self.native_id:
            return
        r = self.backend._slurm(["scancel", "--batch", f"--signal={name}", self.native_id],
                                "scancel")
        if r.rc != 0 and "already completing or completed" not in r.stderr:
            raise ProviderError(f"scancel --signal={name} failed: {r.message}")

    def cancel(self) -> None:
        if self.native_id:
            self.backend.cancel(self.ref)

    def write_node_api(self, url: str, token: str) -> None:
        """Where the kernel's ``%storage`` asks the server, and its token (0600)."""
        self.backend.shell.write_bytes(f"{self.folder}/{API_FILE}",
                                       json.dumps({"url": url, "token": token}).encode(),
                                       0o600)

    def forget_key(self) -> None:
        """The connection file holds the key, the API file the node's token: gone once
        the kernel is (the log stays)."""
        try:
            self.backend.shell.run(["rm", "-f", "--", f"{self.folder}/{CONNECTION_FILE}",
                                    f"{self.folder}/{API_FILE}"])
        except ProviderError:
            pass


def _helper_source() -> bytes:
    from importlib import resources

    return resources.files(__package__).joinpath("node_helper.py").read_bytes()


def _this_host() -> set[str]:
    names = {socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names
