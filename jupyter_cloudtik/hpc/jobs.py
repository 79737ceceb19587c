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
"""

from __future__ import annotations

import asyncio
import copy
import fnmatch
import getpass
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import (
    CloudTikError,
    ConfigError,
    ConflictError,
    NotFoundError,
    ProviderError,
)
from ..core.grants import policy_for
from ..core.identity import ActsForUser, acting_as
from ..core.ids import resolve_row
from ..core.operations import OperationContext, Operations, Target, owner_alive
from ..core.secrets import SecretStore
from ..core.settings import CloudTik, default_settings
from ..core.store import Store, dumps, loads
from . import notebook as nbtools
from . import provenance, script
from .base import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    FINAL_STATES,
    QUEUED,
    RUNNING,
    STATES,
    SUBMITTING,
    SUCCEEDED,
    UNKNOWN,
    BackendUnavailable,
    CredentialsExpired,
    Environment,
    HPCBackend,
    JobRef,
    JobSpec,
    JobStatus,
    LogChunk,
    OutputFile,
    StageIn,
    Submission,
    check_limits,
)
from .environment import summary as env_summary
from .models import JobInfo
from .settings import HPC, BackendRegistry, hpc_settings
from .staging import (
    LocalStager,
    Stagers,
    check_output_folder,
    default_name,
    normalize,
    split_named,
)

log = logging.getLogger("jupyter_cloudtik.hpc")

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


class JobManager(ActsForUser):
    """Jobs of one state folder; one per process is typical (faces share it)."""

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
        self.ops = Operations(self.store)
        self.secrets = SecretStore(self.store)
        self.user = user or _current_user()
        if stagers is None:
            from .storage_stager import storage_stager

            stagers = Stagers([LocalStager()])
            storage = storage_stager(self.settings, self.store)
            if storage is not None:
                stagers.add(storage)
        self.stagers = stagers
        self.registry = BackendRegistry(self.hpc, self.store.state_dir, self.secrets, log,
                                        self.settings)
        self._submitting: set[str] = set()
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

    # submitting -----------------------------------------------------------------------------
    async def submit(self, spec: JobSpec, backend: str | None = None, *,
                     wait_submitted: bool = True,
                     locations: locs.LocationPolicy | None = None,
                     files: dict[str, bytes] | None = None,
                     hold: str | None = None) -> JobInfo:
        """Check the job, record it, stage its inputs and submit it.

        Everything that can be checked is checked before anything is recorded: the
        backend, the notebook, the resources against the backend's limits, every input
        and the output location, each resolved by ``locations`` (the caller's policy;
        default this manager's).  ``files`` are notebook and input files sent as content
        (``name`` or ``folder/name`` → bytes), from a user's own server to the hub: they
        are written into this job's own folder only, and each top-level entry that is
        not the notebook becomes an input of that name.  Returns once the backend
        accepted the job (state ``queued``) or, if it did not answer, with the job
        ``unknown`` and the reason; with ``wait_submitted=False`` as soon as the job is
        recorded (``submitting``; staging and submitting go on in the background: the
        REST API answers 202).  With ``hold`` (a sweep's id) the job is checked and
        recorded but not submitted: its sweep submits it (``hpc.sweeps``), as one array
        or when its turn comes.
        """
        policy = locations or self.locations
        name = self.registry.resolve(backend)
        be = self.registry.get(name)
        spec = copy.deepcopy(spec)
        job_id = uuid.uuid4().hex[:8]
        content = self._content_entries(files)
        nb = None
        nb_source = None
        warnings: list[str] = []
        try:
            if spec.notebook:
                nb_name = Path(spec.notebook.replace("\\", "/")).name
                if nb_name in content:
                    nb_source = content.pop(nb_name)
                    spec.notebook = locs.check_text(spec.notebook, "notebook")
                else:
                    where = self._locate(spec.notebook, "notebook", policy)
                    if not where.is_local:
                        raise ConfigError(
                            f"notebook: {spec.notebook!r} is not a local notebook file "
                            "(stage it as an input and run a command instead)",
                            field="notebook")
                    spec.notebook = nb_source = where.text
            elif not spec.command:
                raise ConfigError("give a notebook or a command to run", field="notebook")
            if nb_source is not None:
                nb = nbtools.check_notebook(nb_source) if not isinstance(nb_source, bytes) \
                    else _notebook_json(nb_source)
                warnings = nbtools.check_parameters(
                    nb, spec.parameters, notebook=Path(spec.notebook).name,
                    kernel=spec.kernel, allow_unknown=spec.allow_unknown_parameters)
            elif spec.parameters:
                first = next(iter(spec.parameters))
                raise ConfigError(
                    f"parameters.{first}: {spec.parameters[first]!r} has nowhere to go: "
                    "parameters are for notebooks (papermill), not commands; pass them "
                    "as arguments or --env instead", field=f"parameters.{first}")
            spec.inputs = [self._locate_input(item, policy) for item in spec.inputs]
            if spec.output:
                spec.output = self._locate_output(spec.output, policy)
            if not spec.name:
                spec.name = Path(spec.notebook).stem if spec.notebook else Path(
                    str(spec.command[0])).name
            said = await asyncio.to_thread(self._validate, be, spec)
            if said:
                warnings = [*warnings, said]
            sent = self._write_content(job_id, content, nb_name if isinstance(
                nb_source, bytes) else None, nb_source if isinstance(nb_source, bytes)
                else None)
            if sent.get("notebook"):
                nb_source = sent.pop("notebook")
            plan = await self._plan(be, spec, nb_source, sent)
            if warnings:
                plan["warnings"] = warnings
            if hold:
                plan["held"] = hold
        except BaseException:
            shutil.rmtree(self._content_dir(job_id), ignore_errors=True)
            raise
        token = uuid.uuid4().hex
        now = time.time()
        op = self.ops.start("hpc.job", _target(job_id),
                            {"backend": name, "name": spec.name, "kind": spec.kind},
                            user=self.user, exclusive=False)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hpc_jobs (id, name, backend, backend_type, kind, client_token,"
                " state, spec, plan, op_id, user, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, spec.name, name, be.kind, spec.kind, token, SUBMITTING,
                 dumps(spec.to_dict()), dumps(plan), op.id, self.user, now, now))
        self.ops.emit(op.id, "recorded", f"job {job_id} ({spec.name}) for backend '{name}'",
                      0.05, data={"job": job_id, "state": SUBMITTING})
        for text in warnings:
            log.warning("job %s: %s", job_id, text)
            self.ops.emit(op.id, "warning", text, level="warning", data={"job": job_id})
        if hold:
            return self.get(job_id)
        if wait_submitted:
            await self._isolated(job_id, STAGE_SUBMIT, self._submit(job_id))
            self._wake(name)
        else:
            task = asyncio.get_running_loop().create_task(self._submit_then_wake(job_id, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return self.get(job_id)

    # locations -------------------------------------------------------------------------------
    def _is_storage(self, name: str) -> bool:
        return any(not isinstance(s, LocalStager) and s.handles(f"{name}:")
                   for s in self.stagers.stagers)

    def _locate(self, text: str, field: str, policy: locs.LocationPolicy, *,
                write: bool = False) -> locs.Resolved:
        """One location of a job through the caller's policy (core.locations)."""
        return locs.resolve(text, field, policy, write=write, is_storage=self._is_storage,
                            backends=self.registry.names())

    def _locate_input(self, item: str, policy: locs.LocationPolicy) -> str:
        locs.check_text(item, "inputs")
        given, loc = split_named(item)
        if given is not None:
            locs.check_file_name(given, "inputs")
        where = self._locate(loc, "inputs", policy)
        if where.is_local:
            path = Path(where.text)
            if not path.exists():
                raise NotFoundError(f"inputs: {loc!r} does not exist", field="inputs")
            policy.check_tree(path, "inputs")
        return f"{given}={where.text}" if given else where.text

    def _locate_output(self, text: str, policy: locs.LocationPolicy) -> str:
        """Where results land, resolved like the inputs (the caller's policy, for
        writing); a local folder must be one results can be written into: not under a
        system folder (``/proc``, ``/sys``, ``/dev``) or a file, not read-only."""
        where = self._locate(text, "output", policy, write=True)
        if where.is_local:
            check_output_folder(Path(where.text), where.given, "output")
        return where.text

    @staticmethod
    def _content_entries(files: dict[str, bytes] | None) -> dict[str, Any]:
        """Sent files by top-level name: bytes for a file, {sub path: bytes} for a folder."""
        out: dict[str, Any] = {}
        for key, data in (files or {}).items():
            locs.check_file_name(key, "files")
            top, _, rest = key.partition("/")
            if rest:
                folder = out.setdefault(top, {})
                if not isinstance(folder, dict):
                    raise ConfigError(f"files: {top!r} is sent as a file and a folder",
                                      field="files")
                folder[rest] = data
            else:
                if top in out:
                    raise ConfigError(f"files: {top!r} is sent twice", field="files")
                out[top] = data
        return out

    def _content_dir(self, job_id: str) -> Path:
        return self.store.state_dir / "hpc" / "content" / job_id

    def _write_content(self, job_id: str, content: dict[str, Any], nb_name: str | None,
                       nb_data: bytes | None) -> dict[str, Any]:
        """Write sent files into this job's own content folder (nowhere else)."""
        out: dict[str, Any] = {}
        if not content and nb_data is None:
            return out
        base = self._content_dir(job_id)
        base.mkdir(parents=True, exist_ok=True)
        if nb_data is not None and nb_name is not None:
            path = base / ".notebook" / nb_name
            path.parent.mkdir()
            path.write_bytes(nb_data)
            out["notebook"] = str(path)
        for top, data in content.items():
            target = base / top
            if isinstance(data, dict):
                for rest, chunk in data.items():
                    f = target / rest
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_bytes(chunk)
            else:
                target.write_bytes(data)
            out.setdefault("inputs", {})[top] = str(target)
        return out

    async def _submit_then_wake(self, job_id: str, backend: str) -> None:
        try:
            await self._isolated(job_id, STAGE_SUBMIT, self._submit(job_id))
        finally:
            self._wake(backend)

    def _validate(self, be: HPCBackend, spec: JobSpec) -> str | None:
        """Check the job against the system's limits; when the system cannot tell them
        now, against the configured ones, and say so (returned: the job's warning) —
        a check that ran on less than usual is not silent."""
        try:
            be.validate(spec)
        except BackendUnavailable as e:
            # it will be submitted when the backend answers
            check_limits(spec, HPCBackend.limits(be), be.name)
            why = (f": {e.message} —" if isinstance(e, CredentialsExpired)
                   else f" did not answer ({e.message}):")
            return (f"backend '{be.name}'{why} the job was checked against the configured "
                    "limits only; the system may still refuse it")
        return None

    async def _plan(self, be: HPCBackend, spec: JobSpec, nb_source: Any = None,
                    sent: dict[str, Any] | None = None) -> dict[str, Any]:
        """Decide, for every input and the output, who moves it; refuse the impossible.

        Locations are already resolved (``submit``); ``sent`` are files sent as content,
        always uploaded from this job's own content folder."""
        env = spec.environment
        default_env = await asyncio.to_thread(be.default_environment)
        environment = default_env if env is None else \
            default_env.merged({k: v for k, v in env.__dict__.items() if v})
        environment = await asyncio.to_thread(be.prepare_environment, environment, env)
        files: dict[str, str] = {}
        output_notebook = None
        if spec.notebook:
            nb_name = Path(spec.notebook).name
            files[nb_name] = nb_source or spec.notebook
            output_notebook = script.output_notebook_name(nb_name)
        names = set(files) | set(script.SCAFFOLDING) | {script.LOG_NAME}
        inputs: list[dict[str, Any]] = []
        for nm, path in ((sent or {}).get("inputs") or {}).items():
            if nm in names:
                raise ConfigError(f"files: {nm!r} clashes with the job's own files",
                                  field="files")
            names.add(nm)
            inputs.append({**StageIn(nm, path, "upload").__dict__, "sent": True})
        for item in spec.inputs:
            given, loc = split_named(item)
            loc = normalize(loc)
            nm = given or default_name(loc)
            if nm in names:
                raise ConfigError(
                    f"inputs: two inputs (or an input and the job's own files) are named "
                    f"{nm!r}; rename one with NAME=LOCATION", field="inputs")
            names.add(nm)
            stager = self.stagers.for_location(loc)
            if await asyncio.to_thread(be.can_reach, loc):
                if stager is not None:
                    await _check(stager, loc)
                inputs.append(StageIn(nm, loc, "direct").__dict__)
                continue
            if stager is None:
                reach = ", ".join(await asyncio.to_thread(be.directly_reachable)) or \
                    "nothing directly"
                raise ConfigError(
                    f"inputs: backend '{be.name}' cannot read {loc!r} (it reaches {reach}) "
                    "and this session has no storage that can stage it", field="inputs")
            await _check(stager, loc)
            inputs.append(StageIn(nm, loc, "upload").__dict__)
        stage_out = output_via_session = None
        if spec.output:
            out = normalize(spec.output)
            stager = self.stagers.for_location(out)
            if await asyncio.to_thread(be.can_reach, out):
                if stager is not None:
                    await _check(stager, out, for_output=True)
                stage_out = out
            elif stager is not None:
                await _check(stager, out, for_output=True)
                output_via_session = out
            else:
                raise ConfigError(
                    f"output: backend '{be.name}' cannot write to {out!r} and this session "
                    "has no storage that can copy results there", field="output")
        return {"files": files, "inputs": inputs, "output_notebook": output_notebook,
                "stage_out": stage_out, "output_via_session": output_via_session,
                "environment": environment.__dict__}

    async def _submit(self, job_id: str) -> None:
        """One submission attempt (also the retry after a backend was down)."""
        if job_id in self._submitting:
            return
        self._submitting.add(job_id)
        try:
            with self._as_owner(self._row(job_id)):  # its inputs are read for its owner
                await self._submit_once(job_id)
        finally:
            self._submitting.discard(job_id)

    def _as_owner(self, row: Any) -> Any:
        """Act as the job's owner (the poller works for everybody): what its stage-in
        and stage-out may use is the access policy's decision for them."""
        return acting_as(policy_for(self.store).caller(row["user"] or self._own_user))

    async def _submit_once(self, job_id: str) -> None:
        row = self._row(job_id)
        if row["native_id"] or row["state"] in FINAL_STATES:
            return
        if _held(row) and not row["cancel_requested"]:
            return  # its sweep submits it (hpc.sweeps)
        ctx = OperationContext(self.ops, row["op_id"])
        name = row["backend"]
        try:
            be = self.registry.get(name)
        except CloudTikError as e:
            self._finish(job_id, FAILED, f"backend '{name}' is not usable: {e.message}")
            return
        attempts = self._record_attempt(job_id)
        token, plan = row["client_token"], loads(row["plan"], {})
        nid = None
        stage = STAGE_SUBMIT
        try:
            if attempts > 1:
                nid = await asyncio.to_thread(be.find, token, job_id)
                self._came_back(row)
                row = self._row(job_id)
                if nid:
                    ctx.progress("submit", f"found the job a previous attempt submitted: {nid}",
                                 native_id=nid)
            if row["cancel_requested"]:
                if nid:
                    await asyncio.to_thread(be.cancel, JobRef(job_id, nid))
                self._finish(job_id, CANCELLED, "cancelled before it started", native_id=nid)
                return
            if nid is None:
                stage = STAGE_IN
                sub = await self._stage_inputs(job_id, row, plan, ctx)
                stage = STAGE_SUBMIT
                ctx.progress("submit", f"submitting to '{name}' ({be.kind})", 0.5)
                nid = await asyncio.to_thread(be.submit, sub)
                self._came_back(row)
        except BackendUnavailable as e:
            if isinstance(e, CredentialsExpired):  # not silent: waiting for new credentials
                reason = (f"backend '{name}': {e.message}; the job will be submitted when "
                          "they are renewed")
            else:
                reason = (f"backend '{name}' did not answer ({e.message}); the job will be "
                          "submitted when it does")
            self._went_unavailable(self._row(job_id), reason)
            self._backoff(name)
            return
        except Exception as e:  # a refusal, a bug or an SDK surprise: fail this job only
            self._fail(job_id, stage, e)
            return
        finally:
            staging = self._staging_dir(job_id)
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(self._content_dir(job_id), ignore_errors=True)
        now = time.time()
        self._update(job_id, native_id=str(nid), state=QUEUED, reason=None, submitted_at=now)
        ctx.progress("submitted", f"submitted to '{name}' as job {nid}", 0.6,
                     native_id=str(nid), state=QUEUED)
        row = self._row(job_id)
        if row["cancel_requested"] == CANCEL_ASKED:  # asked while it was being submitted
            await self._deliver_cancel(row)

    def _record_attempt(self, job_id: str) -> int:
        with self.store.transaction() as conn:
            conn.execute("UPDATE hpc_jobs SET submit_attempts = submit_attempts + 1,"
                         " updated_at = ? WHERE id = ?", (time.time(), job_id))
            return conn.execute("SELECT submit_attempts FROM hpc_jobs WHERE id = ?",
                                (job_id,)).fetchone()[0]

    def _staging_dir(self, job_id: str) -> Path:
        return self.store.state_dir / "hpc" / "staging" / job_id

    async def _stage_inputs(self, job_id: str, row, plan: dict[str, Any],
                            ctx: OperationContext) -> Submission:
        spec = JobSpec.from_dict(loads(row["spec"]))
        for nb_name, local in (plan.get("files") or {}).items():
            if not Path(local).is_file():  # checked at submit; a retry may come much later
                raise NotFoundError(f"notebook {nb_name!r}: {local} no longer exists",
                                    field="notebook")
        inputs = []
        items = [_stage_in(i) for i in plan.get("inputs", [])]
        to_stage = [i for i in items if i.mode == "upload"]
        for n, item in enumerate(items):
            if item.mode != "upload":
                inputs.append(item)
                continue
            stager = self.stagers.for_location(item.source)
            if stager is None:
                raise ConfigError(f"inputs: nothing can stage {item.source!r}", field="inputs")
            base = 0.1 + 0.35 * n / max(1, len(to_stage))

            def progress(fraction: float, message: str, _base=base) -> None:
                ctx.progress("stage-in", message,
                             _base + 0.35 * fraction / max(1, len(to_stage)))

            dest = self._staging_dir(job_id) / item.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if hasattr(stager, "adownload"):
                span = 0.35 / max(1, len(to_stage))
                local = await stager.adownload(item.source, dest, ctx, (base, base + span))
            else:
                ctx.progress("stage-in", f"{item.name}: {item.source}", base)
                local = await asyncio.to_thread(stager.download, item.source, dest, progress)
            if not Path(local).exists():  # it was there at submit
                raise NotFoundError(f"input {item.name!r}: {item.source} no longer exists",
                                    field="inputs")
            size = _size(local)
            inputs.append(StageIn(item.name, str(local), "upload", size))
        env = Environment(**plan["environment"])
        return Submission(job_id=job_id, token=row["client_token"], spec=spec,
                          environment=env, files=plan.get("files", {}), inputs=inputs,
                          output_notebook=plan.get("output_notebook"),
                          stage_out=plan.get("stage_out"))

    # reading ------------------------------------------------------------------------------
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
             limit: int = 100, user: str | None = None) -> list[JobInfo]:
        sql, params = "SELECT * FROM hpc_jobs", []
        clauses = []
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
            warnings=list(plan.get("warnings") or []),
            environment=env_summary(plan.get("environment")),
            op_id=row["op_id"], user=row["user"], created_at=row["created_at"],
            updated_at=row["updated_at"], submitted_at=row["submitted_at"],
            started_at=row["started_at"], finished_at=row["finished_at"])

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

    async def logs(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        row = self._row(job_id)
        if not row["native_id"]:
            return LogChunk("", offset, eof=True)
        be = self.registry.get(row["backend"])
        chunk = await asyncio.to_thread(be.logs, _ref(row), offset, limit)
        return chunk

    async def outputs(self, job_id: str) -> list[OutputFile]:
        row = self._row(job_id)
        if not row["native_id"]:
            return []
        be = self.registry.get(row["backend"])
        return await asyncio.to_thread(be.list_outputs, _ref(row))

    async def read_file(self, job_id: str, name: str, limit: int = 16 << 20) -> bytes:
        locs.check_file_name(name, "name")
        row = self._row(job_id)
        if not row["native_id"]:
            raise ConflictError(f"job {row['id']} was never submitted", field="job")
        be = self.registry.get(row["backend"])
        return await asyncio.to_thread(be.read_file, _ref(row), name, limit)

    async def fetch(self, job_id: str, dest: str | os.PathLike[str] | None = None,
                    names: list[str] | None = None, *,
                    locations: locs.LocationPolicy | None = None) -> list[Path]:
        """Copy the executed notebook and the declared outputs into the session (``dest``
        resolved by the caller's policy; default ``<results_dir>/<job id>``)."""
        for n in names or []:
            locs.check_file_name(n, "files")
        row = self._row(job_id)
        job_id = row["id"]
        target = self.fetch_dest(job_id, dest, locations=locations)
        if not row["native_id"]:
            raise ConflictError(f"job {job_id} was never submitted; there is nothing to fetch",
                                field="job")
        spec = JobSpec.from_dict(loads(row["spec"]))
        plan = loads(row["plan"], {})
        be = self.registry.get(row["backend"])
        op = self.ops.start("hpc.fetch", _target(job_id), {"dest": str(target)},
                            user=self.user, exclusive=False)
        ctx = OperationContext(self.ops, op.id)
        try:
            listing = await asyncio.to_thread(be.list_outputs, _ref(row))
            wanted = names or self._wanted_outputs(listing, spec, plan)
            ctx.progress("list", f"{len(wanted)} file(s) to fetch", 0.1)
            paths = await asyncio.to_thread(be.fetch_outputs, _ref(row), target, wanted)
        except CloudTikError as e:
            self.ops.finish(op.id, "failed", e.message, {"error": e.to_dict()})
            raise
        self.ops.finish(op.id, "succeeded", result={"paths": [str(p) for p in paths]})
        return paths

    def fetch_dest(self, job_id: str, dest: str | os.PathLike[str] | None = None, *,
                   locations: locs.LocationPolicy | None = None) -> Path:
        """The folder results of ``job_id`` are fetched into, by the caller's policy."""
        policy = locations or self.locations
        where = self._locate(os.fspath(dest) if dest else
                             f"{self.hpc.results_dir}/{job_id}", "dest", policy, write=True)
        if not where.is_local:
            raise ConfigError(f"dest: {where.given!r} is not a local folder; results are "
                              "fetched into a folder (use output= for storages)",
                              field="dest")
        return Path(where.text)

    @staticmethod
    def _wanted_outputs(listing: list[OutputFile], spec: JobSpec,
                        plan: dict[str, Any]) -> list[str]:
        names = [f.name for f in listing]
        if not spec.outputs:
            return names
        wanted = []
        nb_out = plan.get("output_notebook")
        for n in names:
            if n == nb_out or any(fnmatch.fnmatch(n, p) for p in spec.outputs):
                wanted.append(n)
        return wanted

    def events(self, job_id: str, after: int = 0):
        return self.ops.events(self._row(job_id)["op_id"], after=after)

    # updating -----------------------------------------------------------------------------
    def _update(self, job_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE hpc_jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def _finish(self, job_id: str, state: str, reason: str | None = None,
                **fields: Any) -> None:
        row = self._row(job_id)
        if row["state"] in FINAL_STATES:
            return
        shutil.rmtree(self._content_dir(job_id), ignore_errors=True)
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
            from ..core.operations import _process_start_time

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
        from .sweeps import advance_sweeps  # sweeps sit on top of jobs

        await advance_sweeps(self)

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
            self._fail(r["id"], STAGE_POLL, e)
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
            self._fail(job_id, stage, e)
            return True

    def _fail(self, job_id: str, stage: str, error: BaseException) -> None:
        """End one job ``failed`` with ``<stage> failed: <cause>``; if even that cannot be
        recorded, this process leaves the job alone (no error every round)."""
        reason = f"{stage} failed: {describe_error(error)}"
        if isinstance(error, CloudTikError):
            log.info("job %s: %s", job_id, reason)
        else:  # a bug or a library's surprise: its traceback belongs in the log
            log.warning("job %s: %s", job_id, reason, exc_info=error)
        try:
            self._finish(job_id, FAILED, reason)
        except Exception:
            log.exception("job %s: cannot record that it failed; left alone from now on",
                          job_id)
            self._broken[job_id] = reason

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

    async def _finalize(self, row, st: JobStatus) -> None:
        job_id = row["id"]
        be = self.registry.get(row["backend"])
        plan = loads(row["plan"], {})
        state, reason, error = st.state, st.message, None
        ctx = OperationContext(self.ops, row["op_id"])
        if row["kind"] == "notebook" and state in (SUCCEEDED, FAILED) \
                and plan.get("output_notebook"):
            try:
                data = await asyncio.to_thread(be.read_file, _ref(row),
                                               plan["output_notebook"])
                error = nbtools.find_error(data)
            except NotFoundError:
                if state == FAILED:
                    reason = (reason or "failed") + "; no executed notebook (the job ended " \
                        "before papermill wrote one)" + await self._log_tail(be, row)
            except BackendUnavailable:
                raise
            except CloudTikError as e:
                log.warning("job %s: cannot read the executed notebook: %s", job_id, e.message)
            if error:
                state = FAILED
                reason = nbtools.describe_error(error)
        elif state == FAILED and not error:
            reason = (reason or "failed") + await self._log_tail(be, row)
        if state == SUCCEEDED and plan.get("output_via_session"):
            location = plan["output_via_session"]
            try:
                await self._stage_out(row, be, plan, ctx)
            except BackendUnavailable:
                raise
            except Exception as e:  # the job ran, but its results are not where asked
                cause = describe_error(e)
                if location not in cause:
                    cause = f"copying results to {location}: {cause}"
                if not isinstance(e, CloudTikError):
                    log.warning("job %s: stage-out failed", job_id, exc_info=e)
                state = FAILED
                reason = f"{STAGE_OUT} failed: {cause}"
        fields = {"native_state": st.native_state, "exit_code": st.exit_code}
        if error:
            fields["error"] = dumps(error)
        if not row["started_at"] and state != CANCELLED:
            fields["started_at"] = row["submitted_at"]
        await provenance.record(self, row, be, state, reason, st.exit_code)
        self._finish(job_id, state, reason, **fields)

    async def _log_tail(self, be: HPCBackend, row, lines: int = 3) -> str:
        try:
            chunk = await asyncio.to_thread(be.logs, _ref(row), 0, 1 << 20)
        except Exception:
            return ""
        tail = [ln for ln in chunk.text.strip().splitlines() if ln.strip()][-lines:]
        return ("; log ends with: " + " | ".join(t.strip()[:200] for t in tail)) if tail else ""

    async def _stage_out(self, row, be: HPCBackend, plan: dict[str, Any],
                         ctx: OperationContext) -> None:
        location = plan["output_via_session"]
        stager = self.stagers.for_location(location)
        if stager is None:
            raise ConfigError(f"output: nothing can copy results to {location!r}",
                              field="output")
        spec = JobSpec.from_dict(loads(row["spec"]))
        ctx.progress("stage-out", f"copying results to {location}", 0.9)
        tmp = self._staging_dir(row["id"]) / "out"
        try:
            listing = await asyncio.to_thread(be.list_outputs, _ref(row))
            wanted = self._wanted_outputs(listing, spec, plan)
            paths = await asyncio.to_thread(be.fetch_outputs, _ref(row), tmp, wanted)
            tops = sorted({tmp / Path(p).relative_to(tmp).parts[0] for p in paths})
            for n, top in enumerate(tops):
                lo, hi = 0.9 + 0.09 * n / len(tops), 0.9 + 0.09 * (n + 1) / len(tops)
                if hasattr(stager, "aupload"):
                    await stager.aupload(top, location, ctx, (lo, hi))
                    continue
                await asyncio.to_thread(
                    stager.upload, top, location,
                    lambda f, m, _lo=lo, _hi=hi: ctx.progress("stage-out", m,
                                                              _lo + (_hi - _lo) * f))
        finally:
            shutil.rmtree(self._staging_dir(row["id"]), ignore_errors=True)
        ctx.progress("stage-out", f"results are in {location}", 0.99)

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


async def _check(stager, location: str, for_output: bool = False) -> None:
    if hasattr(stager, "acheck"):
        await stager.acheck(location, for_output=for_output)
    else:
        await asyncio.to_thread(stager.check, location, for_output=for_output)


def _stage_in(d: dict[str, Any]) -> StageIn:
    return StageIn(**{k: d[k] for k in ("name", "source", "mode", "size") if k in d})


def _public_input(d: dict[str, Any]) -> dict[str, Any]:
    """An input as its job shows it: a sent file by its name, not by where the content
    folder is on this machine."""
    if d.get("sent"):
        return {**d, "source": f"sent:{d['name']}"}
    return d


def _notebook_json(data: bytes) -> dict[str, Any]:
    import json

    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"notebook: the sent notebook is not JSON ({e})",
                          field="notebook") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) \
            or nb.get("nbformat", 0) < 4:
        raise ConfigError("notebook: the sent notebook is not a version-4 notebook",
                          field="notebook")
    return nb


def _held(row) -> bool:
    """Recorded for a sweep that submits it itself (``submit(hold=...)``)."""
    return bool(loads(row["plan"], {}).get("held"))


def _ref(row) -> JobRef:
    return JobRef(row["id"], row["native_id"])


def _statuses(got: Any, backend: str) -> dict[str, Any]:
    if not isinstance(got, dict):
        raise ProviderError(f"backend '{backend}' answered a poll with {type(got).__name__}, "
                            "not the jobs' states")
    return got


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


def _size(path: Path) -> int | None:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return None


def _current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


__all__ = ["JobManager", "ProviderError"]
