"""A sweep's results table: one row per element with the values its notebook recorded
(scrapbook's ``glue`` or ``hpc.recording.record``), its outputs, its provenance crate
and where its results are; read bounded, off the event loop."""

from __future__ import annotations

from typing import Any

from ..core.errors import CloudTikError
from ..core.store import loads
from .base import (
    FAILED,
    FINAL_STATES,
    SUCCEEDED,
)
from .notebook_reader import recorded_values

# most bytes of one element's executed notebook the results table reads (its values)
RESULTS_NOTEBOOK_MAX = 16 << 20


class SweepResults:
    """The results table of sweeps (a part of ``SweepManager``)."""

    async def results(self, sweep_id: str, user: str | None = None) -> list[dict[str, Any]]:
        """One row per element: its index, job, state, parameters, the values its notebook
        recorded (scrapbook's ``glue`` or ``hpc.recording.record``) and its outputs.

        Bounded, as this runs in the server (or a hub's sidekick) for whoever asks: each
        executed notebook is read (at most ``RESULTS_NOTEBOOK_MAX``) and parsed off the
        event loop (``notebook_reader.recorded_values``: a worker thread when small, a
        process of its own when large), one element after the other, and all of them
        together at most ``HPC.sweep_results_max_bytes``; a row whose notebook is not read
        says so and why in ``unread`` (its values can still be had by fetching it)."""
        sweep = self._sweep_row(sweep_id, user)
        mgr = self.jobs
        be = mgr.registry.get(sweep["backend"])
        budget = max(0, int(getattr(mgr.hpc, "sweep_results_max_bytes", 64 << 20)))
        left = budget
        out = []
        for r in self._element_rows(sweep["id"]):
            params = loads(r["element_parameters"], {})
            spec = loads(r["spec"], {})
            plan = loads(r["plan"], {})
            row: dict[str, Any] = {
                "element": r["idx"],
                "job": r["id"],
                "state": r["state"],
                **params,
            }
            recorded: dict[str, Any] = {}
            outputs: list[str] = []
            unread: str | None = None
            if r["native_id"] and r["state"] in (SUCCEEDED, FAILED):
                nb_out = plan.get("output_notebook")
                try:
                    listed = await mgr.outputs(r["id"])
                    outputs = [f.name for f in listed if f.name != nb_out and not f.is_dir]
                    if nb_out:
                        size = next((f.size for f in listed if f.name == nb_out), None)
                        data, unread = await self._read_notebook(
                            r["id"], nb_out, size, left, budget
                        )
                        if data is not None:
                            left -= len(data)
                            try:
                                recorded = await recorded_values(data)
                            except CloudTikError as e:  # its reader failed: say so
                                unread = e.message
                except (CloudTikError, OSError):
                    pass  # not there (the job ended before writing): no values
            for k, v in recorded.items():
                row[k if k not in row else f"recorded.{k}"] = v
            row["outputs"] = outputs
            row["crate"] = _crate(mgr, r)
            row["location"] = spec.get("output") or _job_folder(be, r["id"])
            row["reason"] = r["reason"]
            if unread:
                row["unread"] = unread
            out.append(row)
        return out

    async def _read_notebook(
        self, job_id: str, name: str, size: int | None, left: int, budget: int
    ) -> tuple[bytes | None, str | None]:
        """(the executed notebook, None), or (None, why it is not read)."""
        cap = min(RESULTS_NOTEBOOK_MAX, left)
        too_big = (
            f"values not read: its executed notebook {name} is larger than "
            f"{RESULTS_NOTEBOOK_MAX} bytes; fetch it to see them"
        )
        spent = (
            f"values not read: this results table already read {budget - left} bytes of "
            f"executed notebooks (HPC.sweep_results_max_bytes = {budget}); fetch this "
            "element's notebook to see them"
        )
        if size is not None and size > cap:
            return None, too_big if size > RESULTS_NOTEBOOK_MAX else spent
        data = await self.jobs.read_file(job_id, name, cap + 1)
        if len(data) > cap:  # its size was not listed, and it is larger
            return None, too_big if cap == RESULTS_NOTEBOOK_MAX else spent
        return data, None


def _crate(mgr: Any, row: Any) -> str | None:
    """The folder of the element's provenance crate (hpc.provenance), once written."""
    if row["state"] not in FINAL_STATES:
        return None
    for event in reversed(mgr.ops.events(row["op_id"])):
        if event.step == "provenance" and (event.data or {}).get("crate"):
            return str(event.data["crate"])
    return None


def _job_folder(be: Any, job_id: str) -> str:
    folder = getattr(be, "folder", None)
    try:
        where = folder(job_id) if callable(folder) else None
    except Exception:
        where = None
    return f"{be.name}:{where}" if where else f"{be.name}:{job_id}"
