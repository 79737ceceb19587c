"""HPC jobs: notebooks and commands sent to local processes, Slurm, FirecREST, ARC or Dask.

``from jupyter_cloudtik.hpc import Job``; ``%hpc submit NOTEBOOK``; ``jupyter cloudtik jobs``.
See docs/hpc.md.
"""

from __future__ import annotations

__all__ = ["Job", "JobInfo", "JobManager", "JobSpec", "Sweep", "record"]


def __getattr__(name: str):
    # keep `import jupyter_cloudtik.hpc` light: the client and its loop start only when used
    if name == "Job":
        from .api import Job  # deferred: start-up (hpc.api ~127 ms, loads asyncio, psutil)

        return Job
    if name == "Sweep":
        from .api import Sweep  # deferred: start-up (hpc.api ~127 ms, loads asyncio, psutil)

        return Sweep
    if name == "record":
        from .recording import record  # deferred: start-up (hpc.recording ~11 ms)

        return record
    if name == "JobManager":
        # deferred: start-up (hpc.jobs ~122 ms, loads asyncio, concurrent.futures)
        from .jobs import JobManager

        return JobManager
    if name == "JobSpec":
        from .base import JobSpec  # deferred: start-up (hpc.base ~28 ms)

        return JobSpec
    if name == "JobInfo":
        from .models import JobInfo  # deferred: start-up (hpc.models ~29 ms)

        return JobInfo
    raise AttributeError(name)
