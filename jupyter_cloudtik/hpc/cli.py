"""``jupyter cloudtik jobs ...``: the job commands in a terminal (the hpc feature's ``cli``).

Exit codes as for the rest of the CLI: 0 done, 2 bad input (nothing submitted), 1 the
operation failed; ``jobs wait`` exits 0 only when the job succeeded, 1 otherwise.
"""

from __future__ import annotations

import getpass
import json
import sys
from typing import Any

from ..core.arguments import Parser
from ..core.errors import ConfigError
from .commands import (
    add_job_commands,
    backends_table,
    job_text,
    jobs_table,
    results_text,
    spec_from_args,
    sweep_from_args,
    sweep_text,
    sweeps_table,
)

COMMANDS = {"jobs"}


def add_commands(sub) -> None:
    p = sub.add_parser("jobs", help="HPC jobs: submit notebooks, watch, fetch results",
                       description="HPC jobs: the same jobs %hpc shows.")
    s = p.add_subparsers(dest="jobs_command", metavar="COMMAND", parser_class=Parser)
    s.required = True
    add_job_commands(s, cli=True)
    q = s.add_parser("secret", help="store a backend's secret (read from stdin)",
                     description="Store a secret of a backend (ssh_key, client_secret, "
                                 "token, ...) in the encrypted secret store.  The value is "
                                 "read from stdin (or asked for without echo).")
    q.add_argument("backend")
    q.add_argument("key", help="ssh_key, ssh_key_passphrase, client_secret or token")
    q.add_argument("--from-file", help="read the value from this file (e.g. a private key)")
    q.add_argument("--delete", action="store_true", help="remove the secret")
    q.add_argument("--json", action="store_true")


def _emit(args, data: Any, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def run(args) -> int:
    from .client import JobsClient  # deferred: start-up (hpc.client ~94 ms, loads asyncio, psutil)

    client = JobsClient()
    try:
        return _run(args, client)
    finally:
        client.close()


def _run(args, client) -> int:
    cmd = args.jobs_command
    if cmd == "backends":
        backends = client.backends()
        _emit(args, backends, backends_table(backends))
        return 0
    if cmd == "secret":
        return _secret(args, client)
    if cmd == "submit":
        if not args.notebook and not args.command_line:
            raise ConfigError("give a NOTEBOOK (or --command)", field="notebook")
        info = client.submit(spec_from_args(args, args.notebook, args.command_line),
                             args.backend)
        for text in info.warnings:
            print(f"warning: job {info.id}: {text}", file=sys.stderr)
        if args.wait:
            info = client.wait(info.id)
        _emit(args, info.to_dict(), job_text(info))
        return 0 if not args.wait or info.state == "succeeded" else 1
    if cmd == "status":
        if args.job:
            info = client.refresh(args.job)
            _emit(args, info.to_dict(), job_text(info))
            return 0
        client.run_tick()
        jobs = client.list(active_only=args.active, backend=args.backend)
        _emit(args, [j.to_dict() for j in jobs], jobs_table(jobs))
        return 0
    if cmd == "logs":
        if args.follow:
            for text in client.follow_logs(args.job, args.offset):
                sys.stdout.write(text)
                sys.stdout.flush()
            return 0
        chunk = client.logs(args.job, args.offset)
        if args.json:
            _emit(args, {"text": chunk.text, "offset": chunk.offset}, "")
        else:
            sys.stdout.write(chunk.text)
        return 0
    if cmd == "cancel":
        info = client.cancel(args.job)
        _emit(args, info.to_dict(), f"job {info.id}: {info.state_label}")
        return 0
    if cmd == "fetch":
        paths = client.fetch(args.job, args.dest, args.files or None)
        _emit(args, [str(p) for p in paths], "\n".join(str(p) for p in paths))
        return 0
    if cmd == "outputs":
        files = client.outputs(args.job)
        _emit(args, [f.__dict__ for f in files],
              "\n".join(f"{f.size if f.size is not None else '-':>10}  {f.name}"
                        for f in files) or "no outputs")
        return 0
    if cmd.startswith("sweep"):
        return _sweep(args, client)
    if cmd == "wait":
        info = client.wait(args.job, args.timeout)
        _emit(args, info.to_dict(), job_text(info))
        return 0 if info.state == "succeeded" else 1
    if cmd == "rerun":
        from .api import Job  # deferred: start-up (hpc.api ~102 ms, loads asyncio, psutil)

        job = Job.rerun(args.crate, backend=args.backend, client=client, quiet=True,
                        trust=args.trust)
        out = sys.stderr if args.json else sys.stdout
        print(f"rerun: {len(job.differences)} difference(s) from the record"
              + "".join(f"\n  {d}" for d in job.differences), file=out)
        info = client.wait(job.id) if args.wait else job.info
        _emit(args, {**info.to_dict(), "differences": job.differences}, job_text(info))
        return 0 if not args.wait or info.state == "succeeded" else 1
    raise AssertionError(cmd)  # pragma: no cover


def _sweep(args, client) -> int:
    cmd = args.jobs_command
    if cmd == "sweep":
        spec, how = sweep_from_args(args)
        info = client.sweep(spec, args.backend, **how)
        if args.wait:
            info = client.wait_sweep(info.id)
        _emit(args, info.to_dict(), sweep_text(info))
        return 0 if not args.wait or info.state == "succeeded" else 1
    if cmd == "sweeps":
        if args.sweep:
            client.run_tick()
            info = client.get_sweep(args.sweep)
            _emit(args, info.to_dict(), sweep_text(info))
            return 0
        sweeps = client.list_sweeps()
        _emit(args, [i.to_dict() for i in sweeps], sweeps_table(sweeps))
        return 0
    if cmd == "sweep-cancel":
        info = client.cancel_sweep(args.sweep, args.element)
        _emit(args, info.to_dict(), sweep_text(info))
        return 0
    if cmd == "sweep-retry":
        info = client.retry_sweep(args.sweep)
        _emit(args, info.to_dict(), sweep_text(info))
        return 0
    if cmd == "sweep-results":
        rows = client.sweep_results(args.sweep)
        _emit(args, rows, results_text(rows))
        return 0
    if cmd == "sweep-wait":
        info = client.wait_sweep(args.sweep, args.timeout)
        _emit(args, info.to_dict(), sweep_text(info))
        return 0 if info.state == "succeeded" else 1
    raise AssertionError(cmd)  # pragma: no cover


def _secret(args, client) -> int:
    # deferred: start-up (hpc.settings ~40 ms, loads importlib.metadata, traitlets)
    from .settings import BackendRegistry

    name = BackendRegistry.resolve(client.manager.registry, args.backend)
    scope = f"hpc:{name}"
    secrets = client.manager.secrets
    if args.delete:
        n = secrets.delete(scope, args.key)
        _emit(args, {"deleted": n}, f"deleted {n} secret(s)")
        return 0
    if args.from_file:
        from pathlib import Path

        try:
            value = Path(args.from_file).expanduser().read_text()
        except OSError as e:
            raise ConfigError(f"--from-file: cannot read {args.from_file}: {e.strerror}",
                              field="from_file") from None
    elif sys.stdin.isatty():
        value = getpass.getpass(f"{args.key} for backend {name}: ")
    else:
        value = sys.stdin.read()
        if args.key != "ssh_key":
            value = value.strip()
    if not value.strip():
        raise ConfigError(f"{args.key}: the value is empty", field=args.key)
    secrets.put(scope, args.key, value)
    _emit(args, {"backend": name, "key": args.key, "stored": True},
          f"stored {args.key} for backend '{name}'")
    return 0
