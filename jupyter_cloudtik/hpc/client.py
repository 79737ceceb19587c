"""A blocking face of the job manager, for magics, the CLI and the ``Job`` API.

The manager is asynchronous and its poller is a task; here both live on a background
event loop thread (``session.LoopThread``), so the same calls work from a kernel (whose
main thread runs its own loop) and from the CLI.  One client per state folder and process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.operations import Event
from ..session import LoopThread
from .base import JobSpec, LogChunk, OutputFile
from .jobs import JobManager
from .models import JobInfo


class JobsClient:
    def __init__(self, settings=None, hpc=None, manager: JobManager | None = None) -> None:
        self._closed = False
        self.runner = LoopThread("cloudtik-hpc")
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

    def refresh(self, job_id: str) -> JobInfo:
        return self._run(self.manager.refresh(job_id))

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        return self.manager.events(job_id, after)

    # acting -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec, backend: str | None = None) -> JobInfo:
        return self._run(self.manager.submit(spec, backend))

    def cancel(self, job_id: str) -> JobInfo:
        return self._run(self.manager.cancel(job_id))

    def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job is final (Ctrl-C stops waiting, not the job)."""
        fut = asyncio.run_coroutine_threadsafe(self.manager.wait(job_id, timeout),
                                               self.runner.loop)
        try:
            while True:
                try:
                    return fut.result(timeout=0.1)  # short waits keep Ctrl-C responsive
                except concurrent.futures.TimeoutError:
                    continue
        finally:
            fut.cancel()

    def logs(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        return self._run(self.manager.logs(job_id, offset, limit))

    def follow_logs(self, job_id: str, offset: int = 0, poll: float = 0.5) -> Iterator[str]:
        """Log text as it is written, until the job has ended and everything was read."""
        while True:
            chunk = self.logs(job_id, offset)
            offset = chunk.offset
            if chunk.text:
                yield chunk.text
                continue
            if self.get(job_id).done:
                final = self.logs(job_id, offset)
                if final.text:
                    yield final.text
                return
            time.sleep(poll)

    def watch(self, job_id: str, after: int = 0) -> Iterator[Event]:
        """The job's events as they happen, until its operation ends."""
        op_id = self.get(job_id).op_id
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for ev in self.manager.ops.watch(op_id, after=after):
                    q.put(ev)
            except BaseException as e:
                q.put(e)
            finally:
                q.put(done)

        fut = asyncio.run_coroutine_threadsafe(pump(), self.runner.loop)
        try:
            while True:
                try:
                    item = q.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            fut.cancel()

    def outputs(self, job_id: str) -> list[OutputFile]:
        return self._run(self.manager.outputs(job_id))

    def read_file(self, job_id: str, name: str) -> bytes:
        return self._run(self.manager.read_file(job_id, name))

    def fetch(self, job_id: str, dest: str | Path | None = None,
              names: list[str] | None = None) -> list[Path]:
        return self._run(self.manager.fetch(job_id, dest, names))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.manager.close(), timeout=30)
        finally:
            self.runner.stop()


_clients: dict = {}
_lock = threading.Lock()


def get_jobs_client(settings=None) -> JobsClient:
    """The jobs client of this process: the Jupyter server's REST API inside a kernel the
    server started (``CLOUDTIK_API_URL`` set), else the job manager in process for the
    configured state folder."""
    import os

    from ..core.settings import default_settings
    from ..session import API_URL_ENV

    url = os.environ.get(API_URL_ENV)
    if url and settings is None:
        with _lock:
            if ("rest", url) not in _clients:
                from .rest import RestJobsClient

                _clients[("rest", url)] = RestJobsClient.from_environment()
            return _clients[("rest", url)]
    settings = settings or default_settings()
    key = str(settings.state_dir)
    with _lock:
        if key not in _clients:
            _clients[key] = JobsClient(settings=settings)
        return _clients[key]


def forget_clients() -> None:
    """Close every cached client (tests, and processes switching state folders)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for c in clients:
        c.close()
