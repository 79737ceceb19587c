"""Kernel profiles: the sizes an admin offers for interactive kernels on HPC backends.

A profile names a backend and what its kernel's batch job asks for (cores, memory, wall
time, partition, GPUs).  Each profile becomes one kernel spec in the JupyterLab launcher
("Python 3 on daint — 8 cores, 2 h").  Profiles are checked before anything is
submitted: an unknown one, a backend that cannot run interactive work, or sizes beyond
what the partition has are refused in one line naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from traitlets import Float, List
from traitlets.config import Configurable

from ...core.errors import ConfigError
from ...core.units import format_duration, parse_bytes, parse_duration
from ..base import JobAttributes, JobSpec, ResourceSpec

#: backend types whose jobs a kernel can run in, and why the others cannot
INTERACTIVE_TYPES = ("slurm",)
NOT_INTERACTIVE = {
    "firecrest": "FirecREST runs batch jobs through its REST API and offers no way to reach "
                 "a port on the compute node",
    "arc": "ARC (A-REX) runs batch jobs through its REST API and offers no way to reach a "
           "port on the compute node",
    "local": "the local backend runs on this machine: use the ordinary Python kernel",
    "dask": "a Dask cluster runs tasks, not a kernel",
}
PROFILE_KEYS = {"name", "backend", "display_name", "cores", "memory", "time", "partition",
                "gpus", "account"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class HPCKernels(Configurable):
    """Interactive kernels on HPC backends (docs/hpc.md, "Interactive kernels")."""

    profiles = List(
        default_value=[],
        help="Kernel profiles: [{name, backend, cores, memory, time, partition, gpus, "
             "account, display_name}], e.g. {'name': 'small', 'backend': 'daint', "
             "'cores': 8, 'time': '2h'}. Each is a kernel spec in the launcher; only "
             "Slurm backends (on this machine or over SSH) can run them.",
    ).tag(config=True)

    poll_interval = Float(
        2.0, help="Seconds between two looks at a kernel's batch job (squeue)."
    ).tag(config=True)

    start_timeout = Float(
        3600.0, help="Longest wait for a kernel's job to start and its kernel to answer, "
                     "queue time included; after it the job is cancelled."
    ).tag(config=True)

    warn_before = Float(
        300.0, help="Seconds before the wall time ends when the kernel warns (in the "
                    "notebook's output and the server log) that it will be stopped."
    ).tag(config=True)


@dataclass
class Profile:
    """One kernel size on one backend."""

    name: str
    backend: str
    cores: int = 1
    memory: int | None = None  # bytes
    time: float = 3600.0  # seconds of wall time
    partition: str | None = None
    gpus: int | None = None
    account: str | None = None
    display_name: str | None = None

    @property
    def spec_name(self) -> str:
        """The kernel spec's name (a folder-safe word)."""
        return f"cloudtik-hpc-{self.backend}-{self.name}".lower()

    def title(self) -> str:
        """What the launcher shows: "Python 3 on daint — 8 cores, 2 h"."""
        if self.display_name:
            return self.display_name
        sizes = [f"{self.cores} core{'s' if self.cores != 1 else ''}"]
        if self.gpus:
            sizes.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")
        sizes.append(_hours(self.time))
        return f"Python 3 on {self.backend} — {', '.join(sizes)}"

    def job_spec(self) -> JobSpec:
        """The batch job's sizes as the backends' limit checks read them."""
        return JobSpec(name=f"kernel-{self.name}", command=["ipykernel"],
                       resources=ResourceSpec(node_count=1, processes_per_node=1,
                                              cpu_cores_per_process=self.cores,
                                              memory=self.memory, gpus_per_node=self.gpus),
                       attributes=JobAttributes(duration=self.time,
                                                queue_name=self.partition,
                                                account=self.account))

    def to_config(self) -> dict[str, Any]:
        return {"backend": self.backend, "profile": self.name}


def _hours(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return format_duration(seconds)


def parse_profile(raw: Any, index: int) -> Profile:
    """One admin-written profile, checked field by field (one-line errors)."""
    where = f"HPCKernels.profiles[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}", field=where)
    unknown = sorted(set(raw) - PROFILE_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: not a profile field; allowed: "
                          f"{', '.join(sorted(PROFILE_KEYS))}", field=f"{where}.{unknown[0]}")
    name, backend = raw.get("name"), raw.get("backend")
    for key, value in (("name", name), ("backend", backend)):
        if not isinstance(value, str) or not _NAME.match(value):
            raise ConfigError(f"{where}.{key}: {value!r} is not a name (letters, digits, "
                              "'.', '_', '-')", field=f"{where}.{key}", value=value)
    cores = raw.get("cores", 1)
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        raise ConfigError(f"{where}.cores: {cores!r} is not a core count; use 1 or more",
                          field=f"{where}.cores", value=cores)
    gpus = raw.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise ConfigError(f"{where}.gpus: {gpus!r} is not a GPU count", field=f"{where}.gpus")
    memory = raw.get("memory")
    if memory is not None:
        memory = parse_bytes(memory, f"{where}.memory")
    seconds = parse_duration(raw.get("time", "1h"), f"{where}.time")
    return Profile(name=name, backend=backend, cores=cores, memory=memory,
                   time=seconds or 3600.0, partition=raw.get("partition") or None,
                   gpus=gpus or None, account=raw.get("account") or None,
                   display_name=raw.get("display_name") or None)


def parse_profiles(raw: list[Any]) -> list[Profile]:
    out, seen = [], set()
    for i, item in enumerate(raw or []):
        p = parse_profile(item, i)
        if (p.backend, p.name) in seen:
            raise ConfigError(f"HPCKernels.profiles[{i}].name: {p.name!r} is given twice for "
                              f"backend '{p.backend}'", field=f"HPCKernels.profiles[{i}].name")
        seen.add((p.backend, p.name))
        out.append(p)
    return out


def find_profile(profiles: list[Profile], backend: str, name: str) -> Profile:
    for p in profiles:
        if p.backend == backend and p.name == name:
            return p
    known = sorted(p.name for p in profiles if p.backend == backend)
    raise ConfigError(f"profile: unknown profile '{name}' for backend '{backend}'; "
                      f"configured: {', '.join(known) or 'none'}", field="profile", value=name)


def check_interactive(backend_name: str, backend_type: str) -> None:
    """Refuse, in one line, a backend whose jobs a kernel cannot be reached in."""
    if backend_type in INTERACTIVE_TYPES:
        return
    why = NOT_INTERACTIVE.get(backend_type, "its system offers no way to reach the kernel")
    raise ConfigError(
        f"backend: '{backend_name}' ({backend_type}) cannot run interactive kernels: {why}; "
        f"allowed: backends of type {', '.join(INTERACTIVE_TYPES)}", field="backend",
        value=backend_name)
