"""Kernel profiles: the sizes an admin offers for interactive kernels on HPC backends.

A profile names a backend and what its kernel's batch job asks for (cores, memory, wall
time, partition, GPUs).  Each profile becomes one kernel spec in the JupyterLab launcher
("Python 3 on daint — 8 cores, 2 h").  Profiles are checked before anything is
submitted: an unknown one, a backend that cannot run interactive work, or sizes beyond
what the partition has are refused in one line naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from traitlets import Float, List
from traitlets.config import Configurable

from ...core.errors import ConfigError
from ...core.units import format_bytes, format_duration, parse_bytes, parse_duration
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
                "gpus", "account", "custom"}
#: what a user may choose in a custom size, and what a profile's ``custom`` bounds
CUSTOM_KEYS = ("cores", "memory", "time", "gpus")
#: the shortest wall time a custom size may ask for
MIN_TIME = 60.0
#: a custom size in a kernel spec's name: ``<profile's spec>--c4-t90m[-m8g][-g1]``
_SIZE = re.compile(r"^c(?P<cores>[1-9][0-9]{0,5})-t(?P<minutes>[1-9][0-9]{0,6})m"
                   r"(?:-m(?P<memory>[1-9][0-9]{0,7})(?P<unit>[mg]))?"
                   r"(?:-g(?P<gpus>[0-9]{1,3}))?$")
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

    reconnect_within = Float(
        600.0, help="Seconds the job of a notebook's kernel whose server was killed is kept "
                    "running: a server that starts that notebook's kernel (same profile and "
                    "size) meanwhile reconnects to it, with its variables; after it the job "
                    "is cancelled. 0: cancel it at once."
    ).tag(config=True)


@dataclass(frozen=True)
class CustomSize:
    """The sizes a user chose for one kernel, within what its profile's ``custom`` allows.

    It travels in the kernel spec's name (``…--c4-t90m-m8g``), so a notebook saved with
    such a kernel finds it again, and every start checks it again against the admin's
    bounds: a name or a kernel.json written by hand gets no more than the form would."""

    cores: int
    time: float  # seconds, whole minutes
    memory: int | None = None  # bytes, whole MiB
    gpus: int | None = None

    def token(self) -> str:
        out = f"c{self.cores}-t{int(self.time // 60)}m"
        if self.memory:
            mib = self.memory // 2**20
            out += f"-m{mib // 1024}g" if mib % 1024 == 0 else f"-m{mib}m"
        if self.gpus:
            out += f"-g{self.gpus}"
        return out

    def to_config(self) -> dict[str, Any]:
        # time as text: a bare number is minutes to parse_duration (as Slurm reads it)
        return {"cores": self.cores, "time": f"{int(self.time // 60)}m",
                "memory": self.memory, "gpus": self.gpus}


def parse_size(raw: Any, where: str = "") -> CustomSize:
    """A custom size from a form, a REST body or a provisioner's config: cores (1 or
    more), time (``90m``, ``1:30:00`` or minutes; whole minutes, at least 1), memory
    (``8GiB`` or bytes; whole MiB) and gpus, each refused in one line naming the field."""
    pre = f"{where}." if where else ""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'size'}: expected a mapping of {', '.join(CUSTOM_KEYS)}, "
                          f"got {raw!r}", field=where or "size")
    unknown = sorted(set(raw) - set(CUSTOM_KEYS))
    if unknown:
        raise ConfigError(f"{pre}{unknown[0]}: not a size; allowed: {', '.join(CUSTOM_KEYS)}",
                          field=f"{pre}{unknown[0]}")
    cores = raw.get("cores", 1)
    if not isinstance(cores, int) or isinstance(cores, bool) or not 1 <= cores <= 999999:
        raise ConfigError(f"{pre}cores: {cores!r} is not a core count; use 1 or more",
                          field=f"{pre}cores", value=cores)
    time_ = raw.get("time")
    if time_ is None:
        raise ConfigError(f"{pre}time: missing; give the wall time (e.g. 90m or 2h)",
                          field=f"{pre}time")
    seconds = parse_duration(time_, f"{pre}time")
    if not seconds or seconds < MIN_TIME or seconds % 60:
        raise ConfigError(f"{pre}time: {time_!r} is not a wall time in whole minutes of at "
                          "least 1 min", field=f"{pre}time", value=time_)
    memory = raw.get("memory")
    if memory is not None:
        memory = parse_bytes(memory, f"{pre}memory")
        if not memory or memory % 2**20:
            raise ConfigError(f"{pre}memory: {raw.get('memory')!r} is not a whole number of "
                              "MiB (e.g. 512MiB, 8GiB)", field=f"{pre}memory")
    gpus = raw.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool)
                             or not 0 <= gpus <= 999):
        raise ConfigError(f"{pre}gpus: {gpus!r} is not a GPU count", field=f"{pre}gpus",
                          value=gpus)
    return CustomSize(cores=cores, time=float(seconds), memory=memory or None,
                      gpus=gpus or None)


def split_spec_name(name: str) -> tuple[str, CustomSize | None]:
    """``cloudtik-hpc-daint-debug--c4-t90m`` -> (``cloudtik-hpc-daint-debug``, its size);
    a name without a well-formed size is returned whole, with None."""
    base, sep, token = name.rpartition("--")
    m = _SIZE.match(token) if sep and base else None
    if m is None:
        return name, None
    memory = None
    if m["memory"]:
        memory = int(m["memory"]) * 2**20 * (1024 if m["unit"] == "g" else 1)
    return base, CustomSize(cores=int(m["cores"]), time=int(m["minutes"]) * 60.0,
                            memory=memory, gpus=int(m["gpus"]) if m["gpus"] else None)


@dataclass(frozen=True)
class CustomBounds:
    """What a profile's ``custom`` lets users choose (None: only the partition bounds it)."""

    cores: int | None = None
    memory: int | None = None
    time: float | None = None
    gpus: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "memory": self.memory, "time": self.time,
                "gpus": self.gpus}


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
    #: the bounds of custom sizes of this profile; None: the profile's size only
    custom: CustomBounds | None = None
    #: set on a copy made by ``with_size``: the user's size in place of the profile's
    size: CustomSize | None = None
    #: offered by the hub's catalogue: the sidekick submits and reaches the kernel
    hub: bool = False

    @property
    def spec_name(self) -> str:
        """The kernel spec's name (a folder-safe word; a custom size is in it)."""
        base = f"cloudtik-{'hub' if self.hub else 'hpc'}-{self.backend}-{self.name}".lower()
        return f"{base}--{self.size.token()}" if self.size else base

    def title(self) -> str:
        """What the launcher shows: "Python 3 on daint — 8 cores, 2 h"."""
        if self.display_name and not self.size:
            return self.display_name
        sizes = [f"{self.cores} core{'s' if self.cores != 1 else ''}"]
        if self.gpus:
            sizes.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")
        if self.size and self.memory:
            sizes.append(format_bytes(self.memory))
        sizes.append(_hours(self.time))
        return f"Python 3 on {self.backend} — {', '.join(sizes)}"

    def with_size(self, size: CustomSize) -> Profile:
        """This profile at a user's size, refused in one line beyond the admin's bounds
        (the partition's own limits are checked at the start, as for every profile)."""
        bounds = self.custom
        if bounds is None:
            raise ConfigError(f"profile: '{self.name}' of backend '{self.backend}' offers no "
                              "custom sizes (its admin sets HPCKernels.profiles[].custom)",
                              field="profile", value=self.name)
        for key, value, limit, shown in (
                ("cores", size.cores, bounds.cores, str),
                ("memory", size.memory, bounds.memory, format_bytes),
                ("time", size.time, bounds.time, _hours),
                ("gpus", size.gpus, bounds.gpus if bounds.gpus is not None else self.gpus or 0,
                 str)):
            if value is not None and limit is not None and value > limit:
                raise ConfigError(f"{key}: {shown(value)} is more than profile '{self.name}' "
                                  f"allows (at most {shown(limit)})", field=key, value=value)
        return replace(self, cores=size.cores, time=size.time,
                       memory=size.memory if size.memory is not None else self.memory,
                       gpus=size.gpus, size=size)

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
        out: dict[str, Any] = {"backend": self.backend, "profile": self.name}
        if self.hub:
            out["hub"] = True
        if self.size:
            out["custom"] = self.size.to_config()
        return out


def _hours(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return format_duration(seconds)


def parse_profile(raw: Any, index: int, where: str | None = None) -> Profile:
    """One admin-written profile, checked field by field (one-line errors naming
    ``where``: the config's ``HPCKernels.profiles[i]`` or the hub catalogue's ``spec``)."""
    where = where or f"HPCKernels.profiles[{index}]"
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
                   display_name=raw.get("display_name") or None,
                   custom=_parse_bounds(raw.get("custom"), f"{where}.custom"))


def _parse_bounds(raw: Any, where: str) -> CustomBounds | None:
    """``custom``: false/absent (no custom sizes: the safe default), true (any size the
    partition has) or the largest of each: {cores, memory, time, gpus}."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return CustomBounds()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {raw!r} is neither true, false nor a mapping of "
                          f"{', '.join(CUSTOM_KEYS)}", field=where, value=raw)
    unknown = sorted(set(raw) - set(CUSTOM_KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: not a size; allowed: "
                          f"{', '.join(CUSTOM_KEYS)}", field=f"{where}.{unknown[0]}")
    cores, gpus = raw.get("cores"), raw.get("gpus")
    for key, value in (("cores", cores), ("gpus", gpus)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < (1 if key == "cores" else 0)):
            raise ConfigError(f"{where}.{key}: {value!r} is not a {key[:-1]} count",
                              field=f"{where}.{key}", value=value)
    memory = parse_bytes(raw["memory"], f"{where}.memory") if "memory" in raw else None
    time_ = parse_duration(raw["time"], f"{where}.time") if "time" in raw else None
    return CustomBounds(cores=cores, memory=memory or None, time=time_ or None, gpus=gpus)


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


def find_profile(profiles: list[Profile], backend: str, name: str,
                 size: CustomSize | None = None) -> Profile:
    """The profile a kernel runs with: the admin's, or the admin's at a custom size within
    its bounds.  Every way in (the spec manager, the REST form, the provisioner at each
    start) decides here."""
    for p in profiles:
        if p.backend == backend and p.name == name:
            return p.with_size(size) if size is not None else p
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
