"""Backends that fail on purpose: the real ones (local, Slurm, FirecREST, ARC), each with a
few faults a test switches on, installed as backend types through a real entry point.

Fault injection for the job manager's poller (the code under test), which meets them
exactly as it meets any backend plugin.  Faults, by job name (``faults:`` in the config):

* ``submit``: ``submit`` raises an unexpected error (a library's surprise, not a refusal);
* ``poll``: ``poll`` raises an unexpected error whenever the job is among those asked about;
* ``state``: ``poll`` answers a state that is no job state for the job.

``down = True`` on the backend object makes every call to the system raise
``BackendUnavailable`` (an outage) until it is set back.  ``calls`` counts what was asked,
by (method, job name).  ``shared_filesystem: false`` makes the local backend stage inputs
and results through the session, as a remote system does.
"""

from __future__ import annotations

import collections
import copy
from pathlib import Path
from typing import Any

from jupyter_cloudtik.core.errors import BackendUnavailable
from jupyter_cloudtik.hpc.arc import ArcBackend
from jupyter_cloudtik.hpc.base import JobRef, JobStatus, Submission
from jupyter_cloudtik.hpc.firecrest import FirecrestBackend
from jupyter_cloudtik.hpc.local import LocalBackend
from jupyter_cloudtik.hpc.slurm import SlurmBackend

GROUP = "jupyter_cloudtik.hpc_backends"


class InjectedFault(RuntimeError):
    """What a faulty backend raises: nothing a backend is expected to raise."""


class Faults:
    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        faults = self.config.get("faults") or {}
        self.fail_submit = set(faults.get("submit", ()))
        self.fail_poll = set(faults.get("poll", ()))
        self.bad_state = set(faults.get("state", ()))
        self.down = False
        self.calls: collections.Counter = collections.Counter()
        self.names: dict[str, str] = {}  # our job id -> the job's name
        if "shared_filesystem" in self.config:
            self.shares_local_filesystem = bool(self.config["shared_filesystem"])

    def _outage(self) -> None:
        if self.down:
            raise BackendUnavailable("injected outage: the system does not answer")

    def submit(self, sub: Submission) -> str:
        self.names[sub.job_id] = sub.name
        self.calls["submit", sub.name] += 1
        self._outage()
        if sub.name in self.fail_submit:
            raise InjectedFault(f"injected fault: submit of {sub.name!r}")
        return super().submit(sub)

    def validate(self, spec) -> None:  # the system's limits: asked of the system
        self._outage()
        return super().validate(spec)

    def find(self, token: str, job_id: str) -> str | None:
        self.calls["find", self.names.get(job_id)] += 1
        self._outage()
        return super().find(token, job_id)

    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        names = [self.names.get(j.id) for j in jobs]
        self.calls["poll", None] += 1
        for n in names:
            self.calls["poll", n] += 1
        self._outage()
        bad = sorted(n for n in names if n in self.fail_poll)
        if bad:
            raise InjectedFault(f"injected fault: poll of {bad[0]!r}")
        out = super().poll(jobs)
        for j, n in zip(jobs, names, strict=True):
            if n in self.bad_state and j.native_id in out:
                out[j.native_id] = JobStatus("bogus", "BOGUS")
        return out

    def cancel(self, job: JobRef) -> None:
        self.calls["cancel", self.names.get(job.id)] += 1
        self._outage()
        super().cancel(job)


def _with_faults(base: type) -> type:
    schema = copy.deepcopy(base.config_schema)
    props = schema.setdefault("properties", {})
    props["type"] = {"type": "string"}
    props["faults"] = {"type": "object"}
    props.setdefault("shared_filesystem", {"type": "boolean"})
    return type(f"Faulty{base.__name__}", (Faults, base),
                {"config_schema": schema, "__module__": __name__})


FaultyLocalBackend = _with_faults(LocalBackend)
FaultySlurmBackend = _with_faults(SlurmBackend)
FaultyFirecrestBackend = _with_faults(FirecrestBackend)
FaultyArcBackend = _with_faults(ArcBackend)
TYPES = {"faulty_local": FaultyLocalBackend, "faulty_slurm": FaultySlurmBackend,
         "faulty_firecrest": FaultyFirecrestBackend, "faulty_arc": FaultyArcBackend}


def write_distribution(root: Path) -> Path:
    """A distribution declaring the faulty types as backend plugins (entry points), for
    ``root`` on ``sys.path``; this module is already imported under its own name."""
    info = root / "cloudtik_faulty_backends-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cloudtik-faulty-backends\n"
                                   "Version: 0.1\n")
    lines = [f"{name} = {cls.__module__}:{cls.__name__}" for name, cls in TYPES.items()]
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + "\n".join(lines) + "\n")
    return root
