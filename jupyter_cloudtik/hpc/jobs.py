"""JobManager: submit, watch, cancel and collect HPC jobs, recorded in the state store.

A job is a row in ``hpc_jobs`` (the record: state, the backend's own state, why) plus an
operation (kind ``hpc.job``) whose events tell its story: recorded, inputs staged,
submitted, queued, running, results copied, done.  Both live in the state database, so a
job survives the kernel, the server and the CLI that started it.

Submitting is idempotent.  The client token and the attempt are recorded *before* the
backend is called; if the call's fate is unknown (the process died, the backend did not
answer), the next attempt first asks the backend for a job carrying that token and adopts
it, so no job ever runs twice.  A backend that is down leaves its jobs ``unknown`` with the
reason (one event when it stops answering, one when it answers again), and they recover by
themselves when it answers again.  Each job is kept apart: an unexpected error while
submitting, staging in, polling or staging out one job fails that job alone, with the
stage and the cause in one line, and the others go on.

One background poller per state folder (a lease in the database decides which process
runs it) asks each backend about all of its active jobs in one call per interval; the
interval starts short after anything changed and backs off while nothing does, and
backs off further while the backend does not answer.

``JobManager`` is assembled from one part per job of its own: ``job_records`` (the table
and its rows), ``job_content`` (files sent as content), ``job_submit`` (checks, plan,
submission), ``job_stage`` (stage-in and stage-out through the stagers), ``job_results``
(logs, outputs, fetch, finalizing), ``job_cancel`` and ``job_poller`` (the poller, its
lease and adoption, each job's isolation).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core import locations as locs
from ..core.errors import ProviderError
from ..core.identity import ActsForUser, os_user
from ..core.operations import Operations
from ..core.secrets import SecretStore
from ..core.settings import CloudTik, default_settings
from ..core.store import Store
from .base import HPCBackend
from .job_cancel import JobCancel
from .job_content import JobContent
from .job_content import _notebook_json as _notebook_json
from .job_poller import LEASE_STALE_SECONDS as LEASE_STALE_SECONDS
from .job_poller import JobPoller
from .job_records import CANCEL_ASKED as CANCEL_ASKED
from .job_records import CANCEL_SENT as CANCEL_SENT
from .job_records import HPC_MIGRATIONS as HPC_MIGRATIONS
from .job_records import STAGE_IN as STAGE_IN
from .job_records import STAGE_OUT as STAGE_OUT
from .job_records import STAGE_POLL as STAGE_POLL
from .job_records import STAGE_SUBMIT as STAGE_SUBMIT
from .job_records import JobRecords
from .job_records import describe_error as describe_error
from .job_results import JobResults
from .job_stage import JobStaging
from .job_submit import JobSubmit
from .settings import HPC, BackendRegistry, hpc_settings
from .staging import (
    LocalStager,
    Stagers,
)
from .storage_stager import storage_stager
from .sweeps import advance_sweeps  # sweeps sit on top of jobs

log = logging.getLogger("jupyter_cloudtik.hpc")


class JobManager(JobSubmit, JobContent, JobStaging, JobResults, JobCancel, JobPoller,
                 JobRecords, ActsForUser):
    """Jobs of one state folder; one per process is typical (faces share it)."""

    async def _after_round(self) -> None:
        await advance_sweeps(self)

    def __init__(self, settings: CloudTik | None = None, hpc: HPC | None = None,
                 store: Store | None = None, user: str | None = None,
                 stagers: Stagers | None = None,
                 locations: locs.LocationPolicy | None = None) -> None:
        self.settings = settings or default_settings()
        # what local paths callers may name (core.locations): the faces set theirs
        self.locations: locs.LocationPolicy = locations or locs.InProcess()
        self.hpc = hpc or hpc_settings()
        self.store = store or Store(self.settings.state_dir)
        self.store.ensure_schema("hpc", HPC_MIGRATIONS)
        self.secrets = SecretStore(self.store)
        # a job's reason and events may quote what a system or a copy answered, which can
        # hold a credential of this store: every one is redacted before it is kept
        self.redact = self.secrets.live_redactor()
        self.ops = Operations(self.store, redact=self.redact)
        self.user = user or os_user()
        if stagers is None:
            stagers = Stagers([LocalStager()])
            storage = storage_stager(self.settings, self.store)
            if storage is not None:
                stagers.add(storage)
        self.stagers = stagers
        self.registry = BackendRegistry(self.hpc, self.store.state_dir, self.secrets, log,
                                        self.settings)
        self._submitting: set[str] = set()
        self._finishing: set[str] = set()  # jobs whose crate is being written (_finish)
        self._tasks: set[asyncio.Task] = set()
        self._due: dict[str, float] = {}
        self._interval: dict[str, float] = {}
        self._retry: dict[str, float] = {}
        self._last_error: dict[str, str] = {}
        # jobs whose failure could not even be recorded: left alone by this process
        self._broken: dict[str, str] = {}
        self._backend_locks: dict[str, asyncio.Lock] = {}
        self._poller: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._holding_lease = False
        self._closed = False

    # backends -------------------------------------------------------------------------------
    def backends(self) -> list[dict[str, Any]]:
        return self.registry.describe()

    def backend(self, name: str | None) -> HPCBackend:
        return self.registry.get(name)

    # life cycle -------------------------------------------------------------------------------
    async def close(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except BaseException:
                pass
        await asyncio.to_thread(self._release_lease)
        await asyncio.to_thread(self.registry.close)


__all__ = ["JobManager", "ProviderError"]
