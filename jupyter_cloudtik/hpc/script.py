"""The batch script every script-running backend submits (local, Slurm, FirecREST, ARC).

One script, rendered from the ``Submission``: scheduler directives (given by the backend),
environment activation (the session's interpreter and virtualenv/conda env, or a
container image: Apptainer/Singularity or Podman), the staging commands for inputs the
system reaches itself, the papermill run (``papermill_runner``: the kernel on IPC
sockets) or the command, the copy of results to an output location the system reaches
itself, and a few marker files in ``.cloudtik/`` that let a backend tell what happened
even after its scheduler forgot the job (Slurm drops finished jobs from ``squeue`` after
``MinJobAge``).

The job folder layout, relative to the job's working directory::

    job.sh  job.log  parameters.json  <notebook>.ipynb  <notebook>.out.ipynb
    <inputs by name>  <whatever the notebook writes>
    .cloudtik/{started,native_id,exitcode,finished}
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from ..core.errors import ConfigError
from . import papermill_runner
from .base import MARKER_DIR, Environment, Submission, shell_quote
from .environment import CONTAINER_RUNTIMES
from .provenance_snapshot import notebook_run_line, snapshot_line

SCRIPT_NAME = "job.sh"
LOG_NAME = "job.log"
PARAMETERS_NAME = "parameters.json"
SCAFFOLDING = (SCRIPT_NAME, PARAMETERS_NAME, MARKER_DIR)


def output_notebook_name(notebook: str) -> str:
    stem = PurePosixPath(notebook).name
    if stem.endswith(".ipynb"):
        stem = stem[: -len(".ipynb")]
    return f"{stem}.out.ipynb"


def parameters_json(sub: Submission) -> str:
    return json.dumps(sub.spec.parameters, indent=1, sort_keys=True, default=str)


def container_run(env: Environment) -> list[str]:
    """Shell lines that set ``CT_RUN``, the prefix running a program in ``env.container``.

    Apptainer/Singularity (``exec``) share the job's environment, user, network and
    working folder by default; only the job folder is bound.  Podman (``run``) shares
    none of them: the job folder is mounted at the same path and is the working folder,
    the host's network is used (as Apptainer does), ``environment.variables`` are passed
    by name, and a job that is not root keeps its own uid inside (``--userns=keep-id``,
    rootless Podman), so what the job writes is the user's.  The runtime's site settings
    (storage, OCI runtime, limits) stay in its own containers.conf."""
    runtime = env.container_runtime or "apptainer"
    image = shell_quote(env.container)
    if runtime in ("apptainer", "singularity"):
        return [f'CT_RUN=({runtime} exec --bind "$CT_JOB_DIR" --pwd "$CT_JOB_DIR" {image})']
    if runtime == "podman":
        passed = "".join(f" --env {shell_quote(k)}" for k in sorted(env.variables))
        return ['CT_USERNS=(); [ "$(id -u)" = 0 ] || CT_USERNS=(--userns=keep-id)',
                'CT_RUN=(podman run --rm --network=host "${CT_USERNS[@]}" '
                f'--volume "$CT_JOB_DIR:$CT_JOB_DIR" --workdir "$CT_JOB_DIR"{passed} {image})']
    raise ConfigError(f"environment.container_runtime: {runtime!r} is not allowed; use "
                      f"{', '.join(CONTAINER_RUNTIMES)}", field="environment.container_runtime",
                      value=runtime)


def _activation(env: Environment) -> tuple[list[str], str]:
    """Shell lines that activate the environment, and the prefix that runs a program in it."""
    lines = list(env.setup)
    for key, value in sorted(env.variables.items()):
        lines.append(f"export {key}={shell_quote(value)}")
    if env.container:
        lines += container_run(env)
        python = env.python or "python3"
    else:
        if (env.build or {}).get("hash"):  # the session's environment, built on the system
            lines += activation(env.build)
        if env.venv:
            lines.append(f"export VIRTUAL_ENV={shell_quote(env.venv)}")
            lines.append('export PATH="$VIRTUAL_ENV/bin:$PATH"')
        if env.conda_env:
            lines.append(f"export CONDA_PREFIX={shell_quote(env.conda_env)}")
            lines.append('export PATH="$CONDA_PREFIX/bin:$PATH"')
        lines.append("CT_RUN=()")
        python = env.python or "python3"
    lines.append(f"CT_PYTHON={shell_quote(python)}")
    return lines, '"${CT_RUN[@]}"'


def _fetch_url(url: str, name: str) -> str:
    q_url, q_name = shell_quote(url), shell_quote(name)
    return (f"if command -v curl >/dev/null; then curl -fsSL -o {q_name} {q_url}; "
            f'else "${{CT_RUN[@]}}" "$CT_PYTHON" -c "import sys, urllib.request; '
            f"urllib.request.urlretrieve(sys.argv[1], sys.argv[2])\" {q_url} {q_name}; fi "
            f"|| ct_fail 'cannot fetch input {name} from {url}'")


def _system_path(location: str) -> str:
    """A direct location as a path for the job: ``file://`` and ``BACKEND:`` prefixes go."""
    if location.startswith("file://"):
        return location[len("file://"):]
    head, sep, rest = location.partition(":")
    if sep and rest.startswith("/") and "/" not in head:
        return rest
    return location


def render(sub: Submission, *, directives: list[str] = (), job_dir: str | None = None,
           stage_in_direct: bool = True) -> str:
    """The job script.  ``job_dir`` None means "the directory the job starts in"."""
    spec = sub.spec
    lines = ["#!/bin/bash"]
    lines += list(directives)
    lines.append(f"# jupyter_cloudtik job {sub.job_id} ({sub.name}), token {sub.token}")
    lines.append("set -u")
    if job_dir:
        lines.append(f"CT_JOB_DIR={shell_quote(job_dir)}")
    else:
        lines.append('CT_JOB_DIR="$(pwd)"')
    lines += [
        'cd "$CT_JOB_DIR" || exit 90',
        f"mkdir -p {MARKER_DIR}",
        f"date +%s > {MARKER_DIR}/started",
        f'if [ -n "${{SLURM_JOB_ID:-}}" ]; then echo "$SLURM_JOB_ID" > {MARKER_DIR}/native_id; fi',
        "ct_end() {",
        f'  echo "$1" > {MARKER_DIR}/exitcode; date +%s > {MARKER_DIR}/finished; exit "$1"',
        "}",
        'ct_fail() { echo "jupyter_cloudtik: $1" >&2; ct_end 91; }',
    ]
    env_lines, run = _activation(sub.environment)
    lines += env_lines
    if stage_in_direct:
        for item in sub.inputs:
            if item.mode != "direct":
                continue
            q_name = shell_quote(item.name)
            if "://" in item.source and not item.source.startswith("file://"):
                lines.append(f"echo 'jupyter_cloudtik: staging in {item.name}' >&2")
                lines.append(_fetch_url(item.source, item.name))
            else:
                src = _system_path(item.source)
                lines.append(f"echo 'jupyter_cloudtik: staging in {item.name}' >&2")
                lines.append(f"cp -R -- {shell_quote(src)} {q_name} "
                             f"|| ct_fail 'cannot copy input {item.name}'")

    if spec.notebook:
        nb_in = PurePosixPath(spec.notebook).name
        nb_out = sub.output_notebook or output_notebook_name(nb_in)
        # papermill as its CLI ran it, with the kernel on IPC sockets (papermill_runner.py),
        # between the provenance snapshots (checksums and environment), in one interpreter
        lines.append(notebook_run_line(
            run, papermill_runner.source(),
            f"{shell_quote(nb_in)} {shell_quote(nb_out)} {PARAMETERS_NAME}"
            f' {shell_quote(spec.kernel or "python3")} "$CT_JOB_DIR"'))
        lines.append("CT_RC=$?")
    else:
        lines.append(snapshot_line(run, "before"))  # checksums and environment (provenance)
        argv = " ".join(shell_quote(a) for a in (spec.command or ["true"]))
        lines.append(f"{run} {argv}")
        lines.append("CT_RC=$?")
        lines.append(snapshot_line(run, "after"))  # the outputs' checksums
    if sub.stage_out:
        dest = _system_path(sub.stage_out)
        patterns = list(spec.outputs) or ["*"]
        if spec.notebook:
            patterns.insert(0, sub.output_notebook or output_notebook_name(spec.notebook))
        lines.append(f"mkdir -p {shell_quote(dest)} || ct_fail 'cannot create {dest}'")
        lines.append("shopt -s nullglob")
        globbed = " ".join(_glob(p) for p in patterns)
        skip = [SCRIPT_NAME, LOG_NAME, PARAMETERS_NAME, MARKER_DIR,
                *sorted(set(sub.files) | {i.name for i in sub.inputs})]
        lines.append(f"for f in {globbed}; do")
        lines.append(f'  case "$f" in {"|".join(shell_quote(x) for x in skip)}) continue;; esac')
        # under its own relative folder: "plots/*" lands in DEST/plots/, as the session's
        # copy keeps it (a flat copy would let plots/a.csv and tables/a.csv collide)
        lines.append(f'  d={shell_quote(dest)}/"$(dirname -- "$f")"')
        lines.append(f'  mkdir -p -- "$d" && cp -R -- "$f" "$d"/ || ct_fail "cannot copy $f to'
                     f' {dest}"')
        lines.append("done")
    lines.append('ct_end "$CT_RC"')
    return "\n".join(lines) + "\n"


def _glob(pattern: str) -> str:
    """A glob pattern for the ``for`` loop: quoted except its wildcard characters."""
    out, buf = [], ""
    for ch in pattern:
        if ch in "*?[]":
            if buf:
                out.append(shell_quote(buf))
                buf = ""
            out.append(ch)
        else:
            buf += ch
    if buf:
        out.append(shell_quote(buf))
    return "".join(out)


def activation(build: dict[str, Any]) -> list[str]:
    """Job-script lines: build the environment if needed, then run in it."""
    q = shell_quote
    root, h = build["root"], build["hash"]
    sh = build.get("script") or f"{root}/{h}.sh"
    return [f"echo 'jupyter_cloudtik: environment {h}' >&2",
            f"bash {q(sh)} || ct_fail 'cannot build the environment {h} in "
            f"{root} (see the lines above)'"]
