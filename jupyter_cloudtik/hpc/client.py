"""A blocking face of the job manager, for magics, the CLI and the ``Job`` API.

The manager is asynchronous and its poller is a task; here both live on the process's
one loop thread (``core.bridge``, shared with the cluster and storage faces), so the
same calls work from a kernel (whose main thread runs its own loop) and from the CLI.
One client per state folder and process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.bridge import blocking, bridge, choose_client
from ..core.bridge import forget_clients as _forget
from ..core.operations import Event
from .base import JobSpec, LogChunk, follow_logs
from .jobs import JobManager
from .models import JobInfo
from .sweeps import SweepInfo, sweeps_of


class JobsClient:
    def __init__(self, settings=None, hpc=None, manager: JobManager | None = None) -> None:
        self._closed = False
        self.runner = bridge()
        self.manager = manager or JobManager(settings=settings, hpc=hpc)
        self.runner.run(self._start())

    async def _start(self) -> None:
        self.manager.ensure_poller()

    def _run(self, coro, timeout: float | None = None):
        return self.runner.run(coro, timeout)

    # reading ------------------------------------------------------------------------------
    def backends(self) -> list[dict[str, Any]]:
        return self.manager.backends()

    def get(self, job_id: str) -> JobInfo:
        return self.manager.get(job_id)

    def list(self, active_only: bool = False, backend: str | None = None,
             limit: int = 100) -> list[JobInfo]:
        return self.manager.list(active_only=active_only, backend=backend, limit=limit)

    def run_tick(self) -> None:
        """Ask every backend with active jobs now (one poll each)."""
        self._run(self.manager.tick(force=True))

    refresh = blocking("refresh")

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        return self.manager.events(job_id, after)

    # acting -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec, backend: str | None = None) -> JobInfo:
        return self._run(self.manager.submit(spec, backend))

    cancel = blocking("cancel")

    def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job is final (Ctrl-C stops waiting, not the job)."""
        return self.runner.run(self.manager.wait(job_id, timeout))

    def logs(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        return self._run(self.manager.logs(job_id, offset, limit))

    def follow_logs(self, job_id: str, offset: int = 0, poll: float = 0.5) -> Iterator[str]:
        """Log text as it is written, until the job has ended and everything was read."""
        return follow_logs(lambda at: self.logs(job_id, at), lambda: self.get(job_id).done,
                           offset, poll)

    def watch(self, job_id: str, after: int = 0) -> Iterator[Event]:
        """The job's events as they happen, until its operation ends."""
        op_id = self.get(job_id).op_id
        return self.runner.iterate(lambda: self.manager.ops.watch(op_id, after=after))

    outputs = blocking("outputs")
    read_file = blocking("read_file")

    def fetch(self, job_id: str, dest: str | Path | None = None,
              names: list[str] | None = None) -> list[Path]:
        return self._run(self.manager.fetch(job_id, dest, names))

    # sweeps --------------------------------------------------------------------------------
    @property
    def sweeps(self):
        return sweeps_of(self.manager)

    def sweep(self, spec: JobSpec, backend: str | None = None, *,
              grid: dict[str, list[Any]] | None = None, zip: dict[str, list[Any]] | None = None,
              elements: list[dict[str, Any]] | None = None,
              max_concurrent: int | None = None) -> SweepInfo:
        return self._run(self.sweeps.submit(spec, backend, grid=grid, zip=zip,
                                            elements=elements, max_concurrent=max_concurrent))

    def get_sweep(self, sweep_id: str) -> SweepInfo:
        return self.sweeps.get(sweep_id)

    def list_sweeps(self, limit: int = 100) -> list[SweepInfo]:
        return self.sweeps.list(limit=limit)

    def cancel_sweep(self, sweep_id: str, element: int | None = None) -> SweepInfo:
        return self._run(self.sweeps.cancel(sweep_id, element))

    def retry_sweep(self, sweep_id: str) -> SweepInfo:
        return self._run(self.sweeps.retry(sweep_id))

    def sweep_results(self, sweep_id: str) -> list[dict[str, Any]]:
        return self._run(self.sweeps.results(sweep_id))

    def wait_sweep(self, sweep_id: str, timeout: float | None = None) -> SweepInfo:
        return self.runner.run(self.sweeps.wait(sweep_id, timeout))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # its poller and backends end; the bridge is the process's and stays
        self._run(self.manager.close(), timeout=30)


def get_jobs_client(settings=None) -> JobsClient:
    """The jobs client of this process: the Jupyter server's REST API inside a kernel the
    server started (``CLOUDTIK_API_URL`` set), else the job manager in process for the
    configured state folder."""

    def rest():
        # deferred: start-up (hpc.rest ~48 ms, loads requests, urllib3)
        from .rest import RestJobsClient

        return RestJobsClient.from_environment()

    return choose_client("jobs", rest, lambda s: JobsClient(settings=s), settings)


def forget_clients() -> None:
    """Close every cached jobs client (tests, and processes switching state folders)."""
    for c in _forget("jobs"):
        c.close()
