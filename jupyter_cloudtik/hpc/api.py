"""The Python API: ``Job.submit("analysis.ipynb", backend="daint", parameters={...})``.

A ``Job`` is an id plus the jobs client; what it shows comes from the state store, so a
job object made in one kernel describes the same job another kernel or the CLI submitted.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from ..core.errors import CloudTikError, ConfigError, ConflictError
from ..core.units import format_duration
from . import provenance
from .base import FINAL_STATES
from .client import JobsClient, get_jobs_client
from .commands import build_spec, job_text, jobs_table, sweep_text
from .models import JobInfo
from .sweeps import SweepInfo

BADGE_COLORS = {
    "submitting": "#6c757d", "queued": "#0d6efd", "running": "#fd7e14",
    "succeeded": "#198754", "failed": "#dc3545", "cancelled": "#6c757d",
    "unknown": "#ffc107",
}


class Job:
    def __init__(self, job_id: str, client: JobsClient | None = None,
                 info: JobInfo | None = None) -> None:
        self.client = client or get_jobs_client()
        self._info = info or self.client.get(job_id)
        self.id = self._info.id
        # for a rerun: what differed from the recorded run when it was submitted
        self.differences: list[str] = []

    # constructors -------------------------------------------------------------------------
    @classmethod
    def submit(cls, notebook: str | None = None, *, command: str | list[str] | None = None,
               backend: str | None = None, parameters: dict[str, Any] | None = None,
               wait: bool = False, client: JobsClient | None = None, **options: Any) -> Job:
        """Submit a notebook (or a command) as a job.

        ``options``: name, nodes, cpus, tasks_per_node, memory ("4GiB"), time ("30m"),
        queue, account, reservation, inputs (locations), outputs (glob patterns), output
        (a location), container, python, packages ("session", "system" or names: the
        job's environment, docs/hpc.md), requirements (a requirements or lock file: its
        packages, built), kernel, env (dict), allow_unknown_parameters
        (a parameter the notebook's parameters cell does not assign is a warning on the
        job, not a ``ConfigError``).
        """
        client = client or get_jobs_client()
        spec = build_spec(notebook, command, parameters=parameters, **options)
        job = cls(client.submit(spec, backend).id, client)
        if wait:
            job.wait()
        return job

    @classmethod
    def sweep(cls, notebook: str, grid: dict[str, list[Any]] | None = None, *,
              zip: dict[str, list[Any]] | None = None,
              elements: list[dict[str, Any]] | None = None, backend: str | None = None,
              parameters: dict[str, Any] | None = None, max_concurrent: int | None = None,
              wait: bool = False, client: JobsClient | None = None,
              **options: Any) -> Sweep:
        """Run ``notebook`` once per element of a parameter sweep, watched as one thing.

        ``grid``: every combination of the values (``{"alpha": [0.1, 0.2], "n": [10,
        100]}`` is 4 elements); ``zip``: values taken pairwise (lists of one length);
        ``elements``: a list of parameter dicts, as given.  ``parameters`` are shared by
        all elements.  Every element is checked against the notebook before anything is
        submitted; on Slurm and FirecREST the sweep is one job array
        (``--array=0-N%max_concurrent``), elsewhere at most ``max_concurrent`` jobs run
        at once (default ``HPC.sweep_max_concurrent``).  ``options`` are ``Job.submit``'s.
        """
        client = client or get_jobs_client()
        spec = build_spec(notebook, None, parameters=parameters, **options)
        info = client.sweep(spec, backend, grid=grid, zip=zip, elements=elements,
                            max_concurrent=max_concurrent)
        sweep = Sweep(info.id, client, info)
        if wait:
            sweep.wait()
        return sweep

    @classmethod
    def get(cls, job_id: str, client: JobsClient | None = None) -> Job:
        return cls(job_id, client)

    @classmethod
    def list(cls, active_only: bool = False, backend: str | None = None,
             client: JobsClient | None = None) -> JobList:
        client = client or get_jobs_client()
        return JobList([cls(i.id, client, i) for i in client.list(active_only, backend)])

    # state ------------------------------------------------------------------------------------
    @property
    def info(self) -> JobInfo:
        self._info = self.client.get(self.id)
        return self._info

    @property
    def state(self) -> str:
        return self.info.state

    def refresh(self) -> JobInfo:
        self._info = self.client.refresh(self.id)
        return self._info

    def wait(self, timeout: float | None = None) -> JobInfo:
        self._info = self.client.wait(self.id, timeout)
        return self._info

    # actions ----------------------------------------------------------------------------------
    def logs(self, follow: bool = False) -> str:
        if follow:
            parts = []
            for text in self.client.follow_logs(self.id):
                print(text, end="", flush=True)
                parts.append(text)
            return "".join(parts)
        return self.client.logs(self.id).text

    def cancel(self) -> JobInfo:
        self._info = self.client.cancel(self.id)
        return self._info

    def outputs(self) -> list[str]:
        return [f.name for f in self.client.outputs(self.id)]

    def fetch(self, dest: str | Path | None = None) -> list[Path]:
        """Copy the executed notebook and the outputs into the session."""
        return self.client.fetch(self.id, dest)

    # provenance -------------------------------------------------------------------------------
    @property
    def crate(self) -> Path | None:
        """The folder of this job's provenance crate (an RO-Crate, written when the job
        ended, where ``fetch`` puts its results); None while it runs."""
        for event in reversed(self.client.events(self.id)):
            if event.step == "provenance" and (event.data or {}).get("crate"):
                return Path(event.data["crate"])
        return None

    @classmethod
    def rerun(cls, crate: str | Path | Job, *, backend: str | None = None,
              wait: bool = False, client: JobsClient | None = None,
              quiet: bool = False, trust: bool = False) -> Job:
        """Run a recorded job again: the same notebook (from where it came, or the
        crate's copy if that is gone), parameters and inputs, on the same backend (or
        ``backend``).  What differs now from the record (the notebook's or a local
        input's checksum, this session's package versions) is printed before it is
        submitted and kept as the new job's ``differences``.

        A crate this state folder did not make (or one changed since) is someone else's
        description of a run: it is refused, with what it would run, unless ``trust``
        (read it first)."""
        client = client or get_jobs_client()
        if isinstance(crate, str) and not Path(crate).expanduser().exists():
            crate = _job_or_none(crate, client) or crate  # a job id: its crate
        if isinstance(crate, Job):
            found = crate.crate
            if found is None:
                raise ConflictError(f"crate: job {crate.id} has no provenance crate (it has "
                                    "not ended, or its crate could not be written)",
                                    field="crate")
            crate = found
        recorded = provenance.read(crate)
        spec, recorded_backend = provenance.rerun_spec(recorded)
        if not trust and not provenance.made_here(crate, recorded, client):
            raise ConfigError(
                f"crate: job {recorded.get('id')} was not run from this state folder as its "
                "crate records it (a crate from elsewhere, or changed since); a rerun would "
                f"run {provenance.describe_run(spec, backend or recorded_backend)}. Read "
                "it, then rerun with trust=True (--trust)", field="crate")
        diffs = provenance.differences(recorded)
        if not quiet:
            print(f"rerun of job {recorded['id']}: "
                  + ("nothing differs from the record" if not diffs else "differs from "
                     "the record:\n  " + "\n  ".join(diffs)))
        job = cls(client.submit(spec, backend or recorded_backend).id, client)
        job.differences = diffs
        if not quiet:
            print(f"submitted as job {job.id} on {job._info.backend}")
        if wait:
            job.wait()
        return job

    # display ----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        i = self._info
        return f"<Job {i.id} {i.name!r} {i.state_label} on {i.backend}>"

    def __str__(self) -> str:
        return job_text(self._info)

    def _repr_html_(self) -> str:
        return _html_rows([self.info], detail=True)


class Sweep:
    """A parameter sweep: its state, counts and elements come from the state store."""

    def __init__(self, sweep_id: str, client: JobsClient | None = None,
                 info: SweepInfo | None = None) -> None:
        self.client = client or get_jobs_client()
        self._info = info or self.client.get_sweep(sweep_id)
        self.id = self._info.id

    @classmethod
    def get(cls, sweep_id: str, client: JobsClient | None = None) -> Sweep:
        return cls(sweep_id, client)

    @property
    def info(self) -> SweepInfo:
        self._info = self.client.get_sweep(self.id)
        return self._info

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def counts(self) -> dict[str, int]:
        return self.info.counts

    def element(self, index: int) -> Job:
        """Element ``index``'s current job (its logs, outputs, fetch)."""
        for e in self.info.elements:
            if e["index"] == index:
                return Job(e["job"], self.client)
        raise IndexError(f"the sweep has no element {index}")

    def wait(self, timeout: float | None = None) -> SweepInfo:
        self._info = self.client.wait_sweep(self.id, timeout)
        return self._info

    def cancel(self, element: int | None = None) -> SweepInfo:
        """Cancel the whole sweep, or only element ``element``."""
        self._info = self.client.cancel_sweep(self.id, element)
        return self._info

    def retry(self) -> SweepInfo:
        """Resubmit only the elements that failed (each as a new job)."""
        self._info = self.client.retry_sweep(self.id)
        return self._info

    def results(self) -> Any:
        """One row per element: index, job, state, its parameters, the values its notebook
        recorded (``record(name, value)`` or scrapbook's ``glue``), its outputs and where
        they are: a pandas DataFrame when pandas is installed, else a list of dicts."""
        rows = self.client.sweep_results(self.id)
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows).set_index("element") if rows else pd.DataFrame(rows)

    def __repr__(self) -> str:
        i = self._info
        return f"<Sweep {i.id} {i.name!r} {i.state} {_counts(i.counts)} on {i.backend}>"

    def __str__(self) -> str:
        return sweep_text(self._info)

    def _repr_html_(self) -> str:
        return sweep_html(self.info)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no elements"


def sweep_html(info: SweepInfo) -> str:
    head = (f"<p><b>sweep <code>{info.id}</code></b> {html.escape(info.name)} on "
            f"{html.escape(info.backend)} ({info.mode}): {badge(info.state)} "
            f"{html.escape(_counts(info.counts))}</p>")
    rows = []
    for e in info.elements:
        params = ", ".join(f"{k}={v!r}" for k, v in e["parameters"].items())
        rows.append(f"<tr><td>{e['index']}</td><td><code>{e['job']}</code></td>"
                    f"<td>{html.escape(params)}</td><td>{badge(e['state'])}</td>"
                    f"<td>{html.escape(e['reason'] or '')}</td></tr>")
    return (head + "<table><tr><th>#</th><th>job</th><th>parameters</th><th>state</th>"
            "<th>reason</th></tr>" + "".join(rows) + "</table>")


class JobList(list):
    def _repr_html_(self) -> str:
        if not self:
            return "<p>No jobs. Submit one with <code>%hpc submit NOTEBOOK</code>.</p>"
        return _html_rows([j._info for j in self])

    def __repr__(self) -> str:
        return jobs_table([j._info for j in self])


def badge(state: str) -> str:
    color = BADGE_COLORS.get(state, "#6c757d")
    fg = "#000" if state == "unknown" else "#fff"
    return (f'<span class="cloudtik-job-state" style="background:{color};color:{fg};'
            f'border-radius:0.6em;padding:0 0.5em">{html.escape(state)}</span>')


def _html_rows(jobs: list[JobInfo], detail: bool = False) -> str:
    head = ("<tr><th>job</th><th>name</th><th>backend</th><th>state</th>"
            "<th>runtime</th><th>reason</th></tr>")
    body = []
    for j in jobs:
        native = f" ({html.escape(j.native_state)})" if j.native_state else ""
        body.append(
            f"<tr><td><code>{j.id}</code></td><td>{html.escape(j.name)}</td>"
            f"<td>{html.escape(j.backend)}</td><td>{badge(j.state)}{native}</td>"
            f"<td>{format_duration(j.runtime_seconds) if j.started_at else '-'}</td>"
            f"<td>{html.escape(j.reason or '')}</td></tr>")
    out = f"<table>{head}{''.join(body)}</table>"
    if detail and jobs:
        for text in jobs[0].warnings or []:
            out += (f'<p class="cloudtik-job-warning" style="color:#b35c00">'
                    f"<b>warning:</b> {html.escape(text)}</p>")
    if detail and jobs and jobs[0].error:
        e = jobs[0].error
        out += (f"<p><b>error in cell {e.get('cell')}</b></p><pre>"
                f"{html.escape(e.get('source') or '')}\n\n"
                f"{html.escape(str(e.get('ename')))}: {html.escape(str(e.get('evalue')))}</pre>")
    return out


def _job_or_none(text: str, client: JobsClient) -> Job | None:
    try:
        return Job(text, client)
    except CloudTikError:
        return None


def wait_all(jobs: list[Job], timeout: float | None = None) -> list[JobInfo]:
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    for j in jobs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        out.append(j.wait(left))
    return out


__all__ = ["FINAL_STATES", "Job", "JobList", "Sweep", "wait_all"]
