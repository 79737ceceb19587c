"""Commands on a system whose API runs none (FirecREST, ARC), as small batch jobs: what
``environment`` asks such a system (its Python), through the backend's own calls.

Why a module of its own: it submits jobs, so it needs the job types (``base``) and the
job script (``script``), while ``base`` needs ``environment``; here, below neither, it
closes no circle (``scripts/import_graph.py``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..core.errors import ProviderError
from ..transport.shell import Result
from . import script
from .base import Environment, JobRef, JobSpec, Submission
from .environment import JOB_RUN_TIMEOUT

__all__ = ["JobShell"]


class JobShell:
    """Commands on a system whose API runs none (FirecREST, ARC): each ``run`` is a small
    batch job submitted, polled and read through the backend's own calls, and waited for
    (up to ``JOB_RUN_TIMEOUT``: it may queue).  Used to ask the system's Python once
    (``find_python``; the answer is kept for a day, see ``system_python``)."""

    runs_by_job = True

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.where = f"backend '{backend.name}'"

    def run(self, argv: list[str], input: bytes | None = None, timeout: float = 60.0,
            cwd: str | None = None) -> Any:
        be = self.backend
        job_id = f"cloudtik-env-{uuid.uuid4().hex[:12]}"
        spec = JobSpec(name="cloudtik-env-probe", command=list(argv))
        sub = Submission(job_id, job_id, spec, Environment(python="python3"))
        native = be.submit(sub)
        ref = JobRef(job_id, native)
        deadline = time.monotonic() + max(timeout, JOB_RUN_TIMEOUT)
        status = None
        try:
            while time.monotonic() < deadline:
                status = be.poll([ref]).get(native)
                if status is not None and status.final:
                    break
                time.sleep(2.0)
            else:
                be.cancel(ref)
                raise ProviderError(
                    f"environment: the job that asks {self.where} for its Python did not "
                    f"end within {max(timeout, JOB_RUN_TIMEOUT):.0f} s (queued?); name the "
                    "system's Python with environment.base_python and try again")
            try:
                out = be.read_file(ref, script.LOG_NAME).decode(errors="replace")
            except Exception:  # no log: the status says what happened
                out = ""
        finally:
            try:
                be.clean(ref)
            except Exception:  # best effort: a leftover folder of a finished probe
                pass
        rc = status.exit_code if status.exit_code is not None else (
            0 if status.state == "succeeded" else 1)
        return Result(rc, out, "" if rc == 0 else (status.message or out[-500:]))
