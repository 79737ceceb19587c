"""The HPC backend plugin interface and the job model every backend shares.

Names follow PSI/J (the Portable Submission Interface for Jobs) where it has one: a job is
described by a ``JobSpec`` with a ``ResourceSpec`` (node_count, processes_per_node,
cpu_cores_per_process, memory) and ``JobAttributes`` (duration, queue_name, account,
reservation_id, custom_attributes); a backend reports a ``JobStatus``.  PSI/J's states
(NEW, QUEUED, ACTIVE, COMPLETED, FAILED, CANCELED) become our common set ``queued``,
``running``, ``succeeded``, ``failed``, ``cancelled`` plus ``unknown`` (the backend could
not be asked) — and the backend's own state (``PENDING``, ``arcrest:FINISHING``, ...) is
always kept alongside, because people who know their scheduler want to see it.

A backend is a plugin (entry point group ``jupyter_cloudtik.hpc_backends``) configured by
name, so one kind may have several instances (two Slurm clusters, say).  Its calls are
blocking (SDKs and ssh are); the job manager runs them in worker threads.  A backend never
keeps job state of its own that matters: the job manager's store is the record, and
``find(token)`` lets a submit that may or may not have reached the backend be completed
without running the job twice.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..core.errors import BackendUnavailable, CapacityError, ConfigError
from ..core.grants import policy_for
from ..core.lazy_jsonschema import jsonschema as _jsonschema
from ..core.units import format_bytes, format_duration, parse_bytes, parse_duration

# the common states; "submitting" is ours only: recorded, not yet accepted by the backend
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, UNKNOWN = (
    "queued", "running", "succeeded", "failed", "cancelled", "unknown")
SUBMITTING = "submitting"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, UNKNOWN)
FINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)
ACTIVE_STATES = (SUBMITTING, QUEUED, RUNNING, UNKNOWN)

ENTRY_POINT_GROUP = "jupyter_cloudtik.hpc_backends"


class CredentialsExpired(BackendUnavailable):
    """The user's credentials for the backend expired (a proxy certificate past its
    notAfter, a token past its ``exp``): the backend cannot be asked until they are
    renewed.  Its jobs stay ``unknown`` with this message (not "did not answer") and go
    on by themselves once renewed credentials appear."""

    reason = "credentials_expired"


# --- the job model (PSI/J names) -----------------------------------------------------------

@dataclass
class ResourceSpec:
    """What the job needs; ``None`` leaves the backend's default."""

    node_count: int = 1
    processes_per_node: int = 1
    cpu_cores_per_process: int | None = None
    memory: int | None = None  # bytes per node
    gpus_per_node: int | None = None

    @property
    def cpus_per_node(self) -> int | None:
        if self.cpu_cores_per_process is None:
            return None
        return self.cpu_cores_per_process * self.processes_per_node


@dataclass
class JobAttributes:
    duration: float | None = None  # seconds of wall time
    queue_name: str | None = None  # Slurm partition, ARC queue
    account: str | None = None
    reservation_id: str | None = None
    custom_attributes: dict[str, str] = field(default_factory=dict)


@dataclass
class Environment:
    """Where the job runs its code.

    The default is the session's own environment: the interpreter of this kernel (and its
    virtualenv or conda env).  ``container`` runs everything inside an image instead —
    an Apptainer/Singularity image reference (``docker://...``, ``/path/img.sif``) or a
    Podman image (``container_runtime: podman``) on systems that need one.
    """

    python: str | None = None
    venv: str | None = None
    conda_env: str | None = None
    container: str | None = None
    # apptainer (when not said), singularity or podman; None so that a job's own
    # environment does not replace the backend's runtime with the default (merged)
    container_runtime: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines, e.g. "module load cray"
    variables: dict[str, str] = field(default_factory=dict)
    # the session's environment built on the system (hpc/environment.py): "session" (every
    # installed package), a list of names (those, with what they require), "system" (the
    # system's own Python as it is); None: the backend's default
    packages: Any = None
    requirements: str | None = None  # a requirements file (name==version, wheel files)
    # a requirements or lock file's contents, sent over REST (hpc/env_requirements.py:
    # requirement lines and --hash only, no files: the sender's paths are never read)
    requirements_text: str | None = None
    base_python: str | None = None  # the system's Python the venv is made with
    keep_days: float | None = None  # unused built environments are removed after this
    build: dict[str, Any] | None = None  # how it was had: mode, hash, root, pins (the plan)

    @classmethod
    def session(cls) -> Environment:
        """The environment of this process (the kernel's, inside a notebook)."""
        venv = sys.prefix if sys.prefix != sys.base_prefix else None
        return cls(python=sys.executable, venv=venv,
                   conda_env=os.environ.get("CONDA_PREFIX") or None)

    def merged(self, override: dict[str, Any] | None) -> Environment:
        """This environment with ``override``'s values; a container replaces the session's
        interpreter and envs (they do not exist inside the image) unless given again."""
        if not override:
            return self
        data = asdict(self)
        if override.get("container"):
            data.update(python=None, venv=None, conda_env=None)
        data.update({k: v for k, v in override.items() if v is not None})
        return Environment(**data)


@dataclass
class JobSpec:
    """A notebook run with papermill (with parameters), or a command."""

    name: str | None = None
    notebook: str | None = None  # a local path (or a location a stager understands)
    command: list[str] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    kernel: str = "python3"
    resources: ResourceSpec = field(default_factory=ResourceSpec)
    attributes: JobAttributes = field(default_factory=JobAttributes)
    environment: Environment | None = None  # None: the backend's default (the session's)
    inputs: list[str] = field(default_factory=list)  # locations to stage in
    outputs: list[str] = field(default_factory=list)  # glob patterns to bring back
    output: str | None = None  # where results land; None: the job's own folder
    # parameters the notebook's parameters cell does not assign (or no such cell): a
    # warning on the job instead of a refusal (papermill injects them anyway)
    allow_unknown_parameters: bool = False

    @property
    def kind(self) -> str:
        return "notebook" if self.notebook else "command"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        d = dict(d)
        d["resources"] = ResourceSpec(**(d.get("resources") or {}))
        d["attributes"] = JobAttributes(**(d.get("attributes") or {}))
        if d.get("environment") is not None:
            d["environment"] = Environment(**d["environment"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class StageIn:
    """One input as the backend receives it.

    ``mode`` says who moves it: ``upload`` (the manager hands over the local file at
    ``source``), ``direct`` (the backend or the job reads ``source`` itself: a path on
    the system's own filesystem, or a URL the system fetches).
    """

    name: str  # file or folder name in the job's folder
    source: str
    mode: str = "upload"
    size: int | None = None


@dataclass
class Submission:
    """Everything a backend needs to start one job."""

    job_id: str  # ours; also the name of the job's folder on the backend
    token: str  # client token: the same job submitted twice must be found, not rerun
    spec: JobSpec
    environment: Environment
    files: dict[str, str] = field(default_factory=dict)  # job folder name -> local path
    inputs: list[StageIn] = field(default_factory=list)
    output_notebook: str | None = None  # the executed notebook's name in the job folder
    stage_out: str | None = None  # a location the job itself copies results to

    @property
    def name(self) -> str:
        return self.spec.name or self.job_id


@dataclass(frozen=True)
class JobRef:
    """A submitted job as a backend sees it: our id (its folder's name) and the system's."""

    id: str
    native_id: str


@dataclass
class JobStatus:
    state: str
    native_state: str | None = None
    message: str | None = None
    exit_code: int | None = None
    time: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass
class LogChunk:
    text: str
    offset: int  # where the next read starts
    eof: bool = False  # nothing more to read right now


#: the job folder's own files (markers, provenance snapshots, the inputs list), beside
#: the user's: here because the job script, the provenance snapshot and the file staging
#: all name it
MARKER_DIR = ".cloudtik"


def remote_inside(folder: str, name: str) -> str:
    """``name`` as a path inside the job's ``folder`` on a remote system (POSIX paths,
    nothing this process can resolve): a name that leaves it (``..``, absolute) is
    refused, so a caller's file name never reaches outside the job."""
    path = posixpath.normpath(f"{folder}/{name}")
    if not path.startswith(folder + "/"):
        raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
    return path


def follow_logs(read: Callable[[int], LogChunk], done: Callable[[], bool], offset: int = 0,
                poll: float = 0.5) -> Iterator[str]:
    """Log text as it is written, until the job has ended and everything was read: what
    every jobs client's ``follow_logs`` is, given its ``logs`` (from an offset) and
    whether the job is done.  One last read after ``done`` catches what was written
    between the empty read and the job's end."""
    while True:
        chunk = read(offset)
        offset = chunk.offset
        if chunk.text:
            yield chunk.text
            continue
        if done():
            final = read(offset)
            if final.text:
                yield final.text
            return
        time.sleep(poll)


@dataclass
class OutputFile:
    name: str  # relative to the job's folder
    size: int | None = None
    is_dir: bool = False


@dataclass
class Limits:
    """What a backend (or one of its queues) accepts; ``None`` = no known limit."""

    max_nodes: int | None = None
    max_cpus_per_node: int | None = None
    max_memory_per_node: int | None = None
    max_duration: float | None = None
    queues: list[str] | None = None  # None: any name; the backend decides
    default_queue: str | None = None
    per_queue: dict[str, Limits] = field(default_factory=dict)

    def for_queue(self, queue: str | None) -> Limits:
        return self.per_queue.get(queue or self.default_queue or "", self)


@dataclass
class BackendContext:
    """What the job manager gives a backend: its secrets, a folder, a logger."""

    state_dir: Path
    secrets: Any  # core.secrets.SecretStore
    log: Any
    settings: Any = None
    name: str = ""

    @property
    def secret_scope(self) -> str:
        return f"hpc:{self.name}"

    def secret(self, key: str, default: str | None = None) -> str | None:
        """One of the backend's own credentials (its token, SSH key): used by this process
        to talk to the system, never handed to a job."""
        if self.secrets is None or not self.secrets.has(self.secret_scope, key):
            return default

        grant = policy_for(self.secrets.store).service(
            "hpc", self.name, "the backend talks to its system with its own credentials")
        return self.secrets.reveal(grant, key)

    @property
    def folder(self) -> Path:
        path = self.state_dir / "hpc" / "backends" / self.name
        path.mkdir(parents=True, exist_ok=True)
        return path


class HPCBackend:
    """Base class of HPC backends (PSI/J's JobExecutor, plus data staging).

    Subclasses set ``kind``, ``config_schema`` and implement ``submit``, ``poll`` (or
    ``status``), ``cancel``, ``logs``, ``list_outputs``, ``read_file`` and
    ``fetch_outputs``; the defaults of the rest are usable.
    """

    kind: ClassVar[str] = ""
    description: ClassVar[str] = ""
    config_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    # URL schemes the system itself can read inputs from (and write outputs to): no
    # staging through the session is needed for those
    direct_schemes: ClassVar[tuple[str, ...]] = ()
    # local paths are visible to the jobs (the job runs on this machine or on a
    # filesystem shared with it)
    shares_local_filesystem: ClassVar[bool] = False

    def __init__(self, name: str, config: dict[str, Any], context: BackendContext) -> None:
        self.name = name
        self.config = dict(config)
        self.context = context
        self.validate_config()

    # configuration ------------------------------------------------------------------------
    def validate_config(self) -> None:
        jsonschema = _jsonschema()
        try:
            jsonschema.validate(self.config, self.config_schema)
        except jsonschema.ValidationError as e:
            path = ".".join(str(p) for p in e.absolute_path)
            where = f"backends.{self.name}" + (f".{path}" if path else "")
            raise ConfigError(f"{where}: {e.message}", field=where) from None

    def describe(self) -> dict[str, Any]:
        """A summary fit for listing: no secrets."""
        shown = {k: v for k, v in self.config.items()
                 if k not in ("type",) and "secret" not in k and "password" not in k
                 and k != "token"}
        return {"name": self.name, "type": self.kind, "config": shown,
                "direct": self.directly_reachable()}

    def known_folders(self) -> list[str]:
        """Folders of the system this backend knows already (its jobs' work folder), asked
        of nothing: what the hub does not show its users."""
        # a resolved remote folder (``_workdir``) or a local one; a property that would
        # ask the system first is not called
        folder = self.__dict__.get("_workdir") or self.__dict__.get("workdir")
        return [str(folder)] if folder else []

    def directly_reachable(self) -> list[str]:
        """Which storages the system reads and writes without staging, for people."""
        if self.shares_local_filesystem:
            return ["local paths", *self.reaches()]
        return [f"{self.name}:/paths", *self.reaches()]

    def default_environment(self) -> Environment:
        env = Environment.session()
        return env.merged(self.config.get("environment"))

    # the job's environment (hpc/environment.py) ---------------------------------------------
    def builds_environment(self) -> bool:
        """True when the jobs cannot run this session's interpreter (another machine or
        account): the session's environment is then built on the system by default."""
        return False

    def environment_root(self) -> str | None:
        """The folder on the system where environments are built (None: this backend
        cannot build them)."""
        return None

    def environment_shell(self) -> Any:
        """Commands and files on the system (``transport/shell.py``), for building envs."""
        return None

    def prepare_environment(self, merged: Environment,
                            given: Environment | None = None) -> Environment:
        """Decide how the job gets its environment and check, before anything is
        recorded, that the system can have it (``hpc/environment.py``)."""
        # deferred: start-up (hpc.environment ~32 ms, loads importlib.metadata)
        from . import environment as envs

        return envs.prepare(self, merged, given)

    def stage_environment(self, sub: Submission) -> None:
        """Put a built environment's wheels and build script on the system (submit)."""
        # deferred: start-up (hpc.environment ~32 ms, loads importlib.metadata)
        from . import environment as envs

        build = sub.environment.build or {}
        if build.get("hash"):
            envs.stage(self.environment_shell(), build["root"], build, f"backend '{self.name}'")

    # capabilities ---------------------------------------------------------------------------
    def limits(self) -> Limits:
        """Limits from the config (``limits:``); backends add what their system reports."""
        return limits_from_config(self.config.get("limits") or {}, self.name)

    def validate(self, spec: JobSpec) -> None:
        """Refuse a job the system cannot run, before anything is submitted."""
        check_limits(spec, self.limits(), self.name)

    def reaches(self) -> tuple[str, ...]:
        """URL schemes the jobs fetch themselves (config ``reaches:`` overrides)."""
        return tuple(self.config.get("reaches", self.direct_schemes))

    def system_path(self, location: str) -> str | None:
        """``NAME:/path`` names a path on this backend's own system; its path, else None."""
        prefix = f"{self.name}:"
        if location.startswith(prefix) and location[len(prefix):].startswith("/"):
            return location[len(prefix):]
        return None

    def can_reach(self, location: str) -> bool:
        """Can the job read (or write) ``location`` itself, without the session staging?"""
        if self.system_path(location) is not None:
            return True
        scheme = location.split("://", 1)[0].lower() if "://" in location else None
        if scheme is None:
            return self.shares_local_filesystem and Path(location).is_absolute()
        if scheme == "file":
            return self.shares_local_filesystem
        return scheme in self.reaches()

    # jobs -------------------------------------------------------------------------------------
    def submit(self, sub: Submission) -> str:
        raise NotImplementedError

    def find(self, token: str, job_id: str) -> str | None:
        """The native id of a job submitted with ``token`` (by an interrupted submit)."""
        return None

    def status(self, job: JobRef) -> JobStatus:
        return self.poll([job])[job.native_id]

    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        """The status of many jobs in as few calls as the system allows, by native id."""
        return {j.native_id: self.status(j) for j in jobs}

    def cancel(self, job: JobRef) -> None:
        raise NotImplementedError

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        """The job's log (stdout and stderr) from byte ``offset``: incremental reads."""
        raise NotImplementedError

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        raise NotImplementedError

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        """A (small) file of the job's folder, e.g. the executed notebook."""
        raise NotImplementedError

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        """Copy the named files of the job's folder into ``dest``; returns local paths."""
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read_file(job, name, limit=1 << 40))
            out.append(target)
        return out

    def clean(self, job: JobRef) -> None:
        """Forget the job on the system (remove its folder); optional."""

    def close(self) -> None:
        """Release connections."""


# --- helpers shared by backends ------------------------------------------------------------

def limits_from_config(cfg: dict[str, Any], name: str) -> Limits:
    def one(c: dict[str, Any], where: str) -> Limits:
        mem = c.get("max_memory_per_node")
        return Limits(
            max_nodes=c.get("max_nodes"),
            max_cpus_per_node=c.get("max_cpus_per_node"),
            max_memory_per_node=parse_bytes(mem, f"{where}.max_memory_per_node")
            if mem is not None else None,
            max_duration=parse_duration(c.get("max_time"), f"{where}.max_time"),
        )

    base = one(cfg, f"backends.{name}.limits")
    queues = cfg.get("queues")
    if isinstance(queues, dict):
        base.queues = sorted(queues)
        base.per_queue = {q: one(v or {}, f"backends.{name}.limits.queues.{q}")
                          for q, v in queues.items()}
    elif isinstance(queues, list):
        base.queues = list(queues)
    return base


def check_limits(spec: JobSpec, limits: Limits, backend: str) -> None:
    r, a = spec.resources, spec.attributes
    if r.node_count < 1:
        raise ConfigError(f"nodes: {r.node_count} is not a node count; use 1 or more",
                          field="nodes")
    if limits.queues is not None and a.queue_name and a.queue_name not in limits.queues:
        raise ConfigError(
            f"queue: '{a.queue_name}' is not a partition/queue of backend '{backend}'; "
            f"available: {', '.join(limits.queues) or 'none'}", field="queue")
    queue = a.queue_name or limits.default_queue
    q = limits.for_queue(queue)
    where = f"backend '{backend}'" + (f", queue '{queue}'," if queue in limits.per_queue
                                      else "")
    if q.max_nodes is not None and r.node_count > q.max_nodes:
        raise CapacityError(
            f"nodes: {r.node_count} is more than {where} allows (at most {q.max_nodes})",
            field="nodes")
    cpus = r.cpus_per_node
    if q.max_cpus_per_node is not None and cpus is not None and cpus > q.max_cpus_per_node:
        raise CapacityError(
            f"cpus: {cpus} per node is more than {where} has (at most "
            f"{q.max_cpus_per_node})", field="cpus")
    if q.max_memory_per_node is not None and r.memory is not None \
            and r.memory > q.max_memory_per_node:
        raise CapacityError(
            f"memory: {format_bytes(r.memory)} per node is more than {where} has (at most "
            f"{format_bytes(q.max_memory_per_node)})", field="memory")
    if q.max_duration is not None and a.duration is not None and a.duration > q.max_duration:
        raise CapacityError(
            f"time: {format_duration(a.duration)} is longer than {where} allows (at most "
            f"{format_duration(q.max_duration)})", field="time")


def shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(str(s))
