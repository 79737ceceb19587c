"""The staging hand-off: a job's inputs the backend cannot read are copied in by the
session's stagers before submission, and results the backend cannot write are copied out
to the asked location after it succeeded.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from ..core.errors import (
    ConfigError,
    NotFoundError,
)
from ..core.operations import OperationContext
from ..core.store import loads
from .base import (
    Environment,
    HPCBackend,
    JobSpec,
    StageIn,
    Submission,
)
from .job_records import _ref


class JobStaging:
    """Stage-in and stage-out through the stagers (a part of ``JobManager``)."""

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


def _stage_in(d: dict[str, Any]) -> StageIn:
    return StageIn(**{k: d[k] for k in ("name", "source", "mode", "size") if k in d})


def _size(path: Path) -> int | None:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return None
