"""A provenance record for every job run: an RO-Crate next to its results.

When a job reaches a final state its record is written as an RO-Crate following the
Process Run Crate profile of Workflow Run RO-Crate (https://w3id.org/ro/wfrun/process/0.5)
into the folder its results are fetched into (``<results_dir>/<job id>/``): the notebook
(a copy, with its sha256), the parameters (``PropertyValue`` + ``FormalParameter``), the
inputs by their source locations with checksums, the outputs with checksums, the
environment the job ran in (interpreter, package versions, container image), the backend
and system, start and end times and the exit status (a ``CreateAction`` with its
``actionStatus``).

The checksums are computed where the files are: the job's own script hashes its folder
before the notebook runs (inputs, notebook, environment) and after (outputs), with the
job's interpreter, into ``.cloudtik/prov-{before,after}.json``, so nothing is moved to
compute them, on any backend.  The crate never holds secrets: no environment variables'
values, and credentials inside URLs (``user:password@``, ``?token=``) are redacted.

``rerun`` reads a crate back and submits the same notebook with the same parameters and
inputs, saying first what differs now (the notebook's or an input's checksum, package
versions).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..core.errors import BackendUnavailable, ConfigError, NotFoundError
from ..core.store import loads
from . import script
from .base import JobRef, JobSpec
from .provenance_crate import (
    CRATE_FILE,
    JOB_FILE,
    PROFILE,
    _many,
    build,
    local_digest,
    redact,
    sha256_of,
)
from .provenance_snapshot import AFTER, BEFORE, session_packages, snapshot_line

log = logging.getLogger("jupyter_cloudtik.hpc")


async def record(
    manager: Any, row: Any, be: Any, state: str, reason: str | None, exit_code: int | None
) -> Path | None:
    """Write the crate of a job reaching ``state`` into the folder its results are
    fetched into, and say where in an event (``provenance``).  A crate that cannot be
    written is a warning event, never the job's failure."""
    import asyncio

    if not getattr(manager.hpc, "provenance", True):
        return None
    ref = JobRef(row["id"], row["native_id"])
    spec, plan = loads(row["spec"], {}), loads(row["plan"], {})

    def get(name: str) -> bytes | None:
        try:
            return be.read_file(ref, name, 64 << 20)
        except NotFoundError:
            return None

    def snap(name: str) -> dict[str, Any] | None:
        data = get(f"{script.MARKER_DIR}/{name}")
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    def where() -> str | None:
        """The job's folder on its system as a URI: file:// on a shared filesystem,
        else ``BACKEND:/path`` (how inputs name files on a system)."""
        try:
            base = be.folder(row["id"]) if callable(getattr(be, "folder", None)) else None
        except Exception:
            base = None
        if base is None:
            return None
        if be.shares_local_filesystem:
            return Path(base).as_uri()
        name = row["backend"]
        path = quote(str(base), safe="/")
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", name):
            return f"{name}:{path}"
        return f"urn:cloudtik:{quote(name, safe='')}:{path}"

    def outputs() -> list[str] | None:
        try:
            return [f.name for f in be.list_outputs(ref)]
        except BackendUnavailable:
            raise
        except Exception:  # the snapshot's files, then
            return None

    def write() -> Path:
        nb = get(Path(spec["notebook"]).name) if spec.get("notebook") else None
        return build(
            manager.fetch_dest(row["id"]),
            job=_job_fields(row),
            spec=spec,
            plan=plan,
            state=state,
            reason=manager.redact(reason) if reason else reason,
            exit_code=exit_code,
            before=snap(BEFORE),
            after=snap(AFTER),
            notebook=nb,
            parameters_file=get(script.PARAMETERS_NAME) if spec.get("notebook") else None,
            outputs_at=where(),
            listed=outputs(),
        )

    try:
        path = await asyncio.to_thread(write)
    except BackendUnavailable:  # asked again with the job's end, when it answers
        raise
    except Exception as e:  # the run's record is lost, the run is not
        _lost(manager, row, e)
        return None
    _announce(manager, row, path)
    return path


def _job_fields(row: Any) -> dict[str, Any]:
    """The job's own fields a crate records, ended now."""
    import time

    job = {k: row[k] for k in ("id", "name", "backend", "backend_type", "native_id", "user",
                               "submitted_at", "started_at")}
    job["finished_at"] = time.time()
    return job


def _lost(manager: Any, row: Any, e: Exception) -> None:
    """A crate that could not be written: a warning (log and event), never the job's
    failure."""
    text = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
    log.warning("job %s: no provenance crate: %s", row["id"], text,
                exc_info=None if getattr(e, "message", None) else e)
    manager.ops.emit(row["op_id"], "provenance", f"no provenance crate: {text}",
                     level="warning")


def _announce(manager: Any, row: Any, path: Path) -> None:
    """Say where the crate is, with the checksum of the record it holds (so a rerun
    knows this folder wrote it: ``made_here``)."""
    manager.ops.emit(row["op_id"], "provenance", f"provenance crate: {path.parent}",
                     data={"crate": str(path.parent),
                           "job_sha256": sha256_of(path.parent / JOB_FILE)})


async def record_unrun(manager: Any, row: Any, state: str, reason: str | None,
                       content_dir: Path | None = None) -> Path | None:
    """The crate of a job that ends without having run (refused by its backend,
    cancelled while queued, failed at stage-in): the job as submitted, its notebook (from
    where it came, or as it was sent), its parameters and the reason, with no snapshot
    of a run that did not happen.  Skipped when the job already has its crate; a crate
    that cannot be written is a warning event, never a changed outcome.

    Reading the notebook, checksumming it and writing the crate happen on a thread
    (a notebook can be hundreds of megabytes: on the loop, every other job, request and
    kernel call would wait for it); the caller awaits it, so the crate exists before the
    job is recorded final."""
    import asyncio

    if not getattr(manager.hpc, "provenance", True) or not row["op_id"]:
        return None
    if any(e.step == "provenance" for e in manager.ops.events(row["op_id"])):
        return None
    spec, plan = loads(row["spec"], {}), loads(row["plan"], {})

    def write() -> Path:
        nb = None
        if spec.get("notebook"):
            name = Path(spec["notebook"]).name
            for candidate in (Path(spec["notebook"]),
                              *([content_dir / ".notebook" / name] if content_dir else [])):
                if candidate.is_file():
                    nb = candidate.read_bytes()
                    break
        return build(manager.fetch_dest(row["id"]), job=_job_fields(row), spec=spec,
                     plan=plan, state=state,
                     reason=manager.redact(reason) if reason else reason, exit_code=None,
                     before=None, after=None, notebook=nb, parameters_file=None,
                     outputs_at=None, listed=[])

    try:
        path = await asyncio.to_thread(write)
    except Exception as e:  # the record is lost, the outcome is not
        _lost(manager, row, e)
        return None
    _announce(manager, row, path)
    return path


# --- reading back ---------------------------------------------------------------------------------


def crate_file(crate: str | os.PathLike[str]) -> Path:
    """The metadata file of a crate given as its folder or the file itself."""
    path = Path(crate).expanduser()
    if path.is_dir():
        path = path / CRATE_FILE
    if not path.is_file():
        raise NotFoundError(
            f"crate: {str(crate)!r} is not a provenance crate (a folder holding {CRATE_FILE}, "
            "or that file) nor a job",
            field="crate",
        )
    return path


def read(crate: str | os.PathLike[str]) -> dict[str, Any]:
    """What a crate says about its run: the job as submitted, the notebook's source and
    checksum, the inputs' sources and checksums, the packages."""
    path = crate_file(crate)
    try:
        graph = {e["@id"]: e for e in json.loads(path.read_text())["@graph"]}
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"crate: {str(path)!r} is not RO-Crate metadata ({e})", field="crate"
        ) from None
    action = next((e for e in graph.values() if e.get("@type") == "CreateAction"), None)
    job_path = path.parent / JOB_FILE
    if action is None or not job_path.is_file():
        raise ConfigError(
            f"crate: {str(path)!r} is not a job's provenance crate (no run, or no {JOB_FILE})",
            field="crate",
        )
    job = json.loads(job_path.read_text())

    def ref(x):
        return graph.get(x["@id"], x) if isinstance(x, dict) else x

    instrument = ref(action.get("instrument") or {})
    inputs = {}
    for o in _many(action.get("object")):
        e = ref(o)
        if (
            e.get("@type") in ("File", "Dataset")
            and str(e.get("url", ""))
            and e.get("@id") not in (script.PARAMETERS_NAME, JOB_FILE)
        ):
            inputs[e.get("name")] = {"source": e.get("url"), "sha256": e.get("sha256")}
    packages = {}
    for r in _many(instrument.get("softwareRequirements")):
        e = ref(r)
        packages[e.get("name")] = e.get("softwareVersion")
    return {
        "job": job,
        "notebook": {
            "source": instrument.get("url"),
            "sha256": instrument.get("sha256"),
            "copy": str(path.parent / instrument["@id"]) if job.get("notebook") else None,
        },
        "inputs": inputs,
        "packages": packages,
        "id": action.get("identifier"),
        "folder": str(path.parent),
    }


def differences(
    recorded: dict[str, Any], *, packages: dict[str, str] | None = None, limit: int = 5
) -> list[str]:
    """What differs now from the recorded run, one short line each: the notebook's and
    each local input's checksum, package versions of this session."""
    out = []
    nb = recorded["notebook"]
    src = nb.get("source")
    if src and nb.get("sha256"):
        p = Path(src)
        if not p.is_file():
            out.append(f"notebook: {src} is gone; the crate's copy runs instead")
        elif sha256_of(p) != nb["sha256"]:
            out.append(
                f"notebook: {p.name} changed (sha256 {nb['sha256'][:12]} -> {sha256_of(p)[:12]})"
            )
    for name, item in recorded["inputs"].items():
        source = item.get("source") or ""
        if not item.get("sha256") or not source.startswith("/"):
            continue  # only local inputs can be checked from here
        now = local_digest(Path(source))
        if now is None:
            out.append(f"input {name}: {source} is gone")
        elif now != item["sha256"]:
            out.append(
                f"input {name}: {source} changed (sha256 {item['sha256'][:12]} -> {now[:12]})"
            )
    if recorded["packages"]:
        now = packages if packages is not None else session_packages()
        then = recorded["packages"]
        changed = [
            f"{n} {then[n]} -> {now[n]}" for n in sorted(then) if n in now and now[n] != then[n]
        ]
        gone = [f"{n} {then[n]} not installed" for n in sorted(then) if n not in now]
        new = [f"{n} {now[n]} new" for n in sorted(now) if n not in then]
        pk = changed + gone + new
        if pk:
            shown = ", ".join(pk[:limit]) + (
                f" and {len(pk) - limit} more" if len(pk) > limit else ""
            )
            out.append(f"packages: {shown}")
    return out


def rerun_spec(recorded: dict[str, Any]):
    """The JobSpec that runs the recorded job again (its notebook from where it came
    from, or the crate's copy if that is gone) and its backend."""
    job = dict(recorded["job"])
    backend = job.pop("backend", None)
    spec = JobSpec.from_dict(job)
    if spec.notebook:
        src = recorded["notebook"].get("source") or spec.notebook
        if not Path(src).is_file() and recorded["notebook"].get("copy"):
            src = recorded["notebook"]["copy"]
        spec.notebook = src
    return spec, backend


def made_here(crate: str | os.PathLike[str], recorded: dict[str, Any], client: Any) -> bool:
    """Whether this state folder wrote this crate's record of the job: the job's events
    (ours, in the store) name the checksum of the ``cloudtik-job.json`` it wrote, and the
    crate's is the same.  A crate from elsewhere — or one edited since — is someone else's
    description of a run, and running it runs their command."""
    job_file = crate_file(crate).parent / JOB_FILE
    try:
        digest = sha256_of(job_file)
        events = client.events(str(recorded.get("id")))
    except Exception:
        return False
    return any(e.step == "provenance" and (e.data or {}).get("job_sha256") == digest
               for e in events)


def describe_run(spec: Any, backend: str | None) -> str:
    """What a rerun would run, in a few lines a person can check."""
    what = (f"notebook {spec.notebook!r}" if spec.notebook
            else f"command {' '.join(spec.command or [])!r}")
    lines = [f"{what} on backend {backend!r}"]
    if spec.parameters:
        lines.append(f"parameters {spec.parameters!r}")
    if spec.inputs:
        lines.append(f"inputs {', '.join(spec.inputs)}")
    if spec.output:
        lines.append(f"results to {spec.output}")
    env = spec.environment
    if env is not None:
        for k in ("container", "python", "venv", "conda_env", "packages"):
            if getattr(env, k, None):
                lines.append(f"{k} {getattr(env, k)!r}")
        if env.setup:
            lines.append(f"setup lines {env.setup!r}")
    return "; ".join(lines)


__all__ = [
    "CRATE_FILE",
    "PROFILE",
    "build",
    "describe_run",
    "differences",
    "made_here",
    "read",
    "record_unrun",
    "redact",
    "rerun_spec",
    "snapshot_line",
]
