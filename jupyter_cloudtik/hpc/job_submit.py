"""Submitting a job: check everything, resolve its locations through the caller's policy,
plan who moves each input and the output, record it, then one idempotent submission
attempt (the client token is recorded before the backend is called; a retry first asks
the backend for a job carrying it and adopts it).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import (
    BackendUnavailable,
    CloudTikError,
    ConfigError,
    NotFoundError,
)
from ..core.grants import policy_for
from ..core.identity import acting_as
from ..core.operations import OperationContext
from ..core.store import dumps, loads
from . import notebook as nbtools
from . import script
from .base import (
    CANCELLED,
    FAILED,
    FINAL_STATES,
    QUEUED,
    SUBMITTING,
    CredentialsExpired,
    HPCBackend,
    JobRef,
    JobSpec,
    StageIn,
    check_limits,
)
from .job_records import (
    CANCEL_ASKED,
    STAGE_IN,
    STAGE_SUBMIT,
    _held,
    _target,
)
from .models import JobInfo
from .notebook_reader import notebook_view
from .staging import (
    LocalStager,
    check_output_folder,
    default_name,
    normalize,
    split_named,
)

log = logging.getLogger("jupyter_cloudtik.hpc")



class JobSubmit:
    """Checking, planning and submitting jobs (a part of ``JobManager``)."""

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
                # reading the notebook and papermill's inspection of its parameters cell
                # take a large notebook seconds: off the event loop the server shares
                view = await notebook_view(nb_source)
                warnings = await asyncio.to_thread(_checked_parameters, view, spec)
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
                plan["sweep"] = hold  # stays (held goes once submitted): GET jobs hides it
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
        if env is not None and (env.packages is not None or env.requirements
                                or env.requirements_text):
            # the job's own choice of packages replaces the backend's, not adds to it
            default_env = dataclasses.replace(default_env, packages=None, requirements=None,
                                              requirements_text=None)
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
            await self._finish(job_id, FAILED, f"backend '{name}' is not usable: {e.message}")
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
                await self._finish(job_id, CANCELLED, "cancelled before it started", native_id=nid)
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
            await self._fail(job_id, stage, e)
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


def _checked_parameters(view: dict, spec: JobSpec) -> list[str]:
    """The job's parameters checked against the notebook's parameters cell
    (``notebook_view``: read off the loop); the warnings to show."""
    return nbtools.check_parameters(
        view, spec.parameters, notebook=Path(spec.notebook).name,
        kernel=spec.kernel, allow_unknown=spec.allow_unknown_parameters)


async def _check(stager, location: str, for_output: bool = False) -> None:
    if hasattr(stager, "acheck"):
        await stager.acheck(location, for_output=for_output)
    else:
        await asyncio.to_thread(stager.check, location, for_output=for_output)
