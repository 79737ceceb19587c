"""The background poller: one per state folder (a lease row, ``hpc_poller``, decides which
process runs it; the first holder adopts the active jobs' operations), one poll per
backend per interval for all its jobs, backing off while nothing changes or the backend
does not answer; each job kept apart (an unexpected error fails that job alone).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

from ..core.errors import (
    BackendUnavailable,
    CloudTikError,
    NotFoundError,
    ProviderError,
)
from ..core.operations import _process_start_time, owner_alive
from .base import (
    ACTIVE_STATES,
    FAILED,
    FINAL_STATES,
    QUEUED,
    RUNNING,
    STATES,
    UNKNOWN,
    CredentialsExpired,
    HPCBackend,
    JobStatus,
)
from .job_records import (
    CANCEL_ASKED,
    STAGE_OUT,
    STAGE_POLL,
    STAGE_SUBMIT,
    _held,
    _how_long,
    _ref,
    describe_error,
)
from .models import JobInfo

log = logging.getLogger("jupyter_cloudtik.hpc")


LEASE_STALE_SECONDS = 30.0


class JobPoller:
    """Polling, the lease and adoption, one job's isolation (a part of ``JobManager``)."""

    async def refresh(self, job_id: str) -> JobInfo:
        """Ask the backend now (not waiting for the next poll) and return the job."""
        row = self._row(job_id)
        if row["state"] not in FINAL_STATES:
            await self._poll_backend(row["backend"], force=True)
        return self.get(row["id"])

    async def wait(self, job_id: str, timeout: float | None = None,
                   poll: float = 0.1) -> JobInfo:
        """Until the job is final (another process may be the one polling)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job_id = self._row(job_id)["id"]
        self.ensure_poller()
        while True:
            info = self.get(job_id)
            if info.done:
                return info
            if deadline is not None and time.monotonic() > deadline:
                return info
            await asyncio.sleep(poll)

    # polling --------------------------------------------------------------------------------
    def ensure_poller(self) -> None:
        """Start the background poller on the running loop (idempotent)."""
        if self._closed:
            return
        if self._poller is not None and not self._poller.done():
            return
        self._wakeup = asyncio.Event()
        self._poller = asyncio.get_running_loop().create_task(self._poll_loop())

    def _wake(self, backend: str | None = None) -> None:
        if backend is not None:
            self._due[backend] = 0.0
            self._interval[backend] = self.hpc.poll_interval
        if self._wakeup is not None:
            self._wakeup.set()

    async def _poll_loop(self) -> None:
        while not self._closed:
            holding = False
            try:
                holding = await asyncio.to_thread(self._take_lease)
                if holding:
                    await self.tick()
            except Exception:  # the poller must survive anything a backend does
                log.exception("HPC poller tick failed")
            now = time.monotonic()
            if holding:
                due = [d for b, d in self._due.items() if self._has_active(b)]
                wait = min([max(0.02, d - now) for d in due], default=2.0)
                wait = min(wait, 2.0)
            else:
                wait = 2.0
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def _has_active(self, backend: str) -> bool:
        return self.store.query_one(
            f"SELECT 1 FROM hpc_jobs WHERE backend = ? AND state IN "
            f"({','.join('?' * len(ACTIVE_STATES))}) LIMIT 1", (backend, *ACTIVE_STATES)
        ) is not None

    def _take_lease(self) -> bool:
        """Hold the poller lease of this state folder; the first holder adopts the jobs."""
        pid, host = os.getpid(), socket.gethostname()
        now = time.time()
        if self._holding_lease:  # a cheap read while ours and fresh: no write every tick
            row = self.store.query_one("SELECT * FROM hpc_poller WHERE id = 1")
            if row is not None and row["owner_pid"] == pid and row["owner_host"] == host \
                    and now - row["heartbeat"] < LEASE_STALE_SECONDS / 3:
                return True
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM hpc_poller WHERE id = 1").fetchone()
            mine = row is not None and row["owner_pid"] == pid and row["owner_host"] == host
            if row is not None and not mine:
                stale = now - row["heartbeat"] > LEASE_STALE_SECONDS
                if owner_alive(row["owner_pid"], row["owner_host"], row["owner_started"]) \
                        and not stale:
                    self._holding_lease = False
                    return False

            conn.execute(
                "INSERT INTO hpc_poller (id, owner_pid, owner_host, owner_started, heartbeat)"
                " VALUES (1, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET owner_pid ="
                " excluded.owner_pid, owner_host = excluded.owner_host, owner_started ="
                " excluded.owner_started, heartbeat = excluded.heartbeat",
                (pid, host, _process_start_time(pid), now))
        if not self._holding_lease:
            self._holding_lease = True
            self._adopt_active()
        return True

    def _release_lease(self) -> None:
        try:
            with self.store.transaction() as conn:
                conn.execute("DELETE FROM hpc_poller WHERE id = 1 AND owner_pid = ? AND"
                             " owner_host = ?", (os.getpid(), socket.gethostname()))
        except Exception:
            pass
        self._holding_lease = False

    def _adopt_active(self) -> None:
        for row in self.store.query(
                f"SELECT id, op_id, backend FROM hpc_jobs WHERE state IN "
                f"({','.join('?' * len(ACTIVE_STATES))})", ACTIVE_STATES):
            if self.ops.adopt(row["op_id"], "the job is watched by this process now"):
                self._due[row["backend"]] = 0.0

    def _owned_elsewhere(self, row) -> bool:
        """Is another live process submitting this job right now?"""
        try:
            op = self.ops.get(row["op_id"])
        except NotFoundError:
            return False
        if op.owner_pid == os.getpid():
            return False
        prow = self.store.query_one("SELECT owner_host, owner_started FROM operations"
                                    " WHERE id = ?", (op.id,))
        return op.state in ("pending", "running") and owner_alive(
            op.owner_pid, prow["owner_host"], prow["owner_started"])

    async def tick(self, force: bool = False) -> None:
        """One round: each backend whose turn it is gets one poll for all its jobs."""
        backends = [r[0] for r in self.store.query(
            f"SELECT DISTINCT backend FROM hpc_jobs WHERE state IN "
            f"({','.join('?' * len(ACTIVE_STATES))})", ACTIVE_STATES)]
        now = time.monotonic()
        due = [b for b in backends if force or self._due.get(b, 0.0) <= now]
        await asyncio.gather(*(self._poll_backend(b, force=force) for b in due))
        await self._after_round()

    async def _after_round(self) -> None:
        """What sits on top of jobs moves after each round (the job manager advances its
        sweeps here: the poller does not import sweeps, which build on jobs)."""

    async def _poll_backend(self, name: str, force: bool = False) -> None:
        lock = self._backend_locks.setdefault(name, asyncio.Lock())
        if lock.locked() and not force:
            return
        async with lock:
            await self._poll_backend_locked(name)

    async def _poll_backend_locked(self, name: str) -> None:
        """One round for one backend.  Each job is kept apart from the others: an
        unexpected error while submitting, staging in, polling or staging out one job
        fails that job (``_isolated``) and the others go on in the same round; a backend
        that does not answer leaves its jobs ``unknown`` and is asked again later."""
        rows = [r for r in self.store.query(
            f"SELECT * FROM hpc_jobs WHERE backend = ? AND state IN "
            f"({','.join('?' * len(ACTIVE_STATES))})", (name, *ACTIVE_STATES))
            if r["id"] not in self._broken]
        if not rows:
            return
        # jobs not submitted yet (the backend was down, or a submit was interrupted)
        pending = [r for r in rows if not r["native_id"]
                   and (not _held(r) or r["cancel_requested"])]
        for r in pending:
            await self._isolated(r["id"], STAGE_SUBMIT, self._submit_pending(r))
        rows = [self._row(r["id"]) for r in rows]
        submitted = [r for r in rows if r["native_id"] and r["state"] not in FINAL_STATES
                     and r["id"] not in self._broken]
        if not submitted:
            self._schedule(name, changed=bool(pending))
            return
        be = None
        try:
            be = self.registry.get(name)
            statuses = _statuses(await asyncio.to_thread(be.poll,
                                                         [_ref(r) for r in submitted]), name)
        except BackendUnavailable as e:
            self._mark_unreachable(submitted, name, e)
            self._backoff(name)
            return
        except Exception as e:  # a refusal or an SDK surprise: one job's, or the backend's?
            found = await self._poll_apart(name, be, submitted) if be is not None else None
            if found is None:  # no job answers alone either: the backend's; say it once
                message = describe_error(e)
                if not isinstance(e, CloudTikError) and self._last_error.get(name) != message:
                    log.warning("backend %s: poll failed", name, exc_info=e)
                self._last_error[name] = message
                self._mark_unreachable(submitted, name, message)
                self._backoff(name)
                return
            statuses = found
        self._retry.pop(name, None)
        self._last_error.pop(name, None)
        changed = False
        for r in submitted:
            st = statuses.get(r["native_id"])
            if st is None or r["id"] in self._broken:
                continue
            self._came_back(r)
            final = isinstance(st, JobStatus) and st.final
            changed |= bool(await self._isolated(r["id"], STAGE_OUT if final else STAGE_POLL,
                                                 self._apply(r, st), cancel=not final))
            if r["cancel_requested"] == CANCEL_ASKED and \
                    self._row(r["id"])["state"] not in FINAL_STATES:
                changed |= await self._deliver_cancel(
                    r, f"backend '{name}' answers: the cancel asked for meanwhile is "
                       "carried out")
        now = time.time()
        fresh = any(st.state == QUEUED and now - (r["submitted_at"] or now) <
                    self.hpc.fresh_seconds for r in submitted
                    if isinstance(st := statuses.get(r["native_id"]), JobStatus))
        self._schedule(name, changed, fresh)

    async def _submit_pending(self, row) -> None:
        if row["id"] in self._submitting or self._owned_elsewhere(row):
            return
        await self._submit(row["id"])

    async def _poll_apart(self, name: str, be: HPCBackend,
                          rows: list) -> dict[str, JobStatus] | None:
        """After a poll of all jobs failed (not an outage): each job alone.  A job whose
        own poll fails while others answer is the culprit and fails (``poll failed:
        ...``); None if no job answers (then it is the backend's fault, not a job's)."""
        if len(rows) < 2:
            return None
        found: dict[str, JobStatus] = {}
        broken: list[tuple[Any, Exception]] = []
        silent: list[tuple[Any, BackendUnavailable]] = []
        for r in rows:
            try:
                got = _statuses(await asyncio.to_thread(be.poll, [_ref(r)]), name)
            except BackendUnavailable as e:
                silent.append((r, e))
                continue
            except Exception as e:
                broken.append((r, e))
                continue
            if r["native_id"] in got:
                found[r["native_id"]] = got[r["native_id"]]
        if not found:
            return None
        for r, e in broken:
            await self._cancel_quietly(r["id"], STAGE_POLL)
            await self._fail(r["id"], STAGE_POLL, e)
        for r, message in silent:
            self._mark_unreachable([r], name, message)
        return found

    async def _isolated(self, job_id: str, stage: str, step: Any, *,
                        cancel: bool = False) -> Any:
        """Run one job's ``step`` (a coroutine) so that nothing it raises reaches the
        other jobs.  A backend that does not answer leaves the job ``unknown`` (asked
        again later); anything else fails this job with the stage and the cause in one
        line (the traceback goes to the log), and with ``cancel`` the backend is asked to
        cancel it (its state can no longer be followed).  Returns what ``step`` returned;
        True if the job failed, False if the backend did not answer."""
        try:
            return await step
        except BackendUnavailable as e:
            try:
                row = self._row(job_id)
                self._mark_unreachable([row], row["backend"], e)
            except Exception:
                log.exception("job %s: cannot record that its backend did not answer",
                              job_id)
            return False
        except Exception as e:
            if cancel:
                await self._cancel_quietly(job_id, stage)
            await self._fail(job_id, stage, e)
            return True

    async def _fail(self, job_id: str, stage: str, error: BaseException) -> None:
        """End one job ``failed`` with ``<stage> failed: <cause>``; if even that cannot be
        recorded, this process leaves the job alone (no error every round)."""
        reason = f"{stage} failed: {describe_error(error)}"
        if isinstance(error, CloudTikError):
            log.info("job %s: %s", job_id, reason)
        else:  # a bug or a library's surprise: its traceback belongs in the log
            log.warning("job %s: %s", job_id, reason, exc_info=error)
        try:
            await self._finish(job_id, FAILED, reason)
        except Exception:
            log.exception("job %s: cannot record that it failed; left alone from now on",
                          job_id)
            self._broken[job_id] = reason

    def _schedule(self, name: str, changed: bool, fresh: bool = False) -> None:
        """The next poll of a backend: soon after a change, backing off while nothing
        changes; often while a just-submitted job waits to start."""
        interval = self._interval.get(name, self.hpc.poll_interval)
        if changed:
            interval = self.hpc.poll_interval
        else:
            interval = min(interval * self.hpc.poll_backoff, self.hpc.poll_interval_max)
        self._interval[name] = interval
        if fresh:
            interval = min(interval, self.hpc.poll_interval_fresh)
        self._due[name] = time.monotonic() + interval

    def _backoff(self, name: str) -> None:
        retry = min(max(self._retry.get(name, 0.5) * 2, 1.0), self.hpc.retry_interval_max)
        self._retry[name] = retry
        self._due[name] = time.monotonic() + retry

    def _mark_unreachable(self, rows, name: str, message: str | BackendUnavailable) -> None:
        if isinstance(message, CredentialsExpired):  # it would answer: say what to renew
            reason = f"backend '{name}': {message.message}"
        else:
            text = message.message if isinstance(message, BackendUnavailable) else message
            reason = f"backend '{name}' did not answer: {text}"
        for r in rows:
            self._went_unavailable(r, reason)

    def _went_unavailable(self, row, reason: str) -> None:
        """The job's backend does not answer: the job is ``unknown`` with the reason; one
        ``unavailable`` event when it stops answering, none for the polls after."""
        fields: dict[str, Any] = {}
        if row["state"] != UNKNOWN:
            fields["state"] = UNKNOWN
        if row["reason"] != reason:
            fields["reason"] = reason
        first = row["unavailable_since"] is None
        if first:
            fields["unavailable_since"] = time.time()
        if fields:
            self._update(row["id"], **fields)
        if first:
            self.ops.emit(row["op_id"], "unavailable", reason, level="warning",
                          data={"state": UNKNOWN})

    def _came_back(self, row) -> None:
        """The job's backend answers again: one event, saying for how long it did not."""
        since = row["unavailable_since"]
        if since is None:
            return
        seconds = max(0.0, time.time() - since)
        self._update(row["id"], unavailable_since=None)
        self.ops.emit(row["op_id"], "available",
                      f"backend '{row['backend']}' answers again (it did not for "
                      f"{_how_long(seconds)})", data={"unavailable_seconds": round(seconds, 1)})

    async def _apply(self, row, st: JobStatus) -> bool:
        """Record what the backend said; returns whether anything changed."""
        job_id = row["id"]
        if not isinstance(st, JobStatus) or st.state not in STATES:
            got = st.state if isinstance(st, JobStatus) else st
            raise ProviderError(f"backend '{row['backend']}' reported {got!r} for job "
                                f"{row['native_id']}, which is not a job state "
                                f"({', '.join(STATES)})")
        if st.final:
            with self._as_owner(row):
                await self._finalize(row, st)
            return True
        fields: dict[str, Any] = {}
        if st.state != row["state"]:
            fields["state"] = st.state
        if st.native_state != row["native_state"]:
            fields["native_state"] = st.native_state
        if (st.message or None) != row["reason"]:
            fields["reason"] = st.message
        if st.state == RUNNING and not row["started_at"]:
            fields["started_at"] = time.time()
        if not fields:
            return False
        self._update(job_id, **fields)
        if "state" in fields or "native_state" in fields:
            label = f"{st.state} ({st.native_state})" if st.native_state else st.state
            msg = label
            if st.message:
                msg += f": {st.message}"
            fraction = {QUEUED: 0.65, RUNNING: 0.75}.get(st.state)
            self.ops.emit(row["op_id"], st.state, msg, fraction,
                          data={"state": st.state, "native_state": st.native_state})
        return True


def _statuses(got: Any, backend: str) -> dict[str, Any]:
    if not isinstance(got, dict):
        raise ProviderError(f"backend '{backend}' answered a poll with {type(got).__name__}, "
                            "not the jobs' states")
    return got
