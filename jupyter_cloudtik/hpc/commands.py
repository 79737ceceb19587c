"""The job sub-commands, defined once for ``%hpc`` and ``jupyter cloudtik jobs``, plus the
text shown for jobs in both."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

from ..core.arguments import Parser
from ..core.errors import ConfigError
from ..core.units import format_bytes, format_duration, parse_bytes, parse_duration
from .base import Environment, JobAttributes, JobSpec, ResourceSpec
from .env_requirements import parse
from .models import JobInfo


def parse_value(text: str) -> Any:
    """``-p n 3`` gives the number 3, ``-p f 0.5`` a float, ``-p xs "[1, 2]"`` a list, as
    papermill's own ``-y`` would; anything else stays text."""
    import yaml

    # deferred: start-up (core.config ~40 ms, loads importlib.metadata, yaml)
    from ..core.config import load_yaml

    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    if value is None and text.strip() not in ("null", "~", "None"):
        return text
    if isinstance(value, (int, float, bool, list, dict)) or value is None:
        return value
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def build_spec(
    notebook: str | None = None,
    command: str | list[str] | None = None,
    *,
    name: str | None = None,
    parameters: dict[str, Any] | None = None,
    nodes: int | None = None,
    cpus: int | None = None,
    tasks_per_node: int | None = None,
    memory: str | int | None = None,
    time: str | float | None = None,
    queue: str | None = None,
    account: str | None = None,
    reservation: str | None = None,
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    output: str | None = None,
    container: str | None = None,
    python: str | None = None,
    kernel: str | None = None,
    env: dict[str, str] | None = None,
    packages: str | list[str] | None = None,
    requirements: str | None = None,
    requirements_text: str | None = None,
    allow_unknown_parameters: bool = False,
) -> JobSpec:
    """A ``JobSpec`` from the words people use (``time="30m"``, ``memory="4GiB"``).

    ``requirements``: a requirements or lock file here (read when the job is prepared);
    ``requirements_text``: such a file's contents sent by another process (the REST
    body's ``requirements``), checked now so that a bad line is refused before anything
    is recorded (``env_requirements.parse``)."""
    if isinstance(command, str):
        command = shlex.split(command)
    resources = ResourceSpec(
        node_count=nodes or 1,
        processes_per_node=tasks_per_node or 1,
        cpu_cores_per_process=cpus,
        memory=parse_bytes(memory, "memory") if memory not in (None, "") else None,
    )
    attributes = JobAttributes(duration=parse_duration(time, "time"), queue_name=queue or None,
                               account=account or None, reservation_id=reservation or None)
    environment = None
    if isinstance(packages, (list, tuple)) and list(packages) in (["session"], ["system"]):
        packages = packages[0]  # --packages session / --packages system
    if requirements is not None and (not isinstance(requirements, str) or not requirements):
        raise ConfigError(f"requirements: {requirements!r} is not allowed; give the path "
                          "of a requirements or lock file", field="requirements",
                          value=requirements)
    if requirements:  # this process's folder, whichever process reads it
        requirements = str(Path(requirements).expanduser().absolute())
    if requirements_text is not None and not parse(requirements_text, "requirements"):
        raise ConfigError("requirements: no requirement in the text; send the contents "
                          "of a requirements or lock file (name==version lines)",
                          field="requirements")
    if container or python or env or packages is not None or requirements or \
            requirements_text:
        environment = Environment(python=python, container=container,
                                  variables=dict(env or {}), packages=packages,
                                  requirements=requirements,
                                  requirements_text=requirements_text)
    if notebook and command:
        raise ConfigError("give a notebook or a command, not both", field="command")
    return JobSpec(name=name, notebook=notebook, command=command or None,
                   parameters=dict(parameters or {}), kernel=kernel or "python3",
                   resources=resources, attributes=attributes, environment=environment,
                   inputs=list(inputs or []), outputs=list(outputs or []), output=output,
                   allow_unknown_parameters=bool(allow_unknown_parameters))


def add_submit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", "-b", help="backend name (default: the configured default)")
    p.add_argument("--name", help="job name (default: the notebook's name)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("KEY", "VALUE"),
                   default=[], help="a notebook parameter (repeatable); values are read "
                                    "as YAML: 3, 0.5, true, [1, 2]")
    p.add_argument("--allow-unknown-parameters", action="store_true",
                   help="submit even if the notebook's cell tagged `parameters` does not "
                        "assign a parameter (or there is no such cell): papermill injects "
                        "it anyway and the job carries a warning")
    p.add_argument("--inputs", nargs="+", action="extend", default=[], metavar="LOCATION",
                   help="files or folders to stage into the job's folder "
                        "([NAME=]path, URL or storage location)")
    p.add_argument("--outputs", nargs="+", action="extend", default=[], metavar="PATTERN",
                   help="result files to keep (glob patterns; default: everything)")
    p.add_argument("--output", metavar="LOCATION",
                   help="where results land (default: the job's own folder)")
    p.add_argument("--nodes", "-N", type=_positive_int, help="number of nodes")
    p.add_argument("--cpus", "-c", type=_positive_int, help="CPU cores per task")
    p.add_argument("--tasks-per-node", type=_positive_int, help="tasks per node")
    p.add_argument("--memory", "--mem", help="memory per node, e.g. 4GiB")
    p.add_argument("--time", "-t", help="wall time: minutes, 30m, 2h or 1:30:00")
    p.add_argument("--queue", "--partition", "-q", help="partition / queue")
    p.add_argument("--account", "-A", help="account to charge")
    p.add_argument("--reservation", help="reservation to run in")
    p.add_argument("--container", help="container image (Apptainer/Singularity reference)")
    p.add_argument("--python", help="interpreter on the system (default: the session's)")
    p.add_argument("--packages", nargs="+", metavar="NAME",
                   help="the job's environment, built on the system from the session's "
                        "exact versions: these packages (with what they require), "
                        "'session' for all of them, 'system' for the system's own Python")
    p.add_argument("--requirements", metavar="FILE",
                   help="the job's environment, built on the system: the packages of this "
                        "requirements or lock file (name==version lines, --hash checked), "
                        "with the session's exact versions")
    p.add_argument("--kernel", help="kernel name for papermill (default: python3)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for the job (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait until the job has ended")


def spec_from_args(args, notebook: str | None, command: str | None = None) -> JobSpec:
    env = {}
    for item in args.env:
        if "=" not in item:
            raise ConfigError(f"env: {item!r} is not KEY=VALUE", field="env")
        k, v = item.split("=", 1)
        env[k] = v
    return build_spec(
        notebook, command, name=args.name,
        parameters={k: parse_value(v) for k, v in args.parameter},
        nodes=args.nodes, cpus=args.cpus, tasks_per_node=args.tasks_per_node,
        memory=args.memory, time=args.time, queue=args.queue, account=args.account,
        reservation=args.reservation, inputs=args.inputs, outputs=args.outputs,
        output=args.output, container=args.container, python=args.python,
        kernel=args.kernel, env=env, packages=getattr(args, "packages", None),
        requirements=getattr(args, "requirements", None),
        allow_unknown_parameters=getattr(args, "allow_unknown_parameters", False))


def add_job_commands(sub, cli: bool) -> None:
    """backends/submit/status/logs/cancel/fetch/outputs/wait/rerun on a subparsers
    object."""

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if cli:
            p.add_argument("--json", action="store_true", help="print JSON instead of text")
        return p

    add("backends", "list the configured HPC backends")

    p = add("submit", "submit a notebook (run with papermill) or a command as a job")
    p.add_argument("notebook", nargs="?", help="the notebook to run")
    p.add_argument("--command", dest="command_line", metavar="COMMAND",
                   help="a command line to run instead of a notebook")
    add_submit_options(p)

    p = add("status", "show a job, or list jobs")
    p.add_argument("job", nargs="?", help="job id (default: list recent jobs)")
    p.add_argument("--active", action="store_true", help="only jobs not yet ended")
    p.add_argument("--backend", "-b", help="only jobs of this backend")
    p.add_argument("--refresh", action="store_true", help="ask the backend now")

    p = add("logs", "show a job's log (stdout and stderr)")
    p.add_argument("job")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--offset", type=int, default=0, help="start at this byte")

    p = add("cancel", "cancel a job")
    p.add_argument("job")

    p = add("fetch", "copy a job's executed notebook and outputs into this folder")
    p.add_argument("job")
    p.add_argument("--dest", help="target folder (default: hpc-jobs/<job id>)")
    p.add_argument("files", nargs="*", help="only these files")

    p = add("outputs", "list a job's result files")
    p.add_argument("job")

    p = add("wait", "wait until a job has ended")
    p.add_argument("job")
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")

    p = add("sweep", "run a notebook once per combination of parameter values (a sweep)")
    p.add_argument("notebook", help="the notebook to run")
    p.add_argument("--zip", action="store_true",
                   help="pair the -p values (all lists of one length) instead of taking "
                        "every combination")
    p.add_argument("--max-concurrent", type=_positive_int, metavar="N",
                   help="at most N elements at once (Slurm: --array=0-M%%N; default "
                        "HPC.sweep_max_concurrent)")
    add_submit_options(p)
    for action in p._actions:  # -p takes comma-separated values here
        if action.dest == "parameter":
            action.help = ("a parameter and its values, comma-separated (repeatable): "
                           "-p alpha 0.1,0.2,0.5; a YAML list gives values with commas: "
                           "-p xs '[[1, 2], [3, 4]]'")

    p = add("sweeps", "show a sweep (its counts and elements), or list sweeps")
    p.add_argument("sweep", nargs="?", help="sweep id (default: list recent sweeps)")

    p = add("sweep-cancel", "cancel a sweep, or one of its elements")
    p.add_argument("sweep")
    p.add_argument("--element", type=int, metavar="I", help="only element I")

    p = add("sweep-retry", "resubmit only the failed elements of a sweep")
    p.add_argument("sweep")

    p = add("sweep-results", "one row per element: parameters, state, recorded values, "
                             "outputs")
    p.add_argument("sweep")

    p = add("sweep-wait", "wait until every element of a sweep has ended")
    p.add_argument("sweep")
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")

    p = add("rerun", "run a recorded job again (same notebook, parameters, inputs) and "
                     "say what differs from its provenance crate")
    p.add_argument("crate", help="the crate's folder or its ro-crate-metadata.json, or a "
                                 "job id (its crate)")
    p.add_argument("--backend", "-b", help="run it here instead of the recorded backend")
    p.add_argument("--wait", action="store_true", help="wait until it has ended")
    p.add_argument("--trust", action="store_true",
                   help="run a crate this state folder did not make (read what it runs "
                        "first: the refusal without --trust says)")


def job_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, add_help=True)
    s = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    s.required = True
    add_job_commands(s, cli=False)
    return parser


# --- text -------------------------------------------------------------------------------------

def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    d = time.time() - ts
    if d < 90:
        return f"{d:.0f}s ago"
    if d < 5400:
        return f"{d / 60:.0f}m ago"
    if d < 172800:
        return f"{d / 3600:.1f}h ago"
    return f"{d / 86400:.0f}d ago"


def job_text(j: JobInfo) -> str:
    lines = [
        f"job        {j.id}  {j.name}",
        f"backend    {j.backend} ({j.backend_type})" + (
            f", job {j.native_id}" if j.native_id else ""),
        f"state      {j.state_label}" + (f" - {j.reason}" if j.reason else ""),
        f"submitted  {_ago(j.submitted_at or j.created_at)}",
    ]
    if j.started_at:
        lines.append(f"runtime    {format_duration(j.runtime_seconds)}")
    if j.notebook:
        lines.append(f"notebook   {j.notebook}")
        if j.parameters:
            lines.append("parameters " + ", ".join(f"{k}={v!r}" for k, v in
                                                  j.parameters.items()))
    elif j.command:
        lines.append(f"command    {shlex.join(j.command)}")
    for text in j.warnings or []:
        lines.append(f"WARNING    {text}")
    res = j.resources or {}
    attrs = j.attributes or {}
    wants = [f"{res.get('node_count', 1)} node(s)"]
    if res.get("cpu_cores_per_process"):
        wants.append(f"{res['cpu_cores_per_process']} cpu(s)")
    if res.get("memory"):
        wants.append(format_bytes(res["memory"]))
    if attrs.get("duration"):
        wants.append(format_duration(attrs["duration"]))
    if attrs.get("queue_name"):
        wants.append(f"queue {attrs['queue_name']}")
    lines.append("resources  " + ", ".join(wants))
    if j.output:
        lines.append(f"output     {j.output}")
    if j.error:
        lines.append("")
        lines.append(f"error in cell {j.error.get('cell')}:")
        for src in (j.error.get("source") or "").splitlines()[:8]:
            lines.append(f"    {src}")
        lines.append(f"  {j.error.get('ename')}: {j.error.get('evalue')}")
    return "\n".join(lines)


def jobs_table(jobs: list[JobInfo]) -> str:
    if not jobs:
        return "No jobs. Submit one with `%hpc submit NOTEBOOK`."
    rows = [f"{'JOB':9} {'NAME':20} {'BACKEND':10} {'STATE':22} {'SUBMITTED':10} REASON"]
    for j in jobs:
        rows.append(f"{j.id:9} {j.name[:20]:20} {j.backend[:10]:10} {j.state_label[:22]:22} "
                    f"{_ago(j.submitted_at or j.created_at):10} {(j.reason or '')[:60]}")
    return "\n".join(rows)


def backends_table(backends: list[dict[str, Any]]) -> str:
    rows = [f"{'BACKEND':14} {'TYPE':10} {'DEFAULT':7} READS DIRECTLY"]
    for b in backends:
        if not b.get("available"):
            rows.append(f"{b['name']:14} {b.get('type')!s:10} {'':7} unusable: "
                        f"{b.get('reason')}")
            continue
        rows.append(f"{b['name']:14} {b['type']:10} {'yes' if b.get('default') else '':7} "
                    f"{', '.join(b.get('direct') or []) or '-'}")
    return "\n".join(rows)


def sweep_text(info: Any) -> str:
    """A sweep as text: its state and counts, then one line per element."""
    counts = ", ".join(f"{v} {k}" for k, v in info.counts.items() if v) or "no elements"
    lines = [f"sweep {info.id} {info.name!r} on {info.backend} ({info.mode}, at most "
             f"{info.max_concurrent} at once): {info.state} - {counts}"]
    for e in info.elements:
        params = " ".join(f"{k}={v!r}" for k, v in e["parameters"].items())
        native = f" [{e['native_id']}]" if e.get("native_id") else ""
        reason = f" - {e['reason']}" if e.get("reason") else ""
        retry = f" (attempt {e['attempts']})" if e.get("attempts", 1) > 1 else ""
        lines.append(f"  {e['index']:>4}  {e['job']}{native}  {e['state']:<10} "
                     f"{params}{retry}{reason}")
    return "\n".join(lines)


def sweep_values(key: str, text: str) -> list[Any]:
    """``-p alpha 0.1,0.2,0.5``: the values of one sweep parameter (``[..]`` YAML lists
    give values that contain commas)."""
    value = parse_value(text)
    if isinstance(value, list) and text.strip().startswith("["):
        values = value
    else:
        values = [parse_value(v.strip()) for v in text.split(",")]
    if not values or any(v == "" for v in values):
        raise ConfigError(f"parameters.{key}: {text!r} has an empty value; give values "
                          "separated by commas (-p alpha 0.1,0.2)", field=f"parameters.{key}")
    return values


def sweep_from_args(args) -> tuple[JobSpec, dict[str, Any]]:
    """The job every element runs and the sweep's grid (or zip) from ``sweep``'s options."""
    values: dict[str, list[Any]] = {}
    for key, text in args.parameter:
        if key in values:
            raise ConfigError(f"parameters.{key}: given twice; give its values once, "
                              "comma-separated", field=f"parameters.{key}")
        values[key] = sweep_values(key, text)
    args.parameter = []
    spec = spec_from_args(args, args.notebook)
    grid = {"zip": values} if args.zip else {"grid": values}
    return spec, {**grid, "max_concurrent": args.max_concurrent}


def sweeps_table(sweeps: list[Any]) -> str:
    if not sweeps:
        return "no sweeps"
    lines = [f"{'SWEEP':<9} {'NAME':<20} {'BACKEND':<10} {'STATE':<10} COUNTS"]
    for i in sweeps:
        counts = ", ".join(f"{v} {k}" for k, v in i.counts.items() if v) or "-"
        lines.append(f"{i.id:<9} {i.name[:20]:<20} {i.backend[:10]:<10} {i.state:<10} {counts}")
    return "\n".join(lines)


def results_text(rows: list[dict[str, Any]]) -> str:
    """The results table as text (the CLI; ``Sweep.results()`` gives a DataFrame)."""
    if not rows:
        return "no elements"
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols and k != "reason"]
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)
