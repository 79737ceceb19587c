"""``slurm``: jobs through ``sbatch``, watched with ``squeue``/``scontrol``, ended with ``scancel``.

Commands run on the login node — this machine when the server runs on one, otherwise
over SSH (``host:``; the key comes from the secret store, ``ssh_key``).  Each job gets a
folder ``<workdir>/<job id>`` holding the rendered batch script (resources as ``#SBATCH``
lines, environment activation, staging commands, the papermill call), its inputs, its
log and its results.

Polling is one ``squeue --me --states=all`` for every job of the backend.  Jobs squeue
has forgotten (finished longer than ``MinJobAge`` ago, 300 s by default) are asked of
Slurm's accounting with one ``sacct`` for all of them — it keeps the final state
(``CANCELLED by 0``, ``TIMEOUT``, ``OUT_OF_MEMORY``...) and exit code long after — and, on
sites without accounting, of ``scontrol`` and the markers the script leaves in the job's
folder.  A submit is recognised later by the client token in the job's ``--comment``
(squeue, then sacct), so an interrupted submit is never run twice.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ..core.errors import BackendUnavailable, ConfigError, NotFoundError, ProviderError
from ..core.units import parse_duration
from ..transport.shell import Result
from ..transport.slurm import SlurmLogin, parse_kv, slurm_int
from . import script
from .base import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    UNKNOWN,
    BackendContext,
    HPCBackend,
    JobRef,
    JobStatus,
    Limits,
    LogChunk,
    OutputFile,
    Submission,
    remote_inside,
    shell_quote,
)
from .files import INPUTS_LIST, input_names

QUEUED_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                 "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
FAILED_STATES = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}
FAILURE_TEXT = {"TIMEOUT": "the time limit was reached", "OUT_OF_MEMORY": "out of memory",
                "NODE_FAIL": "a node failed", "BOOT_FAIL": "a node failed to boot",
                "DEADLINE": "the deadline passed", "PREEMPTED": "preempted"}
LIMITS_TTL = 60.0
CANCEL_MARKER = "cancel_requested"  # in the job's marker folder: scancel was sent


def first_word(native: object) -> str:
    """The state word of what Slurm says (``CANCELLED by 0`` -> ``CANCELLED``); "" for
    nothing, blanks only, or a value that is not text (a JSON answer's number)."""
    words = native.split() if isinstance(native, str) else []
    return words[0] if words else ""


def common_state(native: str) -> str:
    native = first_word(native).upper()
    if native in QUEUED_STATES:
        return QUEUED
    if native in RUNNING_STATES:
        return RUNNING
    if native == "COMPLETED":
        return SUCCEEDED
    if native == "CANCELLED":
        return CANCELLED
    if native in FAILED_STATES:
        return FAILED
    return UNKNOWN


def slurm_time(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def parse_squeue_states(stdout: str) -> dict[str, tuple[str, str]]:
    """``squeue -h -o %i|%T|%r`` lines: job id -> (state, reason)."""
    seen: dict[str, tuple[str, str]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3:
            seen[parts[0]] = (parts[1], parts[2])
    return seen


def parse_sacct_states(stdout: str,
                       native_ids: list[str]) -> dict[str, tuple[str, str, int | None]]:
    """``sacct -X -n -P -o JobID,State,Reason,ExitCode`` lines of ``native_ids``: id ->
    (state, reason, exit code; a signal ``0:9`` as 128 + 9)."""
    out = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or parts[0] not in native_ids:
            continue
        code, _, signal = parts[3].partition(":")
        rc, sig = slurm_int(code), slurm_int(signal)
        if rc == 0 and sig:
            rc = 128 + sig
        out[parts[0]] = (parts[1], parts[2], rc)
    return out


def limits_from_scontrol(lim: Limits, partitions: str, nodes: str) -> str | None:
    """Fill ``lim`` (queues, per-queue limits) from ``scontrol show partition -o`` and
    ``scontrol show node -o``; returns the default partition (or None)."""
    node_info = [parse_kv(line) for line in nodes.splitlines() if line.strip()]
    queues, default = [], None
    for line in partitions.splitlines():
        p = parse_kv(line)
        name = p.get("PartitionName")
        if not name or p.get("State", "UP") not in ("UP",):
            continue
        queues.append(name)
        if p.get("Default") == "YES":
            default = name
        members = [n for n in node_info if name in n.get("Partitions", "").split(",")]
        q = lim.per_queue.get(name) or Limits()
        # UNLIMITED, or anything else that is not a number: no limit known
        max_nodes, total = slurm_int(p.get("MaxNodes")), slurm_int(p.get("TotalNodes"))
        q.max_nodes = _min(q.max_nodes, _min(max_nodes, total), lim.max_nodes)
        cpus = max((c for n in members if (c := slurm_int(n.get("CPUTot"))) is not None),
                   default=None)
        q.max_cpus_per_node = _min(q.max_cpus_per_node, cpus, lim.max_cpus_per_node)
        mem = max((m * 1024 * 1024 for n in members
                   if (m := slurm_int(n.get("RealMemory"))) is not None), default=None)
        q.max_memory_per_node = _min(q.max_memory_per_node, mem, lim.max_memory_per_node)
        mt = p.get("MaxTime", "UNLIMITED")
        try:  # UNLIMITED, INFINITE, or what is no positive duration: no limit known
            seconds = parse_duration(mt) if mt not in ("UNLIMITED", "INFINITE") else None
        except ConfigError:
            seconds = None
        q.max_duration = _min(q.max_duration, seconds, lim.max_duration)
        lim.per_queue[name] = q
    lim.queues = queues
    return default


class SlurmBackend(HPCBackend):
    kind = "slurm"
    description = "Slurm through sbatch/squeue/scancel, locally or over SSH"
    direct_schemes = ("http", "https")
    config_schema = {
        "type": "object",
        "properties": {
            "type": {"const": "slurm"},
            "host": {"type": "string", "description": "login node (absent: this machine)"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "user": {"type": "string"},
            "known_hosts": {"type": "string"},
            "check_host_key": {"type": "boolean"},
            "workdir": {"type": "string", "description": "folder of the jobs' folders"},
            "partition": {"type": "string"},
            "account": {"type": "string"},
            "qos": {"type": "string"},
            "sbatch_options": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "environment of the Slurm commands, e.g. SLURM_CONF"},
            "shared_filesystem": {"type": "boolean",
                                  "description": "local paths of the session are visible"
                                                 " to the jobs (default: true without host)"},
            "environment": {"type": "object"},
            "limits": {"type": "object"},
            "connect_timeout": {"type": "number", "exclusiveMinimum": 0},
            "kernel_node_address": {"type": "string",
                                    "description": "how the login node names a kernel's "
                                                   "compute node for SSH: {node} (Slurm's "
                                                   "node name) or {addr} (its NodeAddr, "
                                                   "the default)"},
            "kernel_node_port": {"type": "integer", "minimum": 1, "maximum": 65535,
                                 "description": "SSH port of the compute nodes (default 22)"},
            "keepalive_interval": {"type": "number", "minimum": 0,
                                   "description": "seconds of silence before an SSH "
                                                  "keepalive request (0: none; default 15)"},
            "keepalive_count_max": {"type": "integer", "minimum": 1,
                                    "description": "unanswered keepalives before the SSH "
                                                   "connection is closed (default 3)"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        self.remote = bool(self.config.get("host"))
        self.shares_local_filesystem = bool(self.config.get("shared_filesystem",
                                                            not self.remote))
        self._login = SlurmLogin(self.config, lambda key: self.context.secret(key))
        self._workdir: str | None = None
        self._limits: tuple[float, Limits] | None = None

    # the login node --------------------------------------------------------------------------
    @property
    def shell(self):
        return self._login.shell

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            wd = self.config.get("workdir") or "~/cloudtik-jobs"
            if wd.startswith("~"):
                wd = self.shell.home() + wd[1:]
            self._workdir = wd.rstrip("/")
        return self._workdir

    def builds_environment(self) -> bool:
        """Over SSH the jobs run as another account, maybe on another machine."""
        return self.remote or not self.shares_local_filesystem

    def environment_root(self) -> str:
        # deferred: start-up (hpc.environment ~13 ms, loads importlib.metadata)
        from .environment import ENVS_DIR

        return f"{self.workdir}/{ENVS_DIR}"

    def environment_shell(self):
        return self.shell

    def folder(self, job_id: str) -> str:
        if "/" in job_id or job_id in ("", ".", ".."):
            raise ConfigError(f"job: {job_id!r} is not a job id", field="job")
        return f"{self.workdir}/{job_id}"

    def _slurm(self, argv: list[str], what: str, timeout: float = 60.0,
               input: bytes | None = None, cwd: str | None = None) -> Result:
        return self._login.slurm(argv, what, timeout=timeout, input=input, cwd=cwd)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["where"] = self.config.get("host") or "this machine"
        return d

    # limits ----------------------------------------------------------------------------------
    def limits(self) -> Limits:
        now = time.monotonic()
        if self._limits and now - self._limits[0] < LIMITS_TTL:
            return self._limits[1]
        lim = super().limits()
        parts = self._slurm(["scontrol", "show", "partition", "-o"], "scontrol")
        nodes = self._slurm(["scontrol", "show", "node", "-o"], "scontrol")
        if parts.rc != 0:
            raise ProviderError(f"scontrol show partition failed: {parts.message}")
        default = limits_from_scontrol(lim, parts.stdout, nodes.stdout)
        lim.default_queue = self.config.get("partition") or default
        self._limits = (now, lim)
        return lim

    # submitting ------------------------------------------------------------------------------
    def directives(self, sub: Submission, folder: str) -> list[str]:
        spec, r, a = sub.spec, sub.spec.resources, sub.spec.attributes
        d = [f"--job-name={_safe(sub.name)}", f"--comment=cloudtik:{sub.token}",
             f"--chdir={folder}", f"--output={folder}/{script.LOG_NAME}",
             f"--nodes={r.node_count}", f"--ntasks-per-node={r.processes_per_node}"]
        if r.cpu_cores_per_process:
            d.append(f"--cpus-per-task={r.cpu_cores_per_process}")
        if r.memory:
            d.append(f"--mem={math.ceil(r.memory / (1024 * 1024))}M")
        if r.gpus_per_node:
            d.append(f"--gpus-per-node={r.gpus_per_node}")
        if a.duration:
            d.append(f"--time={slurm_time(a.duration)}")
        partition = a.queue_name or self.config.get("partition")
        if partition:
            d.append(f"--partition={partition}")
        account = a.account or self.config.get("account")
        if account:
            d.append(f"--account={account}")
        if self.config.get("qos"):
            d.append(f"--qos={self.config['qos']}")
        if a.reservation_id:
            d.append(f"--reservation={a.reservation_id}")
        d += list(self.config.get("sbatch_options") or [])
        for k, v in sorted(a.custom_attributes.items()):
            if k.startswith("slurm."):
                d.append(f"--{k[len('slurm.'):]}={v}")
        del spec
        return [f"#SBATCH {x}" for x in d]

    def render(self, sub: Submission) -> str:
        folder = self.folder(sub.job_id)
        return script.render(sub, directives=self.directives(sub, folder), job_dir=folder)

    def submit(self, sub: Submission) -> str:
        folder = self.folder(sub.job_id)
        sh = self.shell
        try:  # submitted before (the manager asks find() first on a retry; this is cheap)
            done = sh.read_bytes(f"{folder}/{script.MARKER_DIR}/submitted").decode().strip()
            if done.isdigit():
                return done
        except NotFoundError:
            pass
        self._prepare(sub)
        r = self._slurm(["sbatch", "--parsable", f"{folder}/{script.SCRIPT_NAME}"], "sbatch",
                        cwd=folder)
        if r.rc != 0:
            raise ProviderError(f"sbatch refused the job: {r.message}")
        native = r.stdout.strip().split(";", 1)[0]
        if not native.isdigit():
            raise ProviderError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
        sh.write_bytes(f"{folder}/{script.MARKER_DIR}/submitted", f"{native}\n".encode())
        return native

    def submit_array(self, key: str, subs: list[Submission], limit: int | None) -> list[str]:
        """Submit several jobs (a sweep's elements) as one Slurm job array: one ``sbatch
        --array=0-N%LIMIT`` whose task ``i`` runs ``subs[i]``'s own script in its own
        folder, so every element keeps the folder, log and markers of a single job and is
        polled, cancelled and read like one (its native id is ``ARRAY_i``).  ``key``
        names the array's folder; submitting the same key again answers the ids of the
        first submission (never a second array)."""
        folder = self.folder(key)
        sh = self.shell
        marker = f"{folder}/{script.MARKER_DIR}/submitted"
        try:
            done = sh.read_bytes(marker).decode().strip()
            if done.isdigit():
                return [f"{done}_{i}" for i in range(len(subs))]
        except NotFoundError:
            pass
        sh.mkdir(f"{folder}/{script.MARKER_DIR}")
        for sub in subs:
            self._prepare(sub)
        own = ("--job-name=", "--comment=", "--chdir=", "--output=")
        directives = [d for d in self.directives(subs[0], folder)
                      if not d[len("#SBATCH "):].startswith(own)]
        name = _safe(subs[0].name.rsplit("[", 1)[0])
        array = f"0-{len(subs) - 1}" + (f"%{limit}" if limit else "")
        directives = [f"#SBATCH --job-name={name}", f"#SBATCH --comment=cloudtik:{key}",
                      f"#SBATCH --chdir={folder}", f"#SBATCH --output={folder}/%a.out",
                      f"#SBATCH --array={array}", *directives]
        dirs = " ".join(shell_quote(self.folder(s.job_id)) for s in subs)
        text = "\n".join([
            "#!/bin/bash", *directives,
            f"# jupyter_cloudtik job array {key}: task i runs element i's own job.sh",
            f"CT_DIRS=({dirs})",
            'CT_DIR="${CT_DIRS[$SLURM_ARRAY_TASK_ID]}"',
            'cd "$CT_DIR" || exit 90',
            f"exec bash {script.SCRIPT_NAME} >> {script.LOG_NAME} 2>&1", ""])
        sh.write_bytes(f"{folder}/array.sh", text.encode(), 0o755)
        r = self._slurm(["sbatch", "--parsable", f"{folder}/array.sh"], "sbatch", cwd=folder)
        if r.rc != 0:
            raise ProviderError(f"sbatch refused the job array: {r.message}")
        native = r.stdout.strip().split(";", 1)[0]
        if not native.isdigit():
            raise ProviderError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
        sh.write_bytes(marker, f"{native}\n".encode())
        return [f"{native}_{i}" for i in range(len(subs))]

    def cancel_array(self, jobs: list[JobRef]) -> None:
        """Cancel whole arrays at once: one ``scancel`` for every array the jobs belong to."""
        arrays = sorted({j.native_id.split("_", 1)[0] for j in jobs})
        if arrays:
            self.cancel(JobRef("", " ".join(arrays)))
            for job in jobs:
                self._mark_cancelled(job)

    def _mark_cancelled(self, job: JobRef) -> None:
        """A pending array task that is cancelled vanishes from squeue, sacct and scontrol
        alike: this marker in its folder tells the poll that it was cancelled, not lost."""
        if job.id:
            try:
                self.shell.write_bytes(
                    f"{self.folder(job.id)}/{script.MARKER_DIR}/{CANCEL_MARKER}", b"1\n")
            except Exception:  # the folder is gone: nothing left to tell
                pass

    def _prepare(self, sub: Submission) -> None:
        """The job's folder on the login node: its files, inputs, parameters and script."""
        folder = self.folder(sub.job_id)
        sh = self.shell
        self.stage_environment(sub)  # a built environment's wheels and build script
        sh.mkdir(f"{folder}/{script.MARKER_DIR}")
        for name, local in sub.files.items():
            sh.put(Path(local), f"{folder}/{name}")
        for item in sub.inputs:
            if item.mode == "upload":
                sh.put(Path(item.source), f"{folder}/{item.name}")
        sh.write_bytes(f"{folder}/{script.PARAMETERS_NAME}", script.parameters_json(sub).encode())
        sh.write_bytes(f"{folder}/{script.MARKER_DIR}/{INPUTS_LIST}",
                       ("\n".join(input_names(sub)) + "\n").encode())
        sh.write_bytes(f"{folder}/{script.SCRIPT_NAME}", self.render(sub).encode(), 0o755)

    def find(self, token: str, job_id: str) -> str | None:
        r = self._slurm(["squeue", "--me", "--states=all", "-h", "-o", "%i|%k"], "squeue")
        if r.rc == 0:
            for line in r.stdout.splitlines():
                jid, _, comment = line.partition("|")
                if comment.strip() == f"cloudtik:{token}":
                    return jid.strip()
        # forgotten by squeue: accounting keeps the comment (AccountingStoreFlags=job_comment)
        r = self._slurm(["sacct", "-X", "-n", "-P", "--starttime=now-7days", "-o",
                         "JobID,Comment"], "sacct")
        if r.rc == 0:
            for line in r.stdout.splitlines():
                jid, _, comment = line.partition("|")
                if comment.strip() == f"cloudtik:{token}" and jid.strip().isdigit():
                    return jid.strip()
        folder = self.folder(job_id)
        for marker in ("submitted", "native_id"):
            try:
                text = self.shell.read_bytes(f"{folder}/{script.MARKER_DIR}/{marker}").decode()
            except NotFoundError:
                continue
            if text.strip().isdigit():
                return text.strip()
        return None

    # watching --------------------------------------------------------------------------------
    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        # -r: one line per array task (a sweep's elements), not "123_[4-99%10]"
        r = self._slurm(["squeue", "--me", "--states=all", "-r", "-h", "-o", "%i|%T|%r"],
                        "squeue")
        if r.rc != 0:
            raise BackendUnavailable(f"squeue failed: {r.message}")
        seen = parse_squeue_states(r.stdout)
        out = {}
        gone = [j for j in jobs if j.native_id not in seen]
        accounted = self._accounting([j.native_id for j in gone]) if gone else {}
        for job in jobs:
            if job.native_id in seen:
                native, why = seen[job.native_id]
                out[job.native_id] = self._status(job, native, why)
            elif job.native_id in accounted:
                native, why, code = accounted[job.native_id]
                out[job.native_id] = self._status(job, native, why, code)
            else:
                out[job.native_id] = self._forgotten(job)
        return out

    def _accounting(self, native_ids: list[str]) -> dict[str, tuple[str, str, int | None]]:
        """What ``sacct`` knows of jobs squeue forgot: id -> (state, reason, exit code).

        Empty when the site has no accounting (sacct then fails: "Slurm accounting
        storage is disabled") — the caller falls back to scontrol and the markers."""
        r = self._slurm(["sacct", "-X", "-n", "-P", "-j", ",".join(native_ids), "-o",
                         "JobID,State,Reason,ExitCode"], "sacct")
        if r.rc != 0:
            return {}
        return parse_sacct_states(r.stdout, native_ids)

    def _status(self, job: JobRef, native: str, why: str,
                exit_code: int | None = None) -> JobStatus:
        state = common_state(native)
        native = first_word(native)  # "CANCELLED by 0" (sacct)
        message = None
        if why and why not in ("None", "(null)"):
            message = why
        if state == FAILED:
            message = FAILURE_TEXT.get(native, message or native.lower())
        st = JobStatus(state, native, message)
        if st.final:
            code = self._marker(job, "exitcode")
            if code is not None and code.lstrip("-").isdigit():
                st.exit_code = int(code)
            elif exit_code is not None:
                st.exit_code = exit_code
            if state == SUCCEEDED and st.exit_code:
                st.state, st.message = FAILED, f"exit code {st.exit_code}"
        return st

    def _forgotten(self, job: JobRef) -> JobStatus:
        """Slurm no longer lists the job: ask scontrol, then the job's own markers."""
        r = self._slurm(["scontrol", "show", "job", "-o", job.native_id], "scontrol")
        if r.rc == 0 and "JobState=" in r.stdout:
            info = parse_kv(r.stdout)
            return self._status(job, info.get("JobState", ""), info.get("Reason", ""))
        code = self._marker(job, "exitcode")
        if code is not None and code.lstrip("-").isdigit():
            rc = int(code)
            if rc == 0:
                return JobStatus(SUCCEEDED, "COMPLETED", exit_code=0)
            return JobStatus(FAILED, "FAILED", f"exit code {rc}", exit_code=rc)
        if self._marker(job, CANCEL_MARKER) is not None:
            return JobStatus(CANCELLED, "CANCELLED", "cancelled before it started")
        return JobStatus(FAILED, "UNKNOWN", "Slurm no longer knows the job and it left no "
                                            "exit code (cancelled or killed before it ended?)")

    def _marker(self, job: JobRef, name: str) -> str | None:
        try:
            return self.shell.read_bytes(
                f"{self.folder(job.id)}/{script.MARKER_DIR}/{name}").decode().strip()
        except NotFoundError:
            return None

    def cancel(self, job: JobRef) -> None:
        r = self._slurm(["scancel", *job.native_id.split()], "scancel")
        if r.rc != 0 and "Invalid job id" not in r.stderr and \
                "already completing or completed" not in r.stderr:
            raise ProviderError(f"scancel failed: {r.message}")
        if "_" in job.native_id:
            self._mark_cancelled(job)

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        path = f"{self.folder(job.id)}/{script.LOG_NAME}"
        try:
            data = self.shell.read_bytes(path, offset, limit)
        except NotFoundError:
            return LogChunk("", offset, eof=True)
        text = data.decode("utf-8", errors="replace")
        return LogChunk(text, offset + len(data), eof=len(data) < limit)

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        folder = self.folder(job.id)
        skip = set(script.SCAFFOLDING) | {script.LOG_NAME}
        try:
            listed = self.shell.read_bytes(f"{folder}/{script.MARKER_DIR}/{INPUTS_LIST}")
            skip |= set(listed.decode().splitlines())
        except NotFoundError:
            pass
        out = []
        for rel, size in self.shell.walk(folder):
            top = rel.split("/", 1)[0]
            if top in skip or rel in skip:
                continue
            out.append(OutputFile(rel, size))
        return out

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        return self.shell.read_bytes(remote_inside(self.folder(job.id), name), 0, limit)

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        out = []
        for name in names:
            target = dest / name
            self.shell.get(remote_inside(self.folder(job.id), name), target)
            out.append(target)
        return out

    def clean(self, job: JobRef) -> None:
        self.shell.run(["rm", "-rf", "--", self.folder(job.id)])

    def close(self) -> None:
        self._login.close()


def slurm_backend_config(context: Any, backend: str | None,
                         config: dict[str, Any]) -> dict[str, Any]:
    """The login node's config for a Slurm node provider: the configured HPC backend
    ``backend`` (of type slurm) with ``config["env"]`` laid over its own, or without
    ``backend`` the provider's inline fields in ``config``."""
    # deferred: start-up (hpc.settings ~25 ms, loads importlib.metadata, traitlets)
    from .settings import hpc_settings

    if not backend:
        return dict(config)
    configs = hpc_settings(parent=context.settings).backend_configs()
    cfg = configs.get(backend)
    if cfg is None or cfg.get("type") != "slurm":
        slurms = sorted(n for n, c in configs.items() if c.get("type") == "slurm")
        raise ConfigError(
            f"provider.backend: '{backend}' is not a configured HPC backend of type "
            f"slurm (slurm backends: {', '.join(slurms) or 'none'})",
            field="provider.backend", value=backend)
    return {**cfg, "env": {**(cfg.get("env") or {}), **(config.get("env") or {})}}


def slurm_login(context: Any, backend: str | None, config: dict[str, Any]) -> SlurmLogin:
    """The ``slurm_login`` service (hpc's ``Feature``): the login node of a Slurm node
    provider, whose ``context`` has the state folder, store, log and settings.  With
    ``backend`` it is that configured HPC backend of type slurm (host, user, env...) with
    ``config["env"]`` laid over the backend's; without, ``config`` holds the provider's
    inline fields.  Either way the SSH key is a backend credential, of scope
    ``hpc:<backend>`` (``hpc:slurm`` inline), revealed under hpc's grant."""
    # deferred: start-up (core.secrets ~24 ms, loads traitlets, cryptography)
    from ..core.secrets import SecretStore

    name = backend or "slurm"
    cfg = slurm_backend_config(context, backend, config)
    ctx = BackendContext(state_dir=context.state_dir, secrets=SecretStore(context.store),
                         log=context.log, settings=context.settings, name=name)
    return SlurmLogin(cfg, ctx.secret)


def _min(*values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "job"


__all__ = ["SlurmBackend"]
