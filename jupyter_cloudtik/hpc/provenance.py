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

import datetime as dt
import hashlib
import json
import logging
import os
import platform
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..core.errors import ConfigError, NotFoundError
from . import script

log = logging.getLogger("jupyter_cloudtik.hpc")

PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
CRATE_VERSION = "1.1"  # the RO-Crate version Process Run Crate 0.5 builds on
CRATE_FILE = "ro-crate-metadata.json"
JOB_FILE = "cloudtik-job.json"  # the job as submitted (no environment variables' values)
BEFORE, AFTER = "prov-before.json", "prov-after.json"
PYPI = "https://pypi.org/project/{name}/{version}/"
# the Workflow Run terms a Process Run Crate uses, inline (no remote context to fetch)
WFRUN_TERMS = {
    "ContainerImage": "https://w3id.org/ro/terms/workflow-run#ContainerImage",
    "containerImage": "https://w3id.org/ro/terms/workflow-run#containerImage",
    "registry": "https://w3id.org/ro/terms/workflow-run#registry",
    "tag": "https://w3id.org/ro/terms/workflow-run#tag",
    "DockerImage": "https://w3id.org/ro/terms/workflow-run#DockerImage",
    "SIFImage": "https://w3id.org/ro/terms/workflow-run#SIFImage",
}
SECRET_KEYS = re.compile(r"(pass|secret|token|key|sig|auth|cred)", re.I)

# what the job's script runs (with the job's interpreter, in the job's folder): hashes
# every file but the scaffolding; before the run also the interpreter and its packages
_SNAPSHOT = r"""
import hashlib, json, os, platform, socket, sys, time
phase, out = sys.argv[1], sys.argv[2]
files = {}
for root, dirs, names in os.walk('.'):
    if root == '.':
        dirs[:] = [d for d in dirs if d != '.cloudtik']
    for n in names:
        p = os.path.join(root, n)[2:]
        if root == '.' and n in ('job.sh', 'job.log'):
            continue
        h = hashlib.sha256()
        try:
            with open(p, 'rb') as f:
                for b in iter(lambda: f.read(1 << 20), b''):
                    h.update(b)
            files[p] = [h.hexdigest(), os.path.getsize(p)]
        except OSError:
            pass
PACKAGES_CODE
rec = {'time': time.time(), 'files': files}
if phase == 'before':
    rec.update(python=platform.python_version(), implementation=platform.python_implementation(),
               platform=platform.platform(), hostname=socket.gethostname())
    rec['packages'] = packages()
with open(out + '.tmp', 'w') as f:
    json.dump(rec, f)
os.replace(out + '.tmp', out)
"""


# installed packages by their metadata folders' names (``name-version.dist-info``): a
# directory listing per path entry, not a parse of every METADATA file (1 s for 250)
_PACKAGES = r"""
def packages(path=None):
    import os, re, sys
    found = {}
    for entry in (sys.path if path is None else path):
        if not entry or not os.path.isabs(entry):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for n in sorted(names):
            for ext in ('.dist-info', '.egg-info'):
                if n.endswith(ext):
                    name, sep, version = n[:-len(ext)].partition('-')
                    key = re.sub(r'[-_.]+', '-', name).lower()
                    if sep and key not in found:
                        found[key] = version.split('-py')[0]
    return found
"""
_SNAPSHOT = _SNAPSHOT.replace("PACKAGES_CODE", _PACKAGES)
_namespace: dict[str, Any] = {}
exec(_PACKAGES, _namespace)  # the same function for this session (no second copy)


def snapshot_line(run: str, phase: str) -> str:
    """The job-script line that records the ``phase`` (``before``/``after``) snapshot;
    its failure (no Python in an image, say) never fails the job."""
    from .base import shell_quote

    name = BEFORE if phase == "before" else AFTER
    return (
        f'{run} "$CT_PYTHON" -c {shell_quote(_SNAPSHOT)} {phase} '
        f"{script.MARKER_DIR}/{name} >/dev/null 2>&1 || true"
    )


# --- helpers ------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_digest(entries: dict[str, str]) -> str:
    """One checksum for a folder: sha256 of its sorted ``<sha256>  <relative path>`` lines
    (what ``sha256sum`` prints for its files)."""
    text = "".join(f"{entries[k]}  {k}\n" for k in sorted(entries))
    return hashlib.sha256(text.encode()).hexdigest()


def local_digest(path: Path) -> str | None:
    """A local input's checksum as its crate records it (a file's sha256, a folder's
    ``folder_digest``); None if it is gone."""
    try:
        if path.is_dir():
            return folder_digest(
                {
                    p.relative_to(path).as_posix(): sha256_of(p)
                    for p in path.rglob("*")
                    if p.is_file()
                }
            )
        return sha256_of(path)
    except OSError:
        return None


def redact(location: str) -> str:
    """A location without credentials: ``user:password@`` and secret-looking query
    parameters (``token``, ``sig``, ``key``, ...) are replaced by ``REDACTED``."""
    from ..core.locations import split_named

    name, rest = split_named(location)
    if name is not None:  # NAME=LOCATION
        return f"{name}={redact(rest)}"
    try:
        parts = urlsplit(location)
    except ValueError:
        return location
    if not parts.scheme or not parts.netloc:
        return location
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "REDACTED@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "REDACTED" if SECRET_KEYS.search(k) else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# a URL in prose: its last character is no sentence punctuation ("to URL: HTTP 403")
_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>`]*[^\s'"<>`.,;:)\]]""")


def redact_text(text: str) -> str:
    """``text`` (a failure message: a stage-out error names where it copied to) with
    every URL in it redacted as ``redact`` does a location: the message goes into a
    crate that is shared, and a location's ``user:password@`` or ``?sig=`` must not."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


def session_packages() -> dict[str, str]:
    """This session's installed packages (normalized name -> version), read as a job's
    snapshot reads its own."""
    return _namespace["packages"]()


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _uri(location: str) -> str:
    """An input's source as an absolute URI (the crate's id for it)."""
    if location.startswith("/"):
        return Path(location).as_uri()
    head, sep, _ = location.partition(":")
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head):
        return location  # a URL, BACKEND:/path, remote:path, sent:name
    return Path(os.path.abspath(location)).as_uri()


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, int):
        return "Integer"
    if isinstance(value, float):
        return "Float"
    if isinstance(value, str):
        return "Text"
    return "StructuredValue"  # lists and mappings: the value is their JSON


def _require_rocrate():
    try:
        from rocrate.rocrate import ROCrate
    except ImportError:
        raise ConfigError(
            "provenance: the 'rocrate' package is not installed; install it "
            "(pip install rocrate) to record provenance crates",
            field="provenance",
        ) from None
    return ROCrate


# --- writing ------------------------------------------------------------------------------------


def build(
    folder: Path,
    *,
    job: dict[str, Any],
    spec: dict[str, Any],
    plan: dict[str, Any],
    state: str,
    reason: str | None,
    exit_code: int | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    notebook: bytes | None,
    parameters_file: bytes | None,
    outputs_at: str | None = None,
    listed: list[str] | None = None,
) -> Path:
    """Write the crate of one finished job into ``folder``; returns its metadata file.

    ``job``: id, name, backend, backend_type, native_id, user, submitted_at, started_at,
    finished_at; ``outputs_at``: the job's folder on its system as a URI (the outputs'
    ids: they stay there until fetched); ``listed``: the backend's list of the job's
    outputs (what it would fetch); ``before``/``after``: the job's own snapshots (None
    if it wrote none: the job never started, or it has no Python), then the session's
    environment is recorded instead and the files have no checksums."""
    from rocrate.model.contextentity import ContextEntity

    ROCrate = _require_rocrate()
    folder.mkdir(parents=True, exist_ok=True)
    crate = ROCrate(version=CRATE_VERSION)
    crate.metadata.extra_terms.update(WFRUN_TERMS)
    add = crate.add
    before_files = (before or {}).get("files") or {}
    after_files = (after or {}).get("files") or {}

    def entity(eid: str, props: dict[str, Any]):
        return add(ContextEntity(crate, eid, properties=props))

    def checksum(name: str, files: dict[str, Any]) -> dict[str, Any]:
        """sha256 and size of a job-folder file, or of a folder (its digest)."""
        if name in files:
            digest, size = files[name]
            return {"sha256": digest, "contentSize": str(size)}
        inside = {k[len(name) + 1 :]: v for k, v in files.items() if k.startswith(name + "/")}
        if inside:
            return {
                "sha256": folder_digest({k: v[0] for k, v in inside.items()}),
                "contentSize": str(sum(v[1] for v in inside.values())),
            }
        return {}

    # the environment: the job's interpreter and packages (or the session's)
    env = before if before and before.get("python") else None
    py_version = env["python"] if env else platform.python_version()
    packages = (env or {}).get("packages") or ({} if env else session_packages())
    python = entity(
        f"https://www.python.org/downloads/release/python-{py_version.replace('.', '')}/",
        {
            "@type": "SoftwareApplication",
            "name": "Python",
            "softwareVersion": py_version,
            "url": "https://www.python.org/",
        },
    )
    requirements = [
        entity(
            PYPI.format(name=n, version=v),
            {
                "@type": "SoftwareApplication",
                "name": n,
                "softwareVersion": v,
                "url": f"https://pypi.org/project/{n}/",
            },
        )
        for n, v in sorted(packages.items(), key=lambda kv: kv[0].lower())
    ]

    # the parameters
    formal, values = [], []
    for key, value in (spec.get("parameters") or {}).items():
        kind = _type_of(value)
        fp = entity(
            f"#param-{key}-formal",
            {
                "@type": "FormalParameter",
                "name": key,
                "additionalType": kind,
                "conformsTo": {
                    "@id": "https://bioschemas.org/profiles/FormalParameter/1.0-RELEASE"
                },
            },
        )
        formal.append(fp)
        shown = value if kind != "StructuredValue" else json.dumps(value, sort_keys=True)
        values.append(
            entity(
                f"#param-{key}",
                {"@type": "PropertyValue", "name": key, "value": shown, "exampleOfWork": fp},
            )
        )

    # the notebook (a copy in the crate) or the command
    nb_name = Path(spec["notebook"]).name if spec.get("notebook") else None
    if nb_name:
        props = {
            "@type": ["File", "SoftwareSourceCode"],
            "name": nb_name,
            "encodingFormat": "application/x-ipynb+json",
            "programmingLanguage": python,
            "url": redact(spec["notebook"]),
            "description": "the notebook as the job ran it (papermill), before "
            "its parameters were injected",
            "input": _single(formal),
            "softwareRequirements": requirements,
        }
        if notebook is not None:
            (folder / nb_name).write_bytes(notebook)
            props.update(
                sha256=hashlib.sha256(notebook).hexdigest(), contentSize=str(len(notebook))
            )
        else:
            props.update(checksum(nb_name, before_files))
        instrument = crate.add_file(dest_path=nb_name, properties=props)
    else:
        argv = " ".join(str(a) for a in spec.get("command") or [])
        instrument = entity(
            "#command",
            {
                "@type": "SoftwareSourceCode",
                "name": argv[:200],
                "text": argv,
                "programmingLanguage": {"@id": "https://www.gnu.org/software/bash/"},
                "softwareRequirements": requirements,
            },
        )

    # the inputs: where each came from, and what the job got
    objects: list[Any] = list(values)
    if parameters_file is not None:
        (folder / script.PARAMETERS_NAME).write_bytes(parameters_file)
        objects.append(
            crate.add_file(
                dest_path=script.PARAMETERS_NAME,
                properties={
                    "name": "the parameters as papermill received them",
                    "encodingFormat": "application/json",
                    "sha256": hashlib.sha256(parameters_file).hexdigest(),
                    "contentSize": str(len(parameters_file)),
                },
            )
        )
    for item in plan.get("inputs") or []:
        source = f"sent:{item['name']}" if item.get("sent") else redact(item["source"])
        is_dir = not any(k == item["name"] for k in before_files) and any(
            k.startswith(item["name"] + "/") for k in before_files
        )
        props = {
            "@type": "Dataset" if is_dir else "File",
            "name": item["name"],
            "url": source,
            "description": f"input {item['name']!r}, staged "
            f"({item.get('mode', 'upload')}) from {source}",
        }
        props.update(checksum(item["name"], before_files))
        if not is_dir:
            props["encodingFormat"] = _media_type(item["name"])
        if "://" in source:  # a web resource: when the job read it
            props["sdDatePublished"] = _iso((before or {}).get("time") or job.get("started_at"))
        props = {k: v for k, v in props.items() if v is not None}
        objects.append(entity(_uri(source), props))

    # the outputs: what the job wrote, with checksums, where it wrote them (``fetch``
    # copies them into this folder, ``output`` to their ``url``)
    import fnmatch

    skip = {nb_name, script.PARAMETERS_NAME} | {i["name"] for i in plan.get("inputs") or []}
    nb_out = plan.get("output_notebook")
    patterns = spec.get("outputs") or []
    out_loc = spec.get("output")
    results = []
    for name in sorted(after_files):
        top = name.split("/", 1)[0]
        if top in skip or (listed is not None and name not in listed):
            continue
        if patterns and name != nb_out and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        digest, size = after_files[name]
        props = {
            "name": name,
            "sha256": digest,
            "contentSize": str(size),
            "encodingFormat": _media_type(name),
        }
        if name == nb_out:
            props.update(
                encodingFormat="application/x-ipynb+json", description="the executed notebook"
            )
        if out_loc:
            props["url"] = redact(out_loc.rstrip("/") + "/" + name)
        base = outputs_at or f"urn:cloudtik:job:{job['id']}"
        results.append(entity(f"{base.rstrip('/')}/{quote(name)}", {"@type": "File", **props}))

    # who, where, when, how it ended
    agent = entity(
        f"#person-{job.get('user') or 'unknown'}",
        {"@type": "Person", "name": job.get("user") or "unknown"},
    )
    host = (before or {}).get("hostname")
    sys_props = [
        entity(f"#system-{k}", {"@type": "PropertyValue", "name": k, "value": str(v)})
        for k, v in (
            ("backend", job["backend"]),
            ("backend_type", job["backend_type"]),
            ("native_id", job.get("native_id")),
            ("hostname", host),
            ("platform", (before or {}).get("platform")),
            ("exit_code", exit_code),
        )
        if v is not None
    ]
    system = entity(
        "#system",
        {
            "@type": "Place",
            "name": f"backend '{job['backend']}' ({job['backend_type']})"
            + (f" on {host}" if host else ""),
            "identifier": job["backend"],
            "additionalProperty": sys_props,
        },
    )
    ok = state == "succeeded"
    what = nb_name or "the command"
    props = {
        "@type": "CreateAction",
        "name": f"Run of {what} (job {job['id']})",
        "description": f"job {job['id']} ({job.get('name')}) on backend '{job['backend']}' "
        f"({job['backend_type']}): {state}"
        + (f", exit code {exit_code}" if exit_code is not None else ""),
        "identifier": job["id"],
        "agent": agent,
        "location": system,
        # a plain IRI string, as the profile's examples and roc-validator have it
        "actionStatus": "http://schema.org/CompletedActionStatus"
        if ok
        else "http://schema.org/FailedActionStatus",
        "startTime": _iso(
            (before or {}).get("time") or job.get("started_at") or job.get("submitted_at")
        ),
        "endTime": _iso((after or {}).get("time") or job.get("finished_at")),
    }
    if not ok:
        props["error"] = redact_text(reason or state)
    container = (plan.get("environment") or {}).get("container")
    if container:
        props["containerImage"] = _container(entity, container)
    props = {k: v for k, v in props.items() if v is not None}
    action = crate.add_action(instrument, identifier=f"#run-{job['id']}", properties=props)
    if objects:
        action["object"] = _single(objects)
    if results:
        action["result"] = _single(results)

    # the job as submitted, for rerun (environment variables' values are left out)
    record = dict(spec)
    if record.get("environment"):
        record["environment"] = {**record["environment"], "variables": {}}
    record["inputs"] = [redact(i) for i in record.get("inputs") or []]
    if record.get("output"):
        record["output"] = redact(record["output"])
    record["backend"] = job["backend"]
    job_text = json.dumps(record, indent=1, sort_keys=True, default=str).encode()
    (folder / JOB_FILE).write_bytes(job_text)
    crate.add_file(
        dest_path=JOB_FILE,
        properties={
            "name": "the job as submitted (what rerun submits again)",
            "encodingFormat": "application/json",
            "sha256": hashlib.sha256(job_text).hexdigest(),
            "contentSize": str(len(job_text)),
        },
    )

    profile = entity(
        PROFILE, {"@type": "CreativeWork", "name": "Process Run Crate", "version": "0.5"}
    )
    root = crate.root_dataset
    root["name"] = f"Provenance of job {job['id']} ({job.get('name')})"
    root["description"] = (
        f"How {what} ran as job {job['id']} on backend '{job['backend']}': {state}"
    )
    root["conformsTo"] = profile
    # every data entity is part of the crate (RO-Crate 1.1): those outside the folder too
    parts = list(root.get("hasPart") or [])
    known = {p["@id"] if isinstance(p, dict) else p.id for p in parts}
    root["hasPart"] = parts + [
        e for e in [*objects, *results] if e.type in ("File", "Dataset") and e.id not in known
    ]
    root["mentions"] = action
    root["author"] = agent
    # no license is the job's to choose: the text says so (RO-Crate 1.1 wants one)
    root["license"] = (
        "not specified: the person who ran the job decides how this record may be used"
    )
    root["datePublished"] = _iso(job.get("finished_at") or (after or {}).get("time"))
    data = crate.metadata.generate()
    target = folder / CRATE_FILE
    tmp = folder / (CRATE_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False))
    os.replace(tmp, target)
    return target


def _single(items: list[Any]) -> Any:
    """One value alone, not in a list (RO-Crate 1.1's compact form)."""
    return items[0] if len(items) == 1 else items


def _many(value: Any) -> list[Any]:
    """A property's values as a list (one value may stand alone)."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _media_type(name: str) -> str:
    import mimetypes

    if name.endswith(".ipynb"):
        return "application/x-ipynb+json"
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _container(entity, image: str):
    ref = image
    for prefix in ("docker://", "oras://", "library://", "shub://"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    kind = "SIFImage" if image.endswith(".sif") else "DockerImage"
    props: dict[str, Any] = {
        "@type": "ContainerImage",
        "name": ref,
        "additionalType": {"@id": WFRUN_TERMS[kind]},
    }
    if kind == "DockerImage":
        name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
        first = name.split("/", 1)[0]
        registry = first if "." in first or ":" in first else "docker.io"
        props.update(name=name, registry=registry)
        if tag:
            props["tag"] = tag
    return entity(f"#container-{hashlib.sha256(image.encode()).hexdigest()[:12]}", props)


async def record(
    manager: Any, row: Any, be: Any, state: str, reason: str | None, exit_code: int | None
) -> Path | None:
    """Write the crate of a job reaching ``state`` into the folder its results are
    fetched into, and say where in an event (``provenance``).  A crate that cannot be
    written is a warning event, never the job's failure."""
    import asyncio
    import time

    from ..core.store import loads
    from .base import BackendUnavailable, JobRef

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
        job = {
            k: row[k]
            for k in (
                "id",
                "name",
                "backend",
                "backend_type",
                "native_id",
                "user",
                "submitted_at",
                "started_at",
            )
        }
        job["finished_at"] = time.time()
        folder = manager.fetch_dest(row["id"])
        return build(
            folder,
            job=job,
            spec=spec,
            plan=plan,
            state=state,
            reason=reason,
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
        text = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        log.warning(
            "job %s: no provenance crate: %s",
            row["id"],
            text,
            exc_info=None if getattr(e, "message", None) else e,
        )
        manager.ops.emit(
            row["op_id"], "provenance", f"no provenance crate: {text}", level="warning"
        )
        return None
    manager.ops.emit(
        row["op_id"],
        "provenance",
        f"provenance crate: {path.parent}",
        data={"crate": str(path.parent)},
    )
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
    from .base import JobSpec

    job = dict(recorded["job"])
    backend = job.pop("backend", None)
    spec = JobSpec.from_dict(job)
    if spec.notebook:
        src = recorded["notebook"].get("source") or spec.notebook
        if not Path(src).is_file() and recorded["notebook"].get("copy"):
            src = recorded["notebook"]["copy"]
        spec.notebook = src
    return spec, backend


__all__ = [
    "CRATE_FILE",
    "PROFILE",
    "build",
    "differences",
    "read",
    "redact",
    "rerun_spec",
    "snapshot_line",
]
