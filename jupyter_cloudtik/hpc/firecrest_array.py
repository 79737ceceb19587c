"""A sweep on a FirecREST system as one Slurm job array (``hpc.sweeps``: ``submit_array``).

FirecREST v2 hands the batch script to ``sbatch`` (``POST /compute/{system}/jobs``), so
``#SBATCH --array=0-N%LIMIT`` is Slurm's own array, its ``%`` limit enforced by Slurm.
Task ``i`` runs element ``i``'s own ``job.sh`` in the element's folder, so every element
keeps the folder, log, markers and outputs of a single job; its native id is ``ARRAY_i``.

What the real FirecREST v2 does with arrays (its source, eth-cscs/firecrest-v2):

* ``GET /compute/{system}/jobs`` runs ``sacct`` and ``squeue`` without ``--array``/``-r``
  (``slurm_cli_client.py`` ``get_jobs``; ``sacct_job_info_command.py``,
  ``squeue_command.py``) and keys the merged answer by ``JobID``.  Run beside it
  (``scripts/firecrest_beside.py``): tasks Slurm has started are listed one by one
  (``123_4``), the tasks still pending as ONE entry under the bare id ``123`` (squeue's
  raw id; reason ``JobArrayTaskLimit`` while the limit is reached), not in Slurm's
  combined form.  ``GET /jobs/123`` shows the combined form (``123_[5-9%2]``) only from
  about a second after submit.  One listing per tick answers for every element of every
  sweep; a task it lacks is asked through ``GET /jobs/<array>`` once per array, and
  read from the bare entry when it is listed nowhere (``_by_array``).
* ``GET`` and ``DELETE /compute/{system}/jobs/{job_id}`` take ``job_id`` with
  ``pattern="^[a-zA-Z0-9]+$"`` (``compute/router.py``): ``123_4`` is refused (400,
  validation), so one task can neither be asked about nor ``scancel``-ed through the API.
  A whole array can (``DELETE .../jobs/123``: ``scancel 123``, every task).  One element
  is cancelled through its folder instead: a marker ``.cloudtik/cancel_requested`` that
  the array's script checks before the element starts and every second while it runs (it
  then ends the element's process group and exits with ``CANCEL_EXIT``), read back as
  CANCELLED.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from ..core.errors import NotFoundError
from . import script
from .base import CANCELLED, FAILED, QUEUED, SUCCEEDED, JobRef, JobStatus, Submission, shell_quote
from .slurm import common_state

CANCEL_EXIT = 251  # an element its cancel marker ended (the array script's exit code)
CANCEL_MARKER = "cancel_requested"
_COMBINED = re.compile(r"^(\d+)_\[([0-9,\-:]+)(?:%\d+)?\]$")


def expand_listing(jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Job id -> FirecREST's entry, an array's combined entry (``123_[2-4,7%2]``) given
    to each of its tasks (``123_2`` ... ``123_7``)."""
    out: dict[str, dict[str, Any]] = {}
    for job in jobs:
        jid = str(job.get("jobId"))
        m = _COMBINED.match(jid)
        if not m:
            out[jid] = job
            continue
        for i in _indices(m.group(2)):
            out.setdefault(f"{m.group(1)}_{i}", {**job, "jobId": f"{m.group(1)}_{i}"})
    return out


def _indices(spec: str) -> list[int]:
    found: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        b, _, step = b.partition(":")
        if a.isdigit() and (not b or b.isdigit()) and (not step or step.isdigit()):
            found += range(int(a), int(b or a) + 1, int(step or 1))
    return found


class FirecrestArrays:
    """Job arrays for ``FirecrestBackend`` (a part of it; see the module's text)."""

    def submit_array(self, key: str, subs: list[Submission], limit: int | None) -> list[str]:
        """One ``sbatch --array=0-N%LIMIT`` through FirecREST whose task ``i`` runs
        ``subs[i]``.  ``key`` names the array's folder; the same key again answers the
        first submission's ids (its marker, or the array FirecREST lists in that folder),
        never a second array."""
        folder = self.folder(key)
        marker = f"{folder}/{script.MARKER_DIR}/submitted"
        native = self._submitted_array(marker, folder)
        if native is None:
            self._call("mkdir", self.system, f"{folder}/{script.MARKER_DIR}",
                       create_parents=True)
            for sub in subs:
                self._prepare(sub)
            text = self._array_script(key, subs, limit, folder)
            self._upload_bytes(folder, "array.sh", text.encode())
            native = self._sbatch(folder, text, subs[0])
            self._upload_bytes(f"{folder}/{script.MARKER_DIR}", "submitted",
                               f"{native}\n".encode())
        return [f"{native}_{i}" for i in range(len(subs))]

    def _submitted_array(self, marker: str, folder: str) -> str | None:
        try:
            done = self._view(marker).strip()
            if done.isdigit():
                return done
        except NotFoundError:
            pass
        for job in self._history():  # the widest time_window (firecrest.py, _history)
            if (job.get("workingDirectory") or "").rstrip("/") == folder:
                return str(job["jobId"]).split("_", 1)[0]
        return None

    def _array_script(self, key: str, subs: list[Submission], limit: int | None,
                      folder: str) -> str:
        own = ("--job-name=", "--output=")
        directives = [d for d in self.directives(subs[0], folder)
                      if not d[len("#SBATCH "):].startswith(own)]
        name = subs[0].name.rsplit("[", 1)[0]
        array = f"0-{len(subs) - 1}" + (f"%{limit}" if limit else "")
        dirs = " ".join(shell_quote(self.folder(s.job_id)) for s in subs)
        mark = f'"$CT_DIR/{script.MARKER_DIR}/{CANCEL_MARKER}"'
        return "\n".join([
            "#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --output={folder}/%a.out",
            f"#SBATCH --array={array}", *directives,
            f"# jupyter_cloudtik job array {key}: task i runs element i's own job.sh; an",
            "# element is cancelled by its marker (FirecREST cannot scancel one task)",
            f"CT_DIRS=({dirs})",
            'CT_DIR="${CT_DIRS[$SLURM_ARRAY_TASK_ID]}"',
            'cd "$CT_DIR" || exit 90',
            f"[ -e {mark} ] && exit {CANCEL_EXIT}",
            f"setsid bash {script.SCRIPT_NAME} >> {script.LOG_NAME} 2>&1 &",
            "CT_PID=$!",
            "trap 'kill -TERM -- -$CT_PID 2>/dev/null' TERM",
            'while kill -0 "$CT_PID" 2>/dev/null; do',
            f"  if [ -e {mark} ]; then",
            "    kill -TERM -- -$CT_PID 2>/dev/null; sleep 2; kill -KILL -- -$CT_PID 2>/dev/null",
            f"    exit {CANCEL_EXIT}",
            "  fi",
            "  sleep 1",
            "done",
            'wait "$CT_PID"', ""])

    def cancel_array(self, jobs: list[JobRef]) -> None:
        """Cancel whole arrays: one ``DELETE /jobs/{array id}`` (``scancel``) each."""
        for array in sorted({j.native_id.split("_", 1)[0] for j in jobs}):
            self.cancel(JobRef("", array))

    def _cancel_element(self, job: JobRef) -> None:
        """One task: its cancel marker (FirecREST refuses ``123_4`` as a job id)."""
        self._upload_bytes(f"{self.folder(job.id)}/{script.MARKER_DIR}", CANCEL_MARKER,
                           b"1\n")
        self._element_cancels.add(job.native_id)

    def _element_cancelled(self, job: JobRef) -> bool:
        if job.native_id in self._element_cancels:
            return True
        try:
            self._view(f"{self.folder(job.id)}/{script.MARKER_DIR}/{CANCEL_MARKER}")
            return True
        except NotFoundError:
            return False

    def _array_task(self, native_id: str, listed: dict[str, dict[str, Any]]
                    ) -> dict[str, Any] | None:
        """A task the list did not show on its own: waiting, while the list's entry under
        the array's bare id is pending (no request); else the whole array asked once
        (``GET /jobs/123``, an id FirecREST takes), its answer kept in ``listed`` for the
        other tasks."""
        base = native_id.split("_", 1)[0]
        pending = _by_array(native_id, listed.get(base))
        if pending is not None:  # the listing's one entry for the array's waiting tasks
            return pending
        key = f"{base}_*"
        if key not in listed:
            try:
                found = self._call("job_info", self.system, base) or []
            except NotFoundError:
                found = []
            listed.update(expand_listing(found))
            listed[key] = {}
        return listed.get(native_id) or _by_array(native_id, listed.get(base))

    def _element_status(self, job: JobRef, st: JobStatus) -> JobStatus:
        """An element ended by its cancel marker is CANCELLED; one cancelled while
        pending is said so at once (its task exits as soon as Slurm starts it)."""
        if st.final and st.exit_code == CANCEL_EXIT:
            self._element_cancels.discard(job.native_id)
            return JobStatus(CANCELLED, "CANCELLED", "cancelled (its cancel marker)",
                             exit_code=st.exit_code)
        if st.state == QUEUED and job.native_id in self._element_cancels:
            return JobStatus(CANCELLED, st.native_state, "cancelled while pending (its task "
                             "exits as soon as Slurm starts it)")
        if st.state in (SUCCEEDED, FAILED):
            self._element_cancels.discard(job.native_id)
        return copy.copy(st)


def _by_array(native_id: str, bare: dict[str, Any] | None) -> dict[str, Any] | None:
    """A task listed nowhere on its own, read from its array's entry under the bare id.
    The real FirecREST v2 lists an array's pending tasks as one entry under the bare id
    (``GET /jobs``), and shows them one by one in ``GET /jobs/<id>`` only from about a
    second after submit (run beside it: ``scripts/firecrest_beside.py``).  While that
    entry is not final the task is waiting (an element is never called lost for it); one
    that ended without running (refused, cancelled while pending) ended the task too.
    Otherwise (the bare id is the last task started, or gone) None: the job's own folder
    says how it ended (``FirecrestBackend._forgotten``)."""
    if not bare:
        return None
    state = (bare.get("status") or {}).get("state") or ""
    if isinstance(state, list):
        state = state[0] if state else ""
    if common_state(state) == QUEUED or never_ran(bare):
        return {**bare, "jobId": native_id}
    return None


def never_ran(job: dict[str, Any]) -> bool:
    """A final job that never had a node: refused at submit (accounting records those as
    FAILED, exit 1, "None assigned") or cancelled while pending."""
    state = (job.get("status") or {}).get("state") or ""
    if isinstance(state, list):
        state = state[0] if state else ""
    if common_state(state) not in (FAILED, CANCELLED):
        return False
    nodes = (job.get("nodes") or "").strip()
    return nodes in ("", "None assigned") or job.get("allocationNodes") == 0
