"""Cancelling a job: at once when its backend answers; recorded and carried out by the
poller when it does not, or while the job is still being submitted.
"""

from __future__ import annotations

import asyncio
import logging

from ..core.errors import BackendUnavailable
from .base import FINAL_STATES
from .job_records import (
    CANCEL_ASKED,
    CANCEL_SENT,
    STAGE_SUBMIT,
    _ref,
    describe_error,
)
from .models import JobInfo

log = logging.getLogger("jupyter_cloudtik.hpc")



class JobCancel:
    """Cancelling jobs (a part of ``JobManager``)."""

    # actions ------------------------------------------------------------------------------
    async def cancel(self, job_id: str) -> JobInfo:
        """Cancel the job.  While its backend does not answer, the request is recorded
        (an event says so at once) and carried out by the poller when it answers."""
        row = self._row(job_id)
        job_id = row["id"]
        if row["state"] in FINAL_STATES:
            return self._info(row)
        if row["cancel_requested"] != CANCEL_SENT:
            self._update(job_id, cancel_requested=CANCEL_ASKED)
        self.ops.emit(row["op_id"], "cancel", "cancellation requested")
        down = row["unavailable_since"] is not None  # not asked again: the poller retries
        if not row["native_id"]:
            if not down and job_id not in self._submitting and not self._owned_elsewhere(row):
                # finds a half-submitted job and cancels it, or records the cancel
                await self._isolated(job_id, STAGE_SUBMIT, self._submit(job_id))
                row = self._row(job_id)
                if row["cancel_requested"] == CANCEL_SENT and row["state"] not in FINAL_STATES:
                    await self._poll_backend(row["backend"], force=True)
        elif not down:
            await self._cancel_native(job_id)
        row = self._row(job_id)
        if row["state"] not in FINAL_STATES and row["cancel_requested"] == CANCEL_ASKED \
                and row["unavailable_since"] is not None:
            self.ops.emit(row["op_id"], "cancel",
                          f"cancel requested; backend '{row['backend']}' is unavailable, the "
                          "job will be cancelled when it answers", level="warning",
                          data={"pending": True})
        return self.get(job_id)

    async def _cancel_native(self, job_id: str) -> None:
        row = self._row(job_id)
        if await self._send_cancel(row):
            await self._poll_backend(row["backend"], force=True)

    async def _send_cancel(self, row) -> bool:
        """Ask the backend to cancel a submitted job; False if it did not answer (the
        request stays recorded and the poller carries it out when it answers).  A refusal
        is raised."""
        be = self.registry.get(row["backend"])
        try:
            await asyncio.to_thread(be.cancel, _ref(row))
        except BackendUnavailable as e:
            self._mark_unreachable([row], row["backend"], e)
            return False
        self._update(row["id"], cancel_requested=CANCEL_SENT)
        return True

    async def _cancel_quietly(self, job_id: str, stage: str) -> None:
        try:
            row = self._row(job_id)
            if not row["native_id"]:
                return
            await asyncio.to_thread(self.registry.get(row["backend"]).cancel, _ref(row))
            self.ops.emit(row["op_id"], "cancel", f"asked the backend to cancel the job: its "
                          f"{stage} failed, so it can no longer be followed", level="warning")
        except Exception as e:
            log.info("job %s: cannot cancel it after its %s failed: %s", job_id, stage,
                     describe_error(e))

    async def _deliver_cancel(self, row, announce: str | None = None) -> bool:
        """Carry out a cancel asked for earlier (while the backend did not answer, or
        while the job was being submitted); a refusal is said once, not retried."""
        try:
            sent = await self._send_cancel(row)
        except Exception as e:  # the backend refuses (the job is ending): say it, once
            self._update(row["id"], cancel_requested=CANCEL_SENT)
            self.ops.emit(row["op_id"], "cancel", f"the backend did not cancel the job: "
                          f"{describe_error(e)}", level="warning")
            return True
        if sent and announce:
            self.ops.emit(row["op_id"], "cancel", announce)
        return sent
