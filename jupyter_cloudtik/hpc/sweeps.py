"""Parameter sweeps: one notebook run for every element of a grid, watched as one thing.

A sweep is a row in ``hpc_sweeps`` plus one ordinary job per element (``hpc_jobs``, mapped
by ``hpc_sweep_elements``), so each element has the folder, log, markers, events, cancel
and fetch of a single job, and the job manager's poller watches all of them with its one
poll per backend per tick (Slurm: one ``squeue`` for every element of every sweep).

Every element is checked (its parameters against the notebook's cell tagged
``parameters``, resources, inputs, output) and recorded *held* (``JobManager.submit(...,
hold=sweep)``) before anything is submitted; only then does the sweep submit them:

* as one native job array where the backend has one (``submit_array``: Slurm's
  ``sbatch --array=0-N%LIMIT``, directly or through FirecREST), the limit being how many
  elements run at once;
* elsewhere (local, ARC, Dask) as a bounded set of jobs: at most LIMIT
  elements are submitted and not yet ended; the poller releases the next as others end.

``retry`` records a new job for each failed element only (the old one stays as history)
and submits them the same way; ``results`` reads what each element recorded (see
``hpc.record``) and its outputs into one table.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import json
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import BackendUnavailable, ConfigError
from ..core.ids import resolve_row
from ..core.operations import OperationContext
from ..core.store import dumps, loads
from . import notebook as nbtools
from .base import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    FINAL_STATES,
    QUEUED,
    RUNNING,
    SUBMITTING,
    SUCCEEDED,
    UNKNOWN,
    JobRef,
    JobSpec,
)
from .notebook_reader import notebook_view
from .recording import read_recorded as read_recorded
from .sweep_grid import _source_field
from .sweep_grid import expand as expand
from .sweep_results import SweepResults

SWEEP_MIGRATIONS = [
    """
    CREATE TABLE hpc_sweeps (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        backend TEXT NOT NULL,
        mode TEXT NOT NULL,
        max_concurrent INTEGER NOT NULL,
        spec TEXT NOT NULL,
        user TEXT,
        ready INTEGER NOT NULL DEFAULT 0,
        arrays INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE hpc_sweep_elements (
        sweep_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        parameters TEXT NOT NULL,
        job_id TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (sweep_id, idx)
    );
    CREATE INDEX hpc_sweep_elements_job ON hpc_sweep_elements(job_id);
    """,
]

ARRAY, BOUNDED = "array", "bounded"
# seconds after which elements claimed for an array that never got their ids are taken
# back (the claiming process died between the claim and sbatch's answer): submit_array
# with the same key answers the first submission's ids if sbatch did run
ARRAY_CLAIM_STALE = 300.0


@dataclass
class SweepInfo:
    """A sweep as the faces show it: its state, counts and one row per element."""

    id: str
    name: str
    backend: str
    mode: str  # array (one native job array) | bounded (at most max_concurrent jobs)
    state: str
    max_concurrent: int
    notebook: str | None
    counts: dict[str, int]
    elements: list[dict[str, Any]] = field(default_factory=list)
    user: str | None = None
    created_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepInfo:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


# --- the manager -----------------------------------------------------------------------------


class SweepManager(SweepResults):
    """The sweeps of one job manager (same store, same user, same backends)."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs
        self.store = jobs.store
        self.store.ensure_schema("hpc_sweeps", SWEEP_MIGRATIONS)
        self._lock = asyncio.Lock()

    # submitting -------------------------------------------------------------------------
    async def submit(
        self,
        spec: JobSpec,
        backend: str | None = None,
        *,
        grid: dict[str, list[Any]] | None = None,
        zip: dict[str, list[Any]] | None = None,
        elements: list[dict[str, Any]] | None = None,
        max_concurrent: int | None = None,
        locations: locs.LocationPolicy | None = None,
        files: dict[str, bytes] | None = None,
    ) -> SweepInfo:
        """Check every element, record them all, then submit them (one array, or the
        first ``max_concurrent`` jobs).  ``spec`` is the job every element runs; its
        ``parameters`` are the values shared by all elements."""
        mgr = self.jobs
        hpc = mgr.hpc
        params = expand(grid, zip, elements)
        limit = max(1, int(hpc.max_sweep_elements))
        if len(params) > limit:
            what = "elements" if elements is not None else ("grid" if grid else "zip")
            raise ConfigError(
                f"{what}: the sweep has {len(params)} elements, more than "
                f"HPC.max_sweep_elements ({limit}) allows; split it or raise the limit",
                field=what,
            )
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool)
            or not isinstance(max_concurrent, int)
            or max_concurrent < 1
        ):
            raise ConfigError(
                f"max_concurrent: {max_concurrent!r} is not a whole number of at least 1",
                field="max_concurrent",
            )
        ceiling = max(1, int(hpc.sweep_max_concurrent))
        if max_concurrent is not None and max_concurrent > ceiling:
            # the admin's value is a ceiling: a user's request cannot raise it
            raise ConfigError(
                f"max_concurrent: {max_concurrent!r} is more than HPC.sweep_max_concurrent "
                f"allows (at most {ceiling})",
                field="max_concurrent",
            )
        concurrent = max_concurrent or ceiling
        if not spec.notebook:
            raise ConfigError(
                "notebook: a sweep runs a notebook with each element's parameters; give a notebook",
                field="notebook",
            )
        name = mgr.registry.resolve(backend)
        be = mgr.registry.get(name)
        mode = ARRAY if hasattr(be, "submit_array") else BOUNDED
        await self._check_all(
            spec, params, grid, zip, elements is not None, files, locations or mgr.locations
        )
        sweep_id = "s" + uuid.uuid4().hex[:7]
        base = copy.deepcopy(spec)
        if not base.name:
            base.name = Path(base.notebook.replace("\\", "/")).stem
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hpc_sweeps (id, name, backend, mode, max_concurrent, spec, user,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sweep_id,
                    base.name,
                    name,
                    mode,
                    concurrent,
                    dumps(base.to_dict()),
                    mgr.user,
                    now,
                    now,
                ),
            )
        self._keep_files(sweep_id, files)
        recorded: list[str] = []
        try:
            for i, p in enumerate(params):
                info = await mgr.submit(
                    self._element_spec(base, i, p),
                    name,
                    hold=sweep_id,
                    locations=locations,
                    files=files,
                )
                recorded.append(info.id)
                with self.store.transaction() as conn:
                    conn.execute(
                        "INSERT INTO hpc_sweep_elements (sweep_id, idx, parameters,"
                        " job_id) VALUES (?, ?, ?, ?)",
                        (sweep_id, i, dumps(p), info.id),
                    )
        except BaseException:
            self._forget(sweep_id, recorded)
            raise
        if not files and recorded:
            # a retry records new jobs later, maybe from another folder: the notebook and
            # inputs as they were resolved now (element 0's, the same for every element)
            first = loads(mgr._row(recorded[0])["spec"], {})
            base.notebook, base.inputs = first.get("notebook"), list(first.get("inputs") or [])
            self._set(sweep_id, spec=dumps(base.to_dict()))
        self._set(sweep_id, ready=1)
        await self.advance(sweep_id)
        return self.get(sweep_id)

    async def _check_all(
        self,
        spec: JobSpec,
        params: list[dict[str, Any]],
        grid,
        zip,
        from_elements: bool,
        files: dict[str, bytes] | None,
        policy: locs.LocationPolicy,
    ) -> None:
        """Every element's parameters against the notebook, before anything is recorded:
        the names are what the check decides, so each distinct set of names is checked
        once (with the first element that has it) and its verdict holds for the others."""
        nb_name = Path(spec.notebook.replace("\\", "/")).name
        sent = (files or {}).get(nb_name)
        if sent is None:
            where = self.jobs._locate(spec.notebook, "notebook", policy)
            if not where.is_local:
                raise ConfigError(
                    f"notebook: {spec.notebook!r} is not a local notebook file", field="notebook"
                )
        # read off the loop the server shares (a large notebook: in a process of its own)
        nb = await notebook_view(sent if sent is not None else where.text)
        await asyncio.to_thread(self._check_names, nb, nb_name, spec, params, grid, zip,
                                from_elements)

    @staticmethod
    def _check_names(nb, nb_name, spec, params, grid, zip, from_elements) -> None:
        seen: set[frozenset[str]] = set()
        for i, p in enumerate(params):
            keys = frozenset(p)
            if keys in seen:
                continue
            seen.add(keys)
            try:
                nbtools.check_parameters(
                    nb,
                    {**spec.parameters, **p},
                    notebook=nb_name,
                    kernel=spec.kernel,
                    allow_unknown=spec.allow_unknown_parameters,
                )
            except ConfigError as e:
                key = str(e.field or "").partition(".")[2]
                where_ = _source_field(key, grid, zip, i, from_elements)
                text = e.message
                if text.startswith(f"parameters.{key}:"):
                    text = where_ + text[len(f"parameters.{key}") :]
                raise ConfigError(text, field=where_) from None

    @staticmethod
    def _element_spec(base: JobSpec, index: int, params: dict[str, Any]) -> JobSpec:
        s = copy.deepcopy(base)
        s.parameters = {**base.parameters, **params}
        s.name = f"{base.name}[{index}]"
        if base.output:  # each element's results in a folder of its own
            s.output = f"{base.output.rstrip('/')}/{index}"
        return s

    def _files_dir(self, sweep_id: str) -> Path:
        return self.store.state_dir / "hpc" / "sweeps" / sweep_id

    def _keep_files(self, sweep_id: str, files: dict[str, bytes] | None) -> None:
        """Sent files stay with the sweep (a retry records new jobs from them)."""
        if not files:
            return
        folder = self._files_dir(sweep_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "files.json").write_text(
            json.dumps({k: v.decode("latin-1") for k, v in files.items()})
        )

    def _kept_files(self, sweep_id: str) -> dict[str, bytes] | None:
        path = self._files_dir(sweep_id) / "files.json"
        if not path.exists():
            return None
        return {k: v.encode("latin-1") for k, v in json.loads(path.read_text()).items()}

    def _forget(self, sweep_id: str, job_ids: list[str]) -> None:
        """A sweep that could not be recorded whole leaves nothing behind (none of its
        jobs was submitted: they were held)."""
        for jid in job_ids:
            try:
                row = self.jobs._row(jid)
                self.jobs.ops.finish(row["op_id"], "failed", "its sweep was not submitted")
            except Exception:
                pass
        with self.store.transaction() as conn:
            for jid in job_ids:
                conn.execute("DELETE FROM hpc_jobs WHERE id = ?", (jid,))
            conn.execute("DELETE FROM hpc_sweep_elements WHERE sweep_id = ?", (sweep_id,))
            conn.execute("DELETE FROM hpc_sweeps WHERE id = ?", (sweep_id,))
        shutil.rmtree(self._files_dir(sweep_id), ignore_errors=True)

    def _set(self, sweep_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE hpc_sweeps SET {cols} WHERE id = ?", (*fields.values(), sweep_id))

    # submitting held elements ----------------------------------------------------------------
    def _claim(self, row: Any, held: str | None) -> dict[str, Any] | None:
        """Atomically move a held job to ``held`` (None: released to the job manager);
        None if another process or task got it first."""
        plan = loads(row["plan"], {})
        new = dict(plan)
        if held:
            new["held"] = held
        else:
            new.pop("held", None)
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE hpc_jobs SET plan = ?, updated_at = ? WHERE id = ?"
                " AND plan = ? AND native_id IS NULL",
                (dumps(new), time.time(), row["id"], row["plan"]),
            )
            return new if cur.rowcount == 1 else None

    async def advance(self, sweep_id: str) -> None:
        """Submit what of the sweep may be submitted now: all held elements as one array,
        or held jobs while fewer than ``max_concurrent`` of its jobs are active."""
        async with self._lock:
            sweep = self.store.query_one("SELECT * FROM hpc_sweeps WHERE id = ?", (sweep_id,))
            if sweep is None or not sweep["ready"]:
                return
            rows = self.store.query(
                "SELECT j.* FROM hpc_sweep_elements e JOIN hpc_jobs j ON j.id = e.job_id"
                " WHERE e.sweep_id = ? ORDER BY e.idx",
                (sweep_id,),
            )
            for r in rows:  # claimed for an array by a process that died before sbatch
                if (
                    loads(r["plan"], {}).get("held") == f"array:{sweep_id}"
                    and not r["native_id"]
                    and time.time() - r["updated_at"] > ARRAY_CLAIM_STALE
                ):
                    self._claim(r, sweep_id)  # the array's marker makes a resubmit safe
            rows = self.store.query(
                "SELECT j.* FROM hpc_sweep_elements e JOIN hpc_jobs j ON j.id = e.job_id"
                " WHERE e.sweep_id = ? ORDER BY e.idx",
                (sweep_id,),
            )
            held = [
                r
                for r in rows
                if r["state"] == SUBMITTING
                and not r["native_id"]
                and loads(r["plan"], {}).get("held") == sweep_id
                and not r["cancel_requested"]
            ]
            if not held:
                return
            if sweep["mode"] == ARRAY:
                await self._submit_array(sweep, held)
            else:
                active = sum(
                    1
                    for r in rows
                    if r["state"] in ACTIVE_STATES and loads(r["plan"], {}).get("held") != sweep_id
                )
                room = sweep["max_concurrent"] - active
                go = [r for r in held[: max(0, room)] if self._claim(r, None) is not None]
                mgr = self.jobs
                await asyncio.gather(
                    *(mgr._isolated(r["id"], "submit", mgr._submit(r["id"])) for r in go)
                )
            self.jobs._wake(sweep["backend"])

    async def _submit_array(self, sweep: Any, held: list[Any]) -> None:
        mgr = self.jobs
        mark = f"array:{sweep['id']}"
        claimed = []
        for r in held:
            plan = self._claim(r, mark)
            if plan is not None:
                claimed.append((r["id"], plan))
        if not claimed:
            return
        be = mgr.registry.get(sweep["backend"])
        subs, ok = [], []
        for jid, plan in claimed:
            row = mgr._row(jid)
            ctx = OperationContext(mgr.ops, row["op_id"])
            try:
                with mgr._as_owner(row):
                    subs.append(await mgr._stage_inputs(jid, row, plan, ctx))
                ok.append((jid, plan))
            except Exception as e:  # this element alone fails
                await mgr._fail(jid, "stage-in", e)
        if not subs:
            return
        key = f"sweep-{sweep['id']}-{sweep['arrays']}"
        try:
            natives = await asyncio.to_thread(be.submit_array, key, subs, sweep["max_concurrent"])
        except BackendUnavailable:  # held again: the next tick tries again
            for jid, _ in ok:
                self._claim(mgr._row(jid), sweep["id"])
            return
        except Exception as e:
            for jid, _ in ok:
                await mgr._fail(jid, "submit", e)
            return
        finally:
            for jid, _ in ok:
                shutil.rmtree(mgr._staging_dir(jid), ignore_errors=True)
        self._set(sweep["id"], arrays=sweep["arrays"] + 1)
        now = time.time()
        for (jid, plan), nid in builtins.zip(ok, natives, strict=True):
            plan = {k: v for k, v in plan.items() if k != "held"}
            mgr._update(
                jid,
                native_id=nid,
                state=QUEUED,
                reason=None,
                submitted_at=now,
                plan=dumps(plan),
                submit_attempts=1,
            )
            shutil.rmtree(mgr._content_dir(jid), ignore_errors=True)
            row = mgr._row(jid)
            OperationContext(mgr.ops, row["op_id"]).progress(
                "submitted",
                f"submitted to '{sweep['backend']}' as array element {nid}",
                0.6,
                native_id=nid,
                state=QUEUED,
            )

    # reading ---------------------------------------------------------------------------------
    def _sweep_row(self, sweep_id: str, user: str | None = None) -> Any:
        return resolve_row(
            self.store,
            "hpc_sweeps",
            sweep_id,
            user=user,
            field="sweep",
            missing="sweep: no sweep '{id}'",
            ambiguous="sweep: '{id}' matches several of your sweeps "
            "({candidates}); give more of the id",
        )

    def _element_rows(self, sweep_id: str) -> list[Any]:
        return self.store.query(
            "SELECT e.idx, e.parameters AS element_parameters, e.attempts, j.* FROM"
            " hpc_sweep_elements e JOIN hpc_jobs j ON j.id = e.job_id WHERE e.sweep_id = ?"
            " ORDER BY e.idx",
            (sweep_id,),
        )

    def get(self, sweep_id: str, user: str | None = None) -> SweepInfo:
        return self._info(self._sweep_row(sweep_id, user))

    def list(self, user: str | None = None, limit: int = 100) -> list[SweepInfo]:
        sql, params = "SELECT * FROM hpc_sweeps", []
        if user is not None:
            sql += " WHERE user = ?"
            params.append(user)
        sql += " ORDER BY created_at DESC LIMIT ?"
        params.append(limit)
        return [self._info(r) for r in self.store.query(sql, params)]

    def _info(self, sweep: Any) -> SweepInfo:
        rows = self._element_rows(sweep["id"])
        counts = {
            k: 0 for k in ("queued", "running", "succeeded", "failed", "cancelled", "unknown")
        }
        elements = []
        for r in rows:
            state = r["state"]
            bucket = QUEUED if state == SUBMITTING else state
            counts[bucket] = counts.get(bucket, 0) + 1
            elements.append(
                {
                    "index": r["idx"],
                    "job": r["id"],
                    "op_id": r["op_id"],
                    "state": state,
                    "native_id": r["native_id"],
                    "native_state": r["native_state"],
                    "parameters": loads(r["element_parameters"], {}),
                    "reason": r["reason"],
                    "attempts": r["attempts"],
                    "started_at": r["started_at"],
                    "finished_at": r["finished_at"],
                }
            )
        spec = loads(sweep["spec"], {})
        return SweepInfo(
            id=sweep["id"],
            name=sweep["name"],
            backend=sweep["backend"],
            mode=sweep["mode"],
            state=_sweep_state(counts, bool(sweep["cancel_requested"])),
            max_concurrent=sweep["max_concurrent"],
            notebook=spec.get("notebook"),
            counts=counts,
            elements=elements,
            user=sweep["user"],
            created_at=sweep["created_at"],
        )

    async def wait(
        self, sweep_id: str, timeout: float | None = None, poll: float = 0.2
    ) -> SweepInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        sweep_id = self._sweep_row(sweep_id)["id"]
        self.jobs.ensure_poller()
        while True:
            info = self.get(sweep_id)
            if info.done or (deadline is not None and time.monotonic() > deadline):
                return info
            await asyncio.sleep(poll)

    # acting ----------------------------------------------------------------------------------
    async def cancel(
        self, sweep_id: str, element: int | None = None, user: str | None = None
    ) -> SweepInfo:
        """Cancel the whole sweep (its arrays with one ``scancel`` each), or one element."""
        sweep = self._sweep_row(sweep_id, user)
        rows = self._element_rows(sweep["id"])
        mgr = self.jobs
        if element is not None:
            # a bool is an int to Python (True == 1): refuse it, and any other type or an
            # index out of range, as bad input
            if (
                isinstance(element, bool)
                or not isinstance(element, int)
                or not 0 <= element < len(rows)
            ):
                raise ConfigError(
                    f"element: {element!r} is not an element index of the sweep (a whole "
                    f"number 0-{len(rows) - 1})",
                    field="element",
                )
            match = [r for r in rows if r["idx"] == element]
            await mgr.cancel(match[0]["id"])
            return self.get(sweep["id"])
        self._set(sweep["id"], cancel_requested=1)
        active = [r for r in rows if r["state"] not in FINAL_STATES]
        be = mgr.registry.get(sweep["backend"])
        arrayed = [r for r in active if r["native_id"] and "_" in r["native_id"]]
        if arrayed and hasattr(be, "cancel_array"):
            try:
                await asyncio.to_thread(
                    be.cancel_array, [JobRef(r["id"], r["native_id"]) for r in arrayed]
                )
            except BackendUnavailable:
                arrayed = []  # each element's cancel below records it for later
            else:
                # deferred: start-up (hpc.job_records ~14 ms, loads importlib.metadata)
                from .job_records import CANCEL_SENT

                for r in arrayed:
                    mgr._update(r["id"], cancel_requested=CANCEL_SENT)
                    mgr.ops.emit(r["op_id"], "cancel", "cancellation requested (its sweep)")
        done = {r["id"] for r in arrayed}
        await asyncio.gather(*(mgr.cancel(r["id"]) for r in active if r["id"] not in done))
        if done:
            await mgr._poll_backend(sweep["backend"], force=True)
        return self.get(sweep["id"])

    async def retry(
        self, sweep_id: str, user: str | None = None, locations: locs.LocationPolicy | None = None
    ) -> SweepInfo:
        """Resubmit only the failed elements: each gets a new job (the failed one stays,
        as history) with the same parameters, submitted like the sweep was."""
        sweep = self._sweep_row(sweep_id, user)
        rows = [r for r in self._element_rows(sweep["id"]) if r["state"] == FAILED]
        if not rows:
            return self.get(sweep["id"])
        base = JobSpec.from_dict(loads(sweep["spec"]))
        files = self._kept_files(sweep["id"])
        self._set(sweep["id"], ready=0, cancel_requested=0)
        try:
            for r in rows:
                spec = self._element_spec(base, r["idx"], loads(r["element_parameters"], {}))
                info = await self.jobs.submit(
                    spec, sweep["backend"], hold=sweep["id"], locations=locations, files=files
                )
                with self.store.transaction() as conn:
                    conn.execute(
                        "UPDATE hpc_sweep_elements SET job_id = ?, attempts ="
                        " attempts + 1 WHERE sweep_id = ? AND idx = ?",
                        (info.id, sweep["id"], r["idx"]),
                    )
        finally:
            self._set(sweep["id"], ready=1)
        await self.advance(sweep["id"])
        return self.get(sweep["id"])


def _sweep_state(counts: dict[str, int], cancel_requested: bool) -> str:
    active = counts[QUEUED] + counts[RUNNING] + counts[UNKNOWN]
    if active:
        if counts[RUNNING]:
            return RUNNING
        return UNKNOWN if counts[UNKNOWN] and not counts[QUEUED] else QUEUED
    total = sum(counts.values())
    if total and counts[SUCCEEDED] == total:
        return SUCCEEDED
    if cancel_requested or (counts[CANCELLED] and not counts[FAILED]):
        return CANCELLED
    return FAILED


def sweeps_of(jobs: Any) -> SweepManager:
    """The sweep manager of a job manager (one each)."""
    found = getattr(jobs, "_sweeps", None)
    if found is None:
        found = SweepManager(jobs)
        jobs._sweeps = found
    return found


async def advance_sweeps(jobs: Any) -> None:
    """The poller's turn for sweeps: submit what each sweep with held elements may submit
    now (a bounded sweep's next jobs as others end; an array a retry recorded)."""
    sm = sweeps_of(jobs)
    ids = [
        r[0]
        for r in sm.store.query(
            "SELECT DISTINCT e.sweep_id FROM hpc_sweep_elements e JOIN hpc_jobs j ON"
            " j.id = e.job_id JOIN hpc_sweeps s ON s.id = e.sweep_id WHERE s.ready = 1 AND"
            " j.state = ? AND j.native_id IS NULL",
            (SUBMITTING,),
        )
    ]
    for sweep_id in ids:
        try:
            await sm.advance(sweep_id)
        except Exception:
            import logging

            logging.getLogger("jupyter_cloudtik.hpc").exception(
                "sweep %s: cannot submit its next elements", sweep_id
            )


__all__ = ["SweepInfo", "SweepManager", "advance_sweeps", "expand", "read_recorded", "sweeps_of"]
