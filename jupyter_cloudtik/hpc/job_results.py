"""What a job left: its log, its outputs, single files, fetching results into the session,
and finalizing a job that ended (the executed notebook's error, the log's tail, the
stage-out, the provenance record).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from pathlib import Path
from typing import Any

from ..core import locations as locs
from ..core.errors import (
    BackendUnavailable,
    CloudTikError,
    ConfigError,
    ConflictError,
    NotFoundError,
)
from ..core.operations import OperationContext
from ..core.store import dumps, loads
from . import notebook as nbtools
from . import provenance
from .base import CANCELLED, FAILED, SUCCEEDED, HPCBackend, JobSpec, JobStatus, LogChunk, OutputFile
from .job_records import (
    STAGE_OUT,
    _ref,
    _target,
    describe_error,
)

log = logging.getLogger("jupyter_cloudtik.hpc")



class JobResults:
    """Logs, outputs, fetching and finalizing (a part of ``JobManager``)."""

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
        await self._finish(job_id, state, reason, **fields)

    async def _log_tail(self, be: HPCBackend, row, lines: int = 3) -> str:
        try:
            chunk = await asyncio.to_thread(be.logs, _ref(row), 0, 1 << 20)
        except Exception:
            return ""
        tail = [ln for ln in chunk.text.strip().splitlines() if ln.strip()][-lines:]
        return ("; log ends with: " + " | ".join(t.strip()[:200] for t in tail)) if tail else ""
