"""A job's record: the ``hpc_jobs`` table (its migrations), reading and updating rows, and
ending a job (its row and its operation); the small helpers every part of a job uses.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

from ..core.errors import CloudTikError
from ..core.ids import resolve_row
from ..core.operations import Target
from ..core.store import loads
from . import provenance
from .base import (
    ACTIVE_STATES,
    CANCELLED,
    FINAL_STATES,
    SUCCEEDED,
    JobRef,
)
from .environment import summary as env_summary
from .models import JobInfo

HPC_MIGRATIONS = [
    """
    CREATE TABLE hpc_jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        backend TEXT NOT NULL,
        backend_type TEXT NOT NULL,
        kind TEXT NOT NULL,
        client_token TEXT NOT NULL UNIQUE,
        native_id TEXT,
        state TEXT NOT NULL,
        native_state TEXT,
        reason TEXT,
        exit_code INTEGER,
        error TEXT,
        spec TEXT NOT NULL,
        plan TEXT NOT NULL DEFAULT '{}',
        op_id TEXT,
        user TEXT,
        submit_attempts INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        submitted_at REAL,
        started_at REAL,
        finished_at REAL
    );
    CREATE INDEX hpc_jobs_state ON hpc_jobs(state, backend);
    CREATE TABLE hpc_poller (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        owner_pid INTEGER,
        owner_host TEXT,
        owner_started REAL,
        heartbeat REAL NOT NULL
    );
    """,
    # since when the job's backend has not answered (NULL: it answers): one event when
    # it stops answering and one when it answers again, not one per poll
    "ALTER TABLE hpc_jobs ADD COLUMN unavailable_since REAL;",
]

# hpc_jobs.cancel_requested: nobody asked; asked, not yet carried out (the backend did
# not answer, or the job was not submitted yet); sent to the backend
CANCEL_ASKED, CANCEL_SENT = 1, 2
# the steps of a job the poller keeps apart: an unexpected error in one fails that job
STAGE_SUBMIT, STAGE_IN, STAGE_POLL, STAGE_OUT = "submit", "stage-in", "poll", "stage-out"

LEASE_STALE_SECONDS = 30.0


def _target(job_id: str) -> str:
    return str(Target("job", job_id))



class JobRecords:
    """Reading and updating ``hpc_jobs`` rows (a part of ``JobManager``)."""

    def _row(self, job_id: str, user: str | None = None):
        """The job ``job_id`` names (a whole id, or the start of one); with ``user``, among
        that user's jobs only, and another user's job is "no job" exactly like a missing
        one (``core.ids``)."""
        return resolve_row(self.store, "hpc_jobs", job_id, user=user, field="job",
                           missing="job: no job '{id}'",
                           ambiguous="job: '{id}' matches several of your jobs "
                                     "({candidates}); give more of the id")

    def get(self, job_id: str, user: str | None = None) -> JobInfo:
        return self._info(self._row(job_id, user))

    def list(self, active_only: bool = False, backend: str | None = None,
             limit: int = 100, user: str | None = None,
             sweep_elements: bool = True) -> list[JobInfo]:
        sql, params = "SELECT * FROM hpc_jobs", []
        clauses = []
        if not sweep_elements:  # the panel shows a sweep as one row, not its jobs
            clauses.append("json_extract(plan, '$.sweep') IS NULL")
        if user is not None:
            clauses.append("user = ?")
            params.append(user)
        if active_only:
            clauses.append(f"state IN ({','.join('?' * len(ACTIVE_STATES))})")
            params += list(ACTIVE_STATES)
        if backend:
            clauses.append("backend = ?")
            params.append(backend)
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY created_at DESC LIMIT ?"
        params.append(limit)
        return [self._info(r) for r in self.store.query(sql, params)]

    def _info(self, row) -> JobInfo:
        spec = loads(row["spec"], {})
        plan = loads(row["plan"], {})
        return JobInfo(
            id=row["id"], name=row["name"], backend=row["backend"],
            backend_type=row["backend_type"], kind=row["kind"], state=row["state"],
            native_id=row["native_id"], native_state=row["native_state"],
            reason=row["reason"], exit_code=row["exit_code"], error=loads(row["error"]),
            notebook=spec.get("notebook"), command=spec.get("command"),
            parameters=spec.get("parameters") or {}, resources=spec.get("resources") or {},
            attributes=spec.get("attributes") or {},
            inputs=[_public_input(i) for i in plan.get("inputs") or []],
            output=spec.get("output"), output_notebook=plan.get("output_notebook"),
            warnings=list(plan.get("warnings") or []), sweep=plan.get("sweep"),
            environment=env_summary(plan.get("environment")),
            op_id=row["op_id"], user=row["user"], created_at=row["created_at"],
            updated_at=row["updated_at"], submitted_at=row["submitted_at"],
            started_at=row["started_at"], finished_at=row["finished_at"])

    def events(self, job_id: str, after: int = 0):
        return self.ops.events(self._row(job_id)["op_id"], after=after)

    def _update(self, job_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        if fields.get("reason"):
            fields["reason"] = self.redact(fields["reason"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE hpc_jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    async def _finish(self, job_id: str, state: str, reason: str | None = None,
                      **fields: Any) -> None:
        """Record the job final: its crate first (a job that ends here without its run's
        crate gets one), then its state and its operation's end, so whoever sees it
        final finds the crate.  The crate and removing the job's sent files are file
        work on a thread; meanwhile a second end of the same job (a cancel racing the
        poll) leaves it to the first, as it would find it final."""
        row = self._row(job_id)
        if row["state"] in FINAL_STATES or job_id in self._finishing:
            return
        self._finishing.add(job_id)
        try:
            if state != SUCCEEDED:
                await provenance.record_unrun(self, row, state, reason,
                                              self._content_dir(job_id))
            await asyncio.to_thread(shutil.rmtree, self._content_dir(job_id),
                                    ignore_errors=True)
            self._ended(row, job_id, state, reason, **fields)
        finally:
            self._finishing.discard(job_id)

    def _ended(self, row: Any, job_id: str, state: str, reason: str | None,
               **fields: Any) -> None:
        now = time.time()
        self._update(job_id, state=state, reason=reason, finished_at=now, **fields)
        op_state = {SUCCEEDED: "succeeded", CANCELLED: "cancelled"}.get(state, "failed")
        op = self.ops.get(row["op_id"])
        interrupted = op.state == "failed" and (op.reason or "").startswith("interrupted:")
        if op.done and not interrupted:
            return
        if interrupted:
            self.ops.adopt(op.id)
        self.ops.finish(op.id, op_state, reason, result={"job": job_id, "state": state})

    def _record_attempt(self, job_id: str) -> int:
        with self.store.transaction() as conn:
            conn.execute("UPDATE hpc_jobs SET submit_attempts = submit_attempts + 1,"
                         " updated_at = ? WHERE id = ?", (time.time(), job_id))
            return conn.execute("SELECT submit_attempts FROM hpc_jobs WHERE id = ?",
                                (job_id,)).fetchone()[0]


def _held(row) -> bool:
    """Recorded for a sweep that submits it itself (``submit(hold=...)``)."""
    return bool(loads(row["plan"], {}).get("held"))


def _ref(row) -> JobRef:
    return JobRef(row["id"], row["native_id"])


def _public_input(d: dict[str, Any]) -> dict[str, Any]:
    """An input as its job shows it: a sent file by its name, not by where the content
    folder is on this machine."""
    if d.get("sent"):
        return {**d, "source": f"sent:{d['name']}"}
    return d


def describe_error(error: BaseException, limit: int = 500) -> str:
    """The cause of a failure in one line, for a job's reason: a CloudTik error's own
    words, an OS error's (``Not a directory: '/x/y'``), else the exception's type and
    text; never a traceback."""
    if isinstance(error, CloudTikError):
        text = error.message
    elif isinstance(error, OSError) and error.strerror:
        text = error.strerror + (f": {str(error.filename)!r}" if error.filename else "")
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _how_long(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    return f"{h} h {m} min" if m else f"{h} h"

