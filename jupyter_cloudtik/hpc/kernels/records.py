"""Which server process owns which HPC kernel's batch job, kept in the state store.

Why: jupyter_server keeps its kernels in memory.  A server that is killed (SIGKILL, the
OOM killer, a lost login node) rather than stopped leaves its kernels' jobs running
until their wall time, holding an allocation nobody can reach: a new server knows
neither the kernels nor their keys.  So each kernel's job is recorded here with the
process that owns it (pid, host and start time, judged as operations' owners are,
``core.operations.owner_alive``).  The next server on the same state folder ends the
jobs whose owner is gone (``end_orphans``) and keeps why, which ``GET hpc/kernels`` and
the server's log report.

A notebook's kernel is kept for its notebook instead (``HPCKernels.reconnect_within``):
the next server that starts that notebook's kernel with the same spec takes the row over
(``adopt``) and reaches the same kernel, whose key it reads back from the job's connection
file; the rest are ended.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from ...core.errors import CloudTikError, ConfigError
from ...core.operations import _process_start_time, owner_alive
from ...core.store import Store
from ..base import JobRef
from .job import CONNECTION_FILE

AREA = "hpc_kernels"
MIGRATIONS = [
    """
    CREATE TABLE hpc_kernels (
        id TEXT PRIMARY KEY,
        backend TEXT NOT NULL,
        profile TEXT NOT NULL,
        job_id TEXT NOT NULL,
        native_id TEXT,
        node TEXT,
        state TEXT NOT NULL,
        reason TEXT,
        orphaned INTEGER NOT NULL DEFAULT 0,
        owner_pid INTEGER NOT NULL,
        owner_host TEXT NOT NULL,
        owner_started REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # reconnecting: the notebook a kernel was started for and its spec, and since when
    # its server is known to be gone (its job kept for HPCKernels.reconnect_within)
    """
    ALTER TABLE hpc_kernels ADD COLUMN session TEXT;
    ALTER TABLE hpc_kernels ADD COLUMN spec TEXT;
    ALTER TABLE hpc_kernels ADD COLUMN gone_since REAL;
    """,
]
# how long a kernel whose server was gone stays listed (GET hpc/kernels) after its job was
# ended for it
REPORTED_SECONDS = 7 * 24 * 3600.0


@dataclass
class Owner:
    pid: int
    host: str
    started: float | None

    @classmethod
    def this_process(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, socket.gethostname(), _process_start_time(pid))


class KernelRecords:
    """The ``hpc_kernels`` rows of one state folder."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.ensure_schema(AREA, MIGRATIONS)

    def started(self, kernel_id: str, *, backend: str, profile: str, job_id: str,
                native_id: str | None, session: str | None = None,
                spec: str | None = None) -> None:
        """The kernel's job is being submitted by this process (``native_id`` None until
        sbatch answers; a restart's new job replaces the old one's row)."""
        me, now = Owner.this_process(), time.time()
        self.store.execute(
            "INSERT OR REPLACE INTO hpc_kernels (id, backend, profile, job_id, native_id,"
            " state, owner_pid, owner_host, owner_started, created_at, updated_at, session,"
            " spec) VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
            (kernel_id, backend, profile, job_id, native_id, me.pid, me.host, me.started,
             now, now, session, spec))

    def adopt(self, kernel_id: str, *, session: str, spec: str) -> Any | None:
        """The row of a kernel of the same notebook and spec whose server is gone, now
        this process's under ``kernel_id`` (None: there is none).  At most one process
        gets it: the update names the old owner."""
        me = Owner.this_process()
        for row in self.orphans():
            if row["session"] != session or row["spec"] != spec or not row["native_id"] \
                    or row["state"] == "dead":
                continue
            with self.store.transaction() as conn:
                cur = conn.execute(
                    "UPDATE hpc_kernels SET id = ?, owner_pid = ?, owner_host = ?,"
                    " owner_started = ?, gone_since = NULL, updated_at = ? WHERE id = ? AND"
                    " orphaned = 0 AND owner_pid = ? AND owner_host = ?",
                    (kernel_id, me.pid, me.host, me.started, time.time(), row["id"],
                     row["owner_pid"], row["owner_host"]))
            if cur.rowcount == 1:
                return row
        return None

    def keep(self, row: Any) -> float:
        """Since when ``row``'s server is known to be gone (now, the first time)."""
        if row["gone_since"]:
            return float(row["gone_since"])
        now = time.time()
        self.store.execute("UPDATE hpc_kernels SET gone_since = ? WHERE id = ? AND"
                           " gone_since IS NULL", (now, row["id"]))
        return now

    def update(self, kernel_id: str, **fields: Any) -> None:
        allowed = {"state", "reason", "node", "native_id"}
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.store.execute(f"UPDATE hpc_kernels SET {sets}, updated_at = ? WHERE id = ?",
                           (*fields.values(), time.time(), kernel_id))

    def forget(self, kernel_id: str) -> None:
        """The kernel was shut down by its server: nothing is left to end or report."""
        self.store.execute("DELETE FROM hpc_kernels WHERE id = ? AND orphaned = 0",
                           (kernel_id,))

    def orphans(self) -> list[Any]:
        """Rows whose owning process is gone: a job left to end, or a dead kernel's row
        nobody forgot.  Rows of other hosts are trusted (their processes cannot be
        checked from here)."""
        rows = self.store.query("SELECT * FROM hpc_kernels WHERE orphaned = 0")
        return [r for r in rows
                if not owner_alive(r["owner_pid"], r["owner_host"], r["owner_started"])]

    def reported(self, keep_for: float = 0.0) -> list[dict[str, Any]]:
        """Kernels whose server was gone, as ``kernel_status()`` lists a kernel: ended
        for it, or kept for its notebook to reconnect (``keep_for`` seconds)."""
        rows = self.store.query(
            "SELECT * FROM hpc_kernels WHERE (orphaned = 1 AND updated_at > ?) OR"
            " (orphaned = 0 AND gone_since IS NOT NULL) ORDER BY updated_at",
            (time.time() - REPORTED_SECONDS,))
        out = []
        for r in rows:
            item = {"id": r["id"], "backend": r["backend"], "profile": r["profile"],
                    "job": r["native_id"], "node": r["node"], "state": r["state"],
                    "reason": r["reason"], "orphaned": True, "time": r["updated_at"],
                    "session": r["session"]}
            if not r["orphaned"]:
                left = max(0.0, r["gone_since"] + keep_for - time.time())
                item["reason"] = (f"its server stopped without shutting it down; the job "
                                  f"runs on, and its notebook's kernel reconnects to it if "
                                  f"started within {left / 60:.0f} min (else it is cancelled)")
                item["reconnectable"] = True
            out.append(item)
        return out

    def report(self, row: Any, state: str, reason: str) -> bool:
        """Mark an orphan as handled, unless another server did meanwhile."""
        cur = self.store.execute(
            "UPDATE hpc_kernels SET state = ?, reason = ?, orphaned = 1, updated_at = ?"
            " WHERE id = ? AND orphaned = 0 AND owner_pid = ? AND owner_host = ?",
            (state, reason, time.time(), row["id"], row["owner_pid"], row["owner_host"]))
        return cur.rowcount == 1

    def purge(self) -> None:
        self.store.execute("DELETE FROM hpc_kernels WHERE orphaned = 1 AND updated_at < ?",
                           (time.time() - REPORTED_SECONDS,))


def end_orphans(records: KernelRecords, registry: Any, log: logging.Logger,
                unresolved_only: bool = False, keep_for: float = 0.0) -> list[str]:
    """End the jobs of kernels whose server is gone; one line per kernel, as logged (with
    ``unresolved_only``, only the lines of jobs that could not be ended).

    A job whose backend cannot be asked now (it does not answer, or is no longer
    configured) is said so and tried again later: an orphan is reported as ended only once
    its job is known to have ended."""
    said, unresolved = [], []
    for row in records.orphans():
        kid, backend, native = row["id"], row["backend"], row["native_id"]
        owner = f"pid {row['owner_pid']} on {row['owner_host']}"
        if row["state"] == "dead":  # its server saw it end, then was killed: nothing left
            records.report(row, "dead", row["reason"] or "ended")
            continue
        try:
            be = registry.get(backend)
            ref = JobRef(row["job_id"], native or "")
            st = be.poll([ref])[ref.native_id] if native else None
            if st is not None and not st.final and keep_for > 0 and row["session"]:
                # a notebook's kernel: kept a while for its notebook to reconnect
                since = records.keep(row)
                left = since + keep_for - time.time()
                if left > 0:
                    line = (f"HPC kernel {kid}: its server ({owner}) stopped without "
                            f"shutting it down; job {native} on {backend} runs on: its "
                            f"notebook's kernel reconnects to it if started within "
                            f"{left:.0f} s, else it is cancelled")
                    if not row["gone_since"]:
                        log.warning("%s", line)
                        said.append(line)
                    unresolved.append(line)  # looked at again
                    continue
            if st is not None and not st.final:
                be.cancel(ref)
                ended = "was cancelled"
            else:
                ended = "had already ended"
            try:  # the connection file holds the key that signed the kernel's messages
                be.shell.run(["rm", "-f", "--", f"{be.folder(row['job_id'])}/"
                              f"{CONNECTION_FILE}"])
            except Exception:  # the job is ended: the key is useless now
                pass
        except (CloudTikError, OSError) as e:
            # a backend no longer configured is tried by the next server (with its
            # config), one that does not answer again a minute later too
            again = ("when a server starts" if isinstance(e, ConfigError)
                     else "in a minute and when a server starts")
            line = (f"HPC kernel {kid}: the server that started it ({owner}) is gone, and "
                    f"its job {native} on {backend} cannot be ended now: {e}; it may run "
                    f"until its wall time (tried again {again})")
            log.warning("%s", line)
            said.append(line)
            if not isinstance(e, ConfigError):
                unresolved.append(line)
            continue
        if native:
            reason = (f"its server ({owner}) stopped without shutting it down; job {native} "
                      f"on {backend} {ended}")
        else:  # killed between recording the kernel and sbatch's answer
            reason = (f"its server ({owner}) stopped while submitting its job to {backend}; "
                      f"no job id was recorded (a job running in {be.folder(row['job_id'])} "
                      "would be it)")
        if records.report(row, "dead", reason):
            line = f"HPC kernel {kid}: {reason}"
            log.warning("%s", line)
            said.append(line)
    records.purge()
    return unresolved if unresolved_only else said
