"""HPC jobs: notebooks and commands sent to local processes, Slurm, FirecREST, ARC or Dask.

``from jupyter_cloudtik.hpc import Job``; ``%hpc submit NOTEBOOK``; ``jupyter cloudtik jobs``.
See docs/hpc.md.
"""

from __future__ import annotations

__all__ = ["Job", "JobInfo", "JobManager", "JobSpec", "Sweep", "record"]


def __getattr__(name: str):
    # keep `import jupyter_cloudtik.hpc` light: the client and its loop start only when used
    if name == "Job":
        from .api import Job

        return Job
    if name == "Sweep":
        from .api import Sweep

        return Sweep
    if name == "record":
        from .recording import record

        return record
    if name == "JobManager":
        from .jobs import JobManager

        return JobManager
    if name == "JobSpec":
        from .base import JobSpec

        return JobSpec
    if name == "JobInfo":
        from .models import JobInfo

        return JobInfo
    raise AttributeError(name)
