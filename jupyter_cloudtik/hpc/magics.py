"""``%hpc`` and ``%%hpc``: send notebooks and cells to HPC backends from a notebook.

Loaded with ``%load_ext jupyter_cloudtik`` (the hpc feature's ``magics``, ``hpc/feature.py``).
Errors are one-line ``UsageError``s; nothing is submitted when a check fails.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..core.arguments import Parser, UsageProblem
from ..core.errors import CloudTikError
from ..magic_line import parse_magic_line
from .commands import (
    add_submit_options,
    backends_table,
    job_parser,
    parse_value,
    spec_from_args,
    sweep_from_args,
    sweeps_table,
)
from .notebook import cell_outputs_text, notebook_from_cell


def _cell_parser() -> Parser:
    p = Parser(prog="%%hpc", description="run this cell as a job (a one-cell notebook)")
    add_submit_options(p)
    return p


@magics_class
class HPCMagics(Magics):
    @line_cell_magic
    def hpc(self, line: str, cell: str | None = None) -> Any:
        """Run notebooks (and cells) on HPC systems as jobs.

        Sub-commands::

          %hpc backends                      the configured backends
          %hpc submit NOTEBOOK [--backend B] [-p KEY VALUE ...] [--inputs LOC ...]
                [--output LOC] [--nodes N] [--cpus N] [--memory 4GiB] [--time 30m]
                [--queue Q] [--account A] [--container IMAGE] [--wait]
                [--packages NAME ... | --requirements FILE] [--allow-unknown-parameters]
              submit a notebook (run with papermill); returns the Job
          %hpc status [JOB]                  one job, or the recent jobs
          %hpc logs JOB [--follow]           its output so far (--follow: until it ends)
          %hpc cancel JOB                    cancel it
          %hpc fetch JOB [--dest DIR]        bring the executed notebook and the results
                                             into hpc-jobs/JOB/
          %hpc outputs JOB                   list its result files
          %hpc wait JOB                      wait until it has ended
          %hpc rerun CRATE [--backend B] [--wait] [--trust]
              run a job again from its provenance crate (hpc-jobs/JOB/, or JOB)
              and say what differs from the record

          %hpc sweep NOTEBOOK -p alpha 0.1,0.2,0.5 -p n 10,100 [--zip]
                [--max-concurrent N] [other submit options]
              one run per combination (--zip: paired values); returns the Sweep
          %hpc sweeps [SWEEP]                a sweep's counts and elements, or the sweeps
          %hpc sweep-cancel SWEEP [--element I]   cancel it, or one element
          %hpc sweep-retry SWEEP             resubmit only its failed elements
          %hpc sweep-results SWEEP           its results table (a DataFrame)
          %hpc sweep-wait SWEEP              wait until every element has ended

          %%hpc [--backend B] [-p KEY VALUE ...] [--wait] [other submit options]
              run the cell as a job; with --wait, show what it printed

        JOB may be any unique beginning of a job id.  Jobs outlive the kernel: after a
        restart, `%hpc status` shows them again.  `%hpc` alone lists the commands;
        `%hpc <command> --help` gives the options of one.  A trailing `# comment` is
        ignored, as in a shell (on the `%%hpc` line too).
        """
        # deferred: start-up (hpc.api ~110 ms, loads asyncio, psutil; hpc.client ~78 ms, loads
        #   asyncio, psutil)
        from .api import Job, JobList
        from .client import get_jobs_client

        try:
            if cell is not None:
                return self._cell(line, cell)
            args = parse_magic_line("%hpc", job_parser("%hpc"), line)
        except UsageProblem as e:
            raise UsageError(str(e)) from None
        except CloudTikError as e:
            raise UsageError(e.message) from None
        if args is None:  # help was printed
            return None
        try:
            client = get_jobs_client()
            cmd = args.command
            if cmd == "backends":
                print(backends_table(client.backends()))
                return None
            if cmd == "submit":
                if not args.notebook and not args.command_line:
                    raise UsageError("%hpc submit: give a NOTEBOOK (or --command)")
                spec = spec_from_args(args, args.notebook, args.command_line)
                info = client.submit(spec, args.backend)
                _warn(info)
                job = Job(info.id, client, info)
                if args.wait:
                    _follow(client, job.id)
                    return Job(job.id, client)
                return job
            if cmd == "status":
                if args.job:
                    info = client.refresh(args.job) if args.refresh else client.get(args.job)
                    return Job(info.id, client, info)
                jobs = client.list(active_only=args.active, backend=args.backend)
                return JobList([Job(i.id, client, i) for i in jobs])
            if cmd == "logs":
                if args.follow:
                    try:
                        for text in client.follow_logs(args.job, args.offset):
                            print(text, end="", flush=True)
                    except KeyboardInterrupt:
                        print("\n(stopped following; the job goes on)")
                    return None
                print(client.logs(args.job, args.offset).text, end="")
                return None
            if cmd == "cancel":
                info = client.cancel(args.job)
                print(f"job {info.id}: {info.state_label}")
                return None
            if cmd == "fetch":
                paths = client.fetch(args.job, args.dest, args.files or None)
                for p in paths:
                    print(p)
                return paths
            if cmd == "outputs":
                return [f.name for f in client.outputs(args.job)]
            if cmd.startswith("sweep"):
                return _sweep_command(client, args)
            if cmd == "wait":
                try:
                    info = client.wait(args.job, args.timeout)
                except KeyboardInterrupt:
                    print("(stopped waiting; the job goes on)")
                    return None
                return Job(info.id, client, info)
            if cmd == "rerun":
                job = Job.rerun(args.crate, backend=args.backend, client=client,
                                trust=args.trust)
                if args.wait:
                    _follow(client, job.id)
                    return Job(job.id, client)
                return job
        except CloudTikError as e:
            raise UsageError(e.message) from None
        raise UsageError(job_parser("%hpc").format_help())  # pragma: no cover

    def _cell(self, line: str, cell: str) -> Any:
        # deferred: start-up (core.settings ~7 ms, loads jupyter_core, platformdirs; hpc.api ~83
        #   ms, loads asyncio, psutil; hpc.client ~78 ms, loads asyncio, psutil)
        from ..core.settings import default_settings
        from .api import Job
        from .client import get_jobs_client

        args = parse_magic_line("%%hpc", _cell_parser(), line, commands=False)
        if args is None:  # --help was printed
            return None
        client = get_jobs_client()
        params = {k: parse_value(v) for k, v in args.parameter}
        folder = default_settings().state_path / "hpc" / "cells"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"cell-{uuid.uuid4().hex[:8]}.ipynb"
        path.write_text(json.dumps(notebook_from_cell(cell, params, args.kernel or "python3")))
        spec = spec_from_args(args, str(path))
        spec.name = args.name or "cell"
        spec.parameters = params
        info = client.submit(spec, args.backend)
        _warn(info)
        job = Job(info.id, client, info)
        if not args.wait:
            return job
        _follow(client, job.id)
        info = client.get(job.id)
        if info.output_notebook and info.state in ("succeeded", "failed"):
            try:
                nb = client.read_file(job.id, info.output_notebook)
                print(cell_outputs_text(nb), end="")
            except CloudTikError:
                pass
        return Job(info.id, client, info)


def _sweep_command(client, args) -> Any:
    from .api import Sweep  # deferred: start-up (hpc.api ~79 ms, loads asyncio, psutil)

    cmd = args.command
    if cmd == "sweep":
        spec, how = sweep_from_args(args)
        info = client.sweep(spec, args.backend, **how)
        sweep = Sweep(info.id, client, info)
        if args.wait:
            try:
                _watch_sweep(sweep)
            except KeyboardInterrupt:
                print(f"(stopped waiting; the sweep goes on: `%hpc sweeps {sweep.id}`)")
        return sweep
    if cmd == "sweeps":
        if args.sweep:
            return Sweep(args.sweep, client)
        print(sweeps_table(client.list_sweeps()))
        return None
    if cmd == "sweep-cancel":
        return Sweep(client.cancel_sweep(args.sweep, args.element).id, client)
    if cmd == "sweep-retry":
        return Sweep(client.retry_sweep(args.sweep).id, client)
    if cmd == "sweep-results":
        return Sweep(args.sweep, client).results()
    if cmd == "sweep-wait":
        try:
            return Sweep(client.wait_sweep(args.sweep, args.timeout).id, client)
        except KeyboardInterrupt:
            print("(stopped waiting; the sweep goes on)")
            return None
    raise UsageError(f"%hpc {cmd}: unknown command")  # pragma: no cover


def _watch_sweep(sweep, poll: float = 1.0) -> None:
    """Show the sweep (state, counts, one row per element) and update it in place while
    anything changes, until every element has ended."""
    import time

    from IPython.display import display

    shown = sweep.info
    handle = display(sweep, display_id=True)
    while not shown.done:
        time.sleep(poll)
        info = sweep.info
        if (info.counts, [e["state"] for e in info.elements]) != (
                shown.counts, [e["state"] for e in shown.elements]):
            if handle is not None:
                handle.update(sweep)
            shown = info
    if handle is not None:
        handle.update(sweep)


def _warn(info) -> None:
    """A job submitted although it may not do what was asked says so, loudly."""
    for text in info.warnings or []:
        print(f"WARNING: job {info.id}: {text}", file=sys.stderr)


def _follow(client, job_id: str) -> None:
    """Show the job's events until it ends; Ctrl-C stops watching, not the job."""
    from ..progress import make_view  # deferred: start-up (progress ~71 ms, loads asyncio, psutil)

    view = make_view(f"job {job_id}")
    try:
        for ev in client.watch(job_id):
            view.update(ev)
    except KeyboardInterrupt:
        print(f"(stopped waiting; the job goes on: `%hpc status {job_id}`)")
        return
    info = client.get(job_id)
    view.close("succeeded" if info.state == "succeeded" else info.state, info.reason or "")
