"""Building a job's provenance crate (RO-Crate, Process Run Crate profile): its terms,
the checksums, redaction of credentials in locations and messages, and ``build``, which
writes ``ro-crate-metadata.json`` and the job file into a results folder."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..core.errors import ConfigError
from ..core.locations import split_named
from . import script
from .provenance_snapshot import session_packages

PROFILE = "https://w3id.org/ro/wfrun/process/0.5"
CRATE_VERSION = "1.1"  # the RO-Crate version Process Run Crate 0.5 builds on
CRATE_FILE = "ro-crate-metadata.json"
JOB_FILE = "cloudtik-job.json"  # the job as submitted (no environment variables' values)
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


def job_record(spec: dict[str, Any], backend: str) -> dict[str, Any]:
    """The job as the crate keeps it for a rerun (``cloudtik-job.json``): the spec with
    environment variables' values left out and credentials in locations redacted."""
    record = dict(spec)
    if record.get("environment"):
        record["environment"] = {**record["environment"], "variables": {}}
    record["inputs"] = [redact(i) for i in record.get("inputs") or []]
    if record.get("output"):
        record["output"] = redact(record["output"])
    record["backend"] = backend
    return record


def redact_text(text: str) -> str:
    """``text`` (a failure message: a stage-out error names where it copied to) with
    every URL in it redacted as ``redact`` does a location: the message goes into a
    crate that is shared, and a location's ``user:password@`` or ``?sig=`` must not."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


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
    plan_env = plan.get("environment") or {}
    container = plan_env.get("container")
    if container:
        props["containerImage"] = _container(entity, container,
                                             plan_env.get("container_runtime") or "apptainer")
    props = {k: v for k, v in props.items() if v is not None}
    action = crate.add_action(instrument, identifier=f"#run-{job['id']}", properties=props)
    if objects:
        action["object"] = _single(objects)
    if results:
        action["result"] = _single(results)

    # the job as submitted, for rerun (environment variables' values are left out)
    record = job_record(spec, job["backend"])
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


def _container(entity, image: str, runtime: str = "apptainer"):
    ref = image
    for prefix in ("docker://", "oras://", "library://", "shub://"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    kind = "SIFImage" if image.endswith(".sif") else "DockerImage"
    props: dict[str, Any] = {
        "@type": "ContainerImage",
        "name": ref,
        "additionalType": {"@id": WFRUN_TERMS[kind]},
        "description": f"run with {runtime}",
    }
    if kind == "DockerImage":
        name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
        first = name.split("/", 1)[0]
        # Docker's rule: a first part with a dot or a port, or "localhost", is a registry
        # (Podman's locally built images are localhost/NAME)
        registry = first if "." in first or ":" in first or first == "localhost" \
            else "docker.io"
        props.update(name=name, registry=registry)
        if tag:
            props["tag"] = tag
    return entity(f"#container-{hashlib.sha256(image.encode()).hexdigest()[:12]}", props)
