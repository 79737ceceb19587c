"""The ``slurm`` provider: a cluster's Dask workers (and, if asked, its scheduler) are Slurm
jobs, submitted on this machine or on a login node over SSH.

What is true and where it comes from:

* **A node is a Slurm job.**  The node id is the Slurm job id; the Dask worker inside is
  named after it (``--name $SLURM_JOB_ID``), so the manager matches connected workers to
  jobs.  The tags of our model (cluster, node kind and type, launch hash, and a namespace
  of the state folder) travel in the job's ``--comment`` and are read back with
  ``squeue``: which nodes exist is always what Slurm says, never a list we keep.  A job
  that ended (walltime, preemption, ``scancel``) is simply not listed any more, so ``up``
  replaces it; ``sacct`` tells why it ended.
* **Where the scheduler runs** (``scheduler:``): ``login`` (the default when Slurm is on
  this machine) runs it as a detached process on the login node, like dask-jobqueue does,
  through the ``local`` provider (so it outlives the kernel and starts in milliseconds);
  ``job`` (the default over SSH) submits it as one more Slurm job that writes a scheduler
  file next to the job logs.
* **Workers queue with the head.**  A worker job gets the head's node id, not the
  scheduler's address, and reads it from the head's scheduler file in the job folder
  (``--scheduler-file``; a login-node scheduler's is written here once it answers), so
  ``up`` submits the worker jobs right after the head and Slurm schedules them while the
  scheduler starts; if the head fails, the manager cancels them.
* **Job scripts** are dask-jobqueue's (``SLURMJob``): the option names (``cores``,
  ``memory``, ``processes``, ``walltime``, ``job_extra_directives``,
  ``job_script_prologue``, ``interface``...) mean what they mean there.
* **Transport** is the HPC backends' own (``hpc.slurm.SlurmBackend`` and its
  ``LocalShell``/``SSHShell``): ``backend:`` names a configured HPC backend of type slurm
  (its host, user, key in the secret store, ``SLURM_CONF``...), or ``host:``/``user:``/
  ``port:`` give one inline (key: secret ``ssh_key`` of scope ``hpc:slurm``).
* **Before anything is queued** the request is checked against Slurm: ``sinfo`` for the
  partition, its time limit and its idle cores (the placement offer), ``sacctmgr`` for
  accounts and QOS when accounting runs, and ``sbatch --test-only`` with the real job
  script, whose refusal is quoted.  Every refusal names the provider field.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import sys
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import ConfigError, NodeLaunchError, NotFoundError, ProviderError
from ..core.units import format_bytes, parse_bytes
from .base import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UNINITIALIZED,
    STATUS_UP_TO_DATE,
    TAG_CLUSTER_NAME,
    TAG_LAUNCH_CONFIG,
    TAG_NODE_KIND,
    TAG_NODE_STATUS,
    TAG_NODE_TYPE,
    Capacity,
    ConnectInfo,
    NodeProvider,
    ProviderContext,
)

if TYPE_CHECKING:
    from ..hpc.shell import Result
    from ..hpc.slurm import SlurmBackend
    from ..placement.model import OfferSet

COMMENT_PREFIX = "cloudtik/v1?"
# (login node, state namespace, cluster, "host:port") -> hpc.shell.Tunnel of this process
_TUNNELS: dict[tuple[str, str, str, str], Any] = {}
_TUNNELS_LOCK = threading.Lock()
# squeue lists a job in these states; all but COMPLETING are a node that is (or will be) there
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}
SQUEUE_FORMAT = "%i|%T|%N|%M|%l|%r|%k"
CACHE_SECONDS = 0.3
FACTS_SECONDS = 1.0  # sinfo / scontrol show node answers reused within one operation step
# The job's shell stays the batch step's main process and ends Dask itself on scancel or
# at the time limit: SIGTERM, then SIGKILL after 1.5 s.  Seen here: a scheduler that had
# clients did not end on Slurm's signals (job stuck COMPLETING, "STEPD TERMINATED ... DUE
# TO JOB NOT ENDING WITH SIGNALS"), and with a plain command the shell died first and
# left Dask orphaned and running (proctrack/linuxproc finds processes by parent).
KILL_WRAPPER = """{command} &
dask_pid=$!
trap 'kill -TERM $dask_pid 2>/dev/null; for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do \
kill -0 $dask_pid 2>/dev/null || exit 143; sleep 0.1; done; kill -KILL $dask_pid; exit 143' \
TERM INT
wait $dask_pid"""
# the same with the dashboard's mutual-TLS relay (runtime/dashboard_relay.py) beside a TLS
# scheduler: it watches the scheduler, and the job's end takes it along
RELAY_WRAPPER = """{command} &
dask_pid=$!
{relay} &
relay_pid=$!
trap 'kill -TERM $dask_pid $relay_pid 2>/dev/null; for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 \
15; do kill -0 $dask_pid 2>/dev/null || exit 143; sleep 0.1; done; kill -KILL $dask_pid \
$relay_pid; exit 143' TERM INT
wait $dask_pid
rc=$?
kill -TERM $relay_pid 2>/dev/null
exit $rc"""
#: appended to the shared relay's source on the login node: a scheduler job runs it with
#: its TLS folder, Dask's scheduler file, the file to publish and the scheduler's pid.  It
#: binds the scheduler's own address (a free port), and only then publishes Dask's
#: scheduler file with the relay's address added, so whoever reads it finds both at once
RELAY_MAIN = r'''
if __name__ == "__main__":
    import json, sys, time
    tls_dir, dask_file, out_file, pid = sys.argv[1:5]
    while True:
        if not _alive(int(pid)):
            sys.exit(0)
        try:
            with open(dask_file) as f:
                data = json.load(f)
            break
        except (OSError, ValueError):
            time.sleep(0.05)
    host = data["address"].split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    where = f"[{host}]" if ":" in host else host  # as Dask writes an IPv6 address
    done = []

    def publish(extra):
        tmp = out_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**data, "cloudtik": extra}, f)
        os.replace(tmp, out_file)
        done.append(True)

    dash = (data.get("services") or {}).get("dashboard")
    if not dash:
        publish({"dashboard_relay_error": "the scheduler serves no dashboard"})
        sys.exit(0)
    try:
        dashboard_relay(host, 0, dash, tls_dir, pid, cert="node.pem", key="node-key.pem",
                        ready=lambda port: publish({"dashboard_relay": f"{where}:{port}"}))
    except Exception as e:
        if not done:  # the cluster works without its dashboard; the reason is recorded
            publish({"dashboard_relay_error": f"{type(e).__name__}: {e}"})
        raise
'''
HTTP_ROUTES = ["distributed.http.scheduler.prometheus", "distributed.http.scheduler.info",
               "distributed.http.scheduler.json", "distributed.http.scheduler.api",
               "distributed.http.health", "distributed.http.proxy",
               "distributed.http.statics"]
# which provider field a refusal of ``sbatch --test-only`` is about (Slurm's own words)
REFUSAL_FIELDS = (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                  ("time limit", "walltime"), ("node configuration", "cores"),
                  ("memory", "memory"), ("gres", "gpus"))


def _shell_arg(arg: str) -> str:
    """``arg`` quoted for the job's shell, with ``$SLURM_JOB_ID`` left to expand."""
    return '"$SLURM_JOB_ID"'.join(shlex.quote(p) if p else "" for p in
                                  arg.split("$SLURM_JOB_ID"))


def _ns(state_dir: Any) -> str:
    return hashlib.sha1(str(state_dir).encode()).hexdigest()[:8]


def encode_comment(ns: str, tags: dict[str, str]) -> str:
    short = {"ns": ns, "cluster": tags.get(TAG_CLUSTER_NAME, ""),
             "kind": tags.get(TAG_NODE_KIND, ""), "type": tags.get(TAG_NODE_TYPE, ""),
             "launch": tags.get(TAG_LAUNCH_CONFIG, "")}
    return COMMENT_PREFIX + urllib.parse.urlencode(short)


def decode_comment(comment: str) -> dict[str, str] | None:
    comment = comment.strip()
    if not comment.startswith(COMMENT_PREFIX):
        return None
    q = dict(urllib.parse.parse_qsl(comment[len(COMMENT_PREFIX):], keep_blank_values=True))
    return {"ns": q.get("ns", ""), TAG_CLUSTER_NAME: q.get("cluster", ""),
            TAG_NODE_KIND: q.get("kind", ""), TAG_NODE_TYPE: q.get("type", ""),
            TAG_LAUNCH_CONFIG: q.get("launch", "")}


def parse_squeue_jobs(stdout: str, ns: str, cluster_name: str) -> dict[str, dict[str, Any]]:
    """``squeue -h -o SQUEUE_FORMAT`` lines of the jobs of cluster ``cluster_name`` in
    namespace ``ns`` (their comment says so): job id -> state, node, elapsed, limit, reason,
    tags."""
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|", 6)
        if len(parts) < 7:
            continue
        tags = decode_comment(parts[6])
        if not tags or tags["ns"] != ns or tags[TAG_CLUSTER_NAME] != cluster_name:
            continue
        out[parts[0]] = {"state": parts[1], "node": parts[2], "elapsed": parts[3],
                         "time_limit": parts[4], "reason": parts[5], "tags": tags}
    return out


def parse_sacct_job(stdout: str, job_id: str) -> dict[str, str]:
    """``sacct -X -n -P -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList`` of one job."""
    for line in stdout.splitlines():
        f = line.split("|")
        if len(f) >= 6 and f[0] == job_id:
            return {"state": f[1], "exit_code": f[2], "elapsed": f[3],
                    "time_limit": f[4], "node": f[5]}
    return {}


def parse_sinfo(stdout: str) -> list[dict[str, Any]]:
    """``sinfo -h -o %P|%a|%l|%D|%C|%N|%m`` lines: one row per partition."""
    rows = []
    for line in stdout.splitlines():
        f = line.strip().split("|")
        if len(f) >= 7:
            rows.append({"name": f[0].rstrip("*"), "default": f[0].endswith("*"),
                         "avail": f[1], "time_limit": f[2], "nodes": f[3],
                         "cpus": f[4], "nodelist": f[5], "memory": f[6]})
    return rows


def sinfo_cpus(text: str) -> tuple[int, int, int, int] | None:
    """sinfo's ``%C``: allocated/idle/other/total CPUs, or None for another shape."""
    from ..hpc.slurm import slurm_int

    counts = [slurm_int(x) for x in text.split("/")]
    if len(counts) != 4 or None in counts:
        return None
    return counts[0], counts[1], counts[2], counts[3]  # type: ignore[return-value]


def free_memory(nodes: list[dict[str, str]]) -> int:
    """Bytes not allocated on the idle or partly used nodes of ``scontrol show node -o``."""
    from ..hpc.slurm import slurm_int

    free = 0
    for n in nodes:
        real = slurm_int(n.get("RealMemory"))
        if real is not None and n.get("State", "").split("+")[0] in ("IDLE", "MIXED"):
            free += max(real - (slurm_int(n.get("AllocMem")) or 0), 0) * 2**20
    return free


def memory_per_core(nodes: list[dict[str, str]]) -> int | None:
    """The smallest memory per core of ``scontrol show node -o`` rows (None: none says)."""
    from ..hpc.slurm import slurm_int

    shares = [mem * 2**20 // max(slurm_int(n.get("CPUTot")) or 1, 1)
              for n in nodes if (mem := slurm_int(n.get("RealMemory"))) is not None]
    return min(shares) if shares else None


_IMPORT_LOCK = threading.Lock()


def _try(fn):
    try:
        return fn()
    except Exception as e:  # handed back to the caller, which cancels what was made
        return e


def _slurm_job_class():
    """dask-jobqueue's ``SLURMJob``, imported without its side effect.

    Importing the ``dask_jobqueue`` package (0.9) runs ``dask_jobqueue/runner.py``, which
    sets a process-wide SIGINT handler at import time: in a kernel's main thread that
    would take Ctrl-C / "interrupt kernel" away from the user, and off the main thread (our
    provider calls run in worker threads) it raises ``ValueError``.  Only the job script
    template is used here, so the import runs with ``signal.signal`` held off.
    """
    import signal

    mod = sys.modules.get("dask_jobqueue.slurm")
    if mod is None:
        with _IMPORT_LOCK:
            real = signal.signal
            signal.signal = lambda *_a, **_k: None  # type: ignore[assignment]
            try:
                import dask_jobqueue.slurm as mod
            finally:
                signal.signal = real
    return mod.SLURMJob


class SlurmNodeProvider(NodeProvider):
    provider_type = "slurm"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "title": "Slurm",
        "description": "Dask workers (and optionally the scheduler) as Slurm jobs, on this "
                       "machine's Slurm or on a login node over SSH.",
        "additionalProperties": False,
        "properties": {
            "type": {"const": "slurm"},
            "partition": {"type": "string", "title": "Partition",
                          "description": "Slurm partition (default: the default partition)."},
            "account": {"type": "string", "title": "Account"},
            "qos": {"type": "string", "title": "QOS"},
            "walltime": {"type": "string", "title": "Walltime",
                         "description": "Time limit of each job, e.g. 01:00:00 (default: "
                                        "the partition's)."},
            "cores": {"type": "integer", "minimum": 1, "title": "Cores per worker job"},
            "memory": {"type": "string", "title": "Memory per worker job",
                       "description": "e.g. 4GiB (default: the cores' share of a "
                                      "node's memory)."},
            "processes": {"type": "integer", "minimum": 1, "title": "Dask processes per job"},
            "gpus": {"type": "integer", "minimum": 0, "title": "GPUs per worker job"},
            "job_script_prologue": {"type": "array", "items": {"type": "string"},
                                    "title": "Job script prologue",
                                    "description": "Lines run before Dask starts, e.g. "
                                                   "module load or a venv activation."},
            "job_extra_directives": {"type": "array", "items": {"type": "string"},
                                     "title": "Extra #SBATCH options"},
            "scheduler": {"enum": ["job", "login"], "title": "Scheduler runs",
                          "description": "as a Slurm job, or on the login node (default: "
                                         "login on this machine, job over SSH)."},
            "scheduler_host": {"type": "string",
                               "description": "Address a login-node scheduler binds to "
                                              "(default: 127.0.0.1 when every node is "
                                              "localhost, else 0.0.0.0)."},
            "interface": {"type": "string",
                          "description": "Network interface of the Dask processes in jobs "
                                         "(dask-jobqueue's option; default lo when every "
                                         "node is localhost)."},
            "python": {"type": "string",
                       "description": "Python on the compute nodes (default: this one "
                                      "locally, python3 over SSH)."},
            "local_directory": {"type": "string"},
            "workdir": {"type": "string",
                        "description": "Folder of the job logs and scheduler files on the "
                                       "login node (default ~/cloudtik-slurm)."},
            "backend": {"type": "string",
                        "description": "A configured HPC backend of type slurm whose login "
                                       "node (host, user, key, env) to use."},
            "host": {"type": "string", "description": "SSH login node (absent: this "
                                                      "machine)."},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "user": {"type": "string"},
            "known_hosts": {"type": "string"},
            "check_host_key": {"type": "boolean"},
            "connect_timeout": {"type": "number", "exclusiveMinimum": 0},
            "keepalive_interval": {"type": "number", "minimum": 0,
                                   "description": "Seconds of silence before an SSH "
                                                  "keepalive request (0: none; default "
                                                  "15)."},
            "keepalive_count_max": {"type": "integer", "minimum": 1,
                                    "description": "Unanswered SSH keepalives before the "
                                                   "connection is closed (default 3)."},
            "env": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "Environment of the Slurm commands, e.g. SLURM_CONF."},
            "tls": {"type": "boolean", "title": "Mutual TLS",
                    "description": "Client, scheduler and workers speak tls:// with the "
                                   "cluster's own certificates (default: on unless the "
                                   "login node and every node are this machine's "
                                   "loopback)."},
            "tunnel": {"type": "boolean",
                       "description": "Over SSH with scheduler: job, reach the scheduler "
                                      "through a forwarded port of the SSH connection "
                                      "(default true; false when this machine reaches "
                                      "the compute nodes directly)."},
        },
    }
    #: storages reach the workers over the cluster's Dask connection once they are up
    #: (storage/cluster.py attach_to_workers): nothing private goes into a job script
    delivers_secrets_at_runtime: ClassVar[bool] = True
    #: worker jobs read the head's scheduler file (``_scheduler_file``), so ``up`` queues
    #: them right after the head, and Slurm schedules them while the scheduler starts
    workers_find_scheduler: ClassVar[bool] = True

    def __init__(self, provider_config: dict[str, Any], cluster_name: str,
                 context: ProviderContext) -> None:
        super().__init__(provider_config, cluster_name, context)
        p = provider_config
        self.remote = bool(p.get("host")) or bool(p.get("backend"))
        self.mode = p.get("scheduler") or ("job" if self.remote else "login")
        if self.mode == "login" and self.remote:
            raise ConfigError("provider.scheduler: 'login' needs Slurm on this machine; over "
                              "SSH the scheduler runs as a job (scheduler: job)",
                              field="provider.scheduler", value="login")
        self.ns = _ns(context.state_dir)
        self._backend: SlurmBackend | None = None
        self._local = None
        self._cache: tuple[float, dict[str, dict[str, str]]] | None = None
        self._lock = threading.Lock()
        self._checked = False
        self._checking = False
        self._sinfo: list[dict[str, str]] | None = None
        self._sinfo_at = 0.0
        self._nodes: tuple[float, list[dict[str, str]]] | None = None
        self._workdir: str | None = None
        self._tls: bool | None = None
        self._staged = False

    # defaults ---------------------------------------------------------------------------
    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        remote = bool(provider_config.get("host") or provider_config.get("backend"))
        mode = provider_config.get("scheduler") or ("job" if remote else "login")
        return {
            "head": {"node_config": {}, "resources": {"CPU": 1 if mode == "job" else 0,
                                                       "memory": "1GiB" if mode == "job"
                                                       else 0, "GPU": 0}},
            "worker": {"node_config": {}, "resources": {}, "min_workers": 1,
                       "max_workers": 100},
        }

    @classmethod
    def fill_resources(cls, provider_config: dict[str, Any],
                       node_type: dict[str, Any]) -> dict[str, Any]:
        res = dict(node_type.get("resources") or {})
        res.setdefault("CPU", int(provider_config.get("cores") or 1))
        # no memory given: 0 here, and each job asks its cores' share of a node's memory
        # (RealMemory / CPUs, as LocalCluster shares a machine) — see job_memory()
        res.setdefault("memory", provider_config.get("memory") or 0)
        res.setdefault("GPU", int(provider_config.get("gpus") or 0))
        return res

    # transport: the HPC backends' Slurm commands, here or over SSH -------------------------
    @property
    def backend(self) -> SlurmBackend:
        if self._backend is None:
            from ..core.secrets import SecretStore
            from ..hpc.base import BackendContext
            from ..hpc.settings import hpc_settings
            from ..hpc.slurm import SlurmBackend

            p = self.provider_config
            name = p.get("backend") or "slurm"
            if p.get("backend"):
                configs = hpc_settings(parent=self.context.settings).backend_configs()
                cfg = configs.get(name)
                if cfg is None or cfg.get("type") != "slurm":
                    slurms = sorted(n for n, c in configs.items() if c.get("type") == "slurm")
                    raise ConfigError(
                        f"provider.backend: '{name}' is not a configured HPC backend of type "
                        f"slurm (slurm backends: {', '.join(slurms) or 'none'})",
                        field="provider.backend", value=name)
                cfg = dict(cfg)
            else:
                cfg = {"type": "slurm"}
                for k in ("host", "port", "user", "known_hosts", "check_host_key",
                          "connect_timeout", "keepalive_interval", "keepalive_count_max"):
                    if k in p:
                        cfg[k] = p[k]
                if cfg.get("host") and not cfg.get("user"):
                    import getpass

                    cfg["user"] = getpass.getuser()  # as ssh does
            cfg["env"] = {**(cfg.get("env") or {}), **(p.get("env") or {})}
            ctx = BackendContext(state_dir=self.context.state_dir,
                                 secrets=SecretStore(self.context.store), log=self.context.log,
                                 settings=self.context.settings, name=name)
            self._backend = SlurmBackend(name, cfg, ctx)
        return self._backend

    @property
    def where(self) -> str:
        p = self.provider_config
        if p.get("backend"):
            return f"backend '{p['backend']}'"
        return p.get("host") or "this machine"

    def _host_field(self) -> str:
        return "provider.backend" if self.provider_config.get("backend") else "provider.host"

    def _run(self, argv: list[str], what: str, input: bytes | None = None,
             timeout: float = 60.0) -> Result:
        from ..hpc.base import BackendUnavailable

        try:
            return self.backend._slurm(argv, what, timeout=timeout, input=input)
        except BackendUnavailable as e:
            if self._checking:  # the up-front check: the field is wrong, not the weather
                raise ConfigError(f"{self._host_field()}: cannot reach Slurm on {self.where}: "
                                  f"{e.message}", field=self._host_field()) from None
            raise ProviderError(f"Slurm on {self.where} did not answer: {e.message}") from None
        except ProviderError as e:
            if self._checking:
                raise ConfigError(f"{self._host_field()}: {e.message}",
                                  field=self._host_field()) from None
            raise

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            wd = self.provider_config.get("workdir") or "~/cloudtik-slurm"
            if wd.startswith("~"):
                wd = self.backend.shell.home() + wd[1:]
            self._workdir = f"{wd.rstrip('/')}/{self.ns}-{self.cluster_name}"
        return self._workdir

    @property
    def python(self) -> str:
        return self.provider_config.get("python") or (
            "python3" if self.remote else sys.executable)

    # TLS: the cluster's certificates, staged as 0600 files next to the job logs ------------
    @property
    def tls(self) -> bool:
        """Do client, scheduler and workers speak mutual TLS (runtime/tls.py)?

        Off only when all of them are on this machine's loopback: Slurm here or on a
        loopback login node, every node of the partition ``localhost``, and the scheduler
        bound to loopback.  ``provider.tls`` decides otherwise."""
        if self._tls is None:
            want = self.provider_config.get("tls")
            if want is not None:
                self._tls = bool(want)
            else:
                from ..runtime.tls import is_loopback

                login = getattr(self.backend.shell, "host", None)
                self._tls = not (
                    (login is None or is_loopback(login)) and self._all_localhost()
                    and (is_loopback(self._scheduler_host()) if self.mode == "login"
                         else self._interface() == "lo"))
        return self._tls

    def _tls_dir(self) -> str:
        return f"{self.workdir}/tls"

    def _tls_files(self) -> dict[str, str]:
        d = self._tls_dir()
        return {"ca": f"{d}/ca.pem", "cert": f"{d}/node.pem", "key": f"{d}/node-key.pem"}

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return []
        f = self._tls_files()
        return ["--protocol", "tls", "--tls-ca-file", f["ca"], "--tls-cert", f["cert"],
                "--tls-key", f["key"]]

    def _stage_tls(self) -> None:
        """Put the node certificate and key where the jobs read them: 0600 files in a
        0700 folder under the job folder (the user's home, which the compute nodes
        share), written over the transport (SFTP when remote) before sbatch.  They are
        never in a job script, a command line or the jobs' environment; ``down`` removes
        them."""
        if not self.tls or self._staged:
            return
        from ..runtime.tls import ensure_cluster_tls

        tls = ensure_cluster_tls(self.context.state_dir, self.cluster_name)
        shell = self.backend.shell
        d = self._tls_dir()
        r = shell.run(["sh", "-c", 'umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1"',
                       "sh", d])
        if r.rc != 0:
            raise ProviderError(f"cannot make {d} on {self.where}: {r.message}")
        files = self._tls_files()
        for key, text in (("ca", tls.ca), ("cert", tls.node_cert), ("key", tls.node_key)):
            shell.write_bytes(files[key], text.encode(), mode=0o600)
        if self.mode == "job":  # the dashboard relay's code (no secret), beside the logs
            from ..runtime.dashboard_relay import relay_source

            shell.write_bytes(self._relay_file(), (relay_source() + RELAY_MAIN).encode(),
                              mode=0o600)
        self._staged = True

    def _relay_file(self) -> str:
        return f"{self.workdir}/dashboard_relay.py"

    # the SSH tunnel to a scheduler job --------------------------------------------------------
    def _tunnelled(self) -> bool:
        return self.remote and self.mode == "job" and \
            self.provider_config.get("tunnel", True) is not False

    def _tunnel(self, dest: str):
        """This process's forwarded port to ``dest`` (host:port as the login node sees it),
        made again when the SSH connection that carried it is gone."""
        host, port = dest.rsplit(":", 1)
        host = host.strip("[]")  # an IPv6 address as Dask writes it
        key = (self.where, self.ns, self.cluster_name, dest)
        with _TUNNELS_LOCK:
            t = _TUNNELS.get(key)
            if t is not None and t.alive():
                return t
            if t is not None:
                t.close()
                del _TUNNELS[key]
            from ..hpc.base import BackendUnavailable

            try:
                t = self.backend.shell.forward_local_port(host, int(port))
            except BackendUnavailable as e:
                raise ProviderError(f"cannot open the SSH tunnel to the scheduler ({dest}) "
                                    f"through {self.where}: {e.message}") from None
            _TUNNELS[key] = t
            return t

    def _close_tunnels(self) -> None:
        with _TUNNELS_LOCK:
            for key in [k for k in _TUNNELS if k[:3] == (self.where, self.ns,
                                                          self.cluster_name)]:
                _TUNNELS.pop(key).close()

    def _through_tunnels(self, info: ConnectInfo) -> ConnectInfo:
        """``info`` with the scheduler (and dashboard) addresses of this process's
        tunnels, per ``extra["tunnel"]``."""
        tun = (info.extra or {}).get("tunnel") or {}
        if not tun.get("to") or not self._tunnelled():
            return info
        scheme = info.scheduler_address.split("://", 1)[0]
        info.scheduler_address = f"{scheme}://127.0.0.1:{self._tunnel(tun['to']).port}"
        if tun.get("dashboard_to"):
            url = f"http://127.0.0.1:{self._tunnel(tun['dashboard_to']).port}"
            info.dashboard_link, info.http_address = f"{url}/status", url
        if tun.get("relay_to"):  # the dashboard's mutual-TLS relay beside the scheduler
            url = f"https://127.0.0.1:{self._tunnel(tun['relay_to']).port}"
            info.extra = {**info.extra, "dashboard_tls_address": url}
            info.dashboard_link = f"{url}/status"
        return info

    def client_connect_info(self, info: ConnectInfo) -> ConnectInfo:
        """A recorded connect info made usable here: a new process (a restarted kernel,
        the CLI) opens its own tunnel to the scheduler job."""
        return self._through_tunnels(info)

    # what Slurm says -----------------------------------------------------------------------
    def _jobs(self, fresh: bool = False) -> dict[str, dict[str, str]]:
        """This cluster's jobs squeue lists: job id -> state, node, elapsed, limit, tags."""
        with self._lock:
            now = time.monotonic()
            if not fresh and self._cache and now - self._cache[0] < CACHE_SECONDS:
                return self._cache[1]
            r = self._run(["squeue", "--me", "-h", "-o", SQUEUE_FORMAT], "squeue")
            if r.rc != 0:
                raise ProviderError(f"squeue on {self.where} failed: {r.message}")
            out = parse_squeue_jobs(r.stdout, self.ns, self.cluster_name)
            self._cache = (time.monotonic(), out)
            return out

    def _forget_cache(self) -> None:
        with self._lock:
            self._cache = None

    def _accounting(self, job_id: str) -> dict[str, str]:
        """What sacct keeps of a job squeue no longer lists (empty without accounting)."""
        r = self._run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o",
                       "JobID,State,ExitCode,Elapsed,Timelimit,NodeList"], "sacct")
        if r.rc != 0:
            return {}
        return parse_sacct_job(r.stdout, job_id)

    def local(self):
        """The login-node scheduler's provider (``scheduler: login``)."""
        if self._local is None:
            from .local import LocalNodeProvider

            local = LocalNodeProvider(
                {"type": "local", "host": self._scheduler_host(), "launch_method": "fork"},
                self.cluster_name, self.context)
            local.tls = self.tls  # same rule as the jobs; the same cluster certificates
            self._local = local
        return self._local

    def _is_local_node(self, node_id: str) -> bool:
        return not node_id.isdigit()

    # checks before anything is queued ---------------------------------------------------------
    def _partitions(self) -> list[dict[str, str]]:
        if self._sinfo is None:
            r = self._run(["sinfo", "-h", "-o", "%P|%a|%l|%D|%C|%N|%m"], "sinfo")
            if r.rc != 0:
                raise ConfigError(f"{self._host_field()}: sinfo on {self.where} failed: "
                                  f"{r.message}", field=self._host_field())
            rows = parse_sinfo(r.stdout)
            self._sinfo, self._sinfo_at = rows, time.monotonic()
        return self._sinfo

    def nodes(self) -> list[dict[str, str]]:
        """The partition's nodes as ``scontrol show node`` has them (CPUs, memory, in use)."""
        name = self.partition()["name"]
        return [n for n in self._all_nodes() if name in n.get("Partitions", "").split(",")]

    def _all_nodes(self) -> list[dict[str, str]]:
        from ..hpc.slurm import parse_kv

        if self._nodes and time.monotonic() - self._nodes[0] < FACTS_SECONDS:
            return self._nodes[1]
        r = self._run(["scontrol", "show", "node", "-o"], "scontrol")
        if r.rc != 0:
            raise ProviderError(f"scontrol show node on {self.where} failed: {r.message}")
        rows = [parse_kv(line) for line in r.stdout.splitlines() if line.strip()]
        self._nodes = (time.monotonic(), rows)
        return rows

    def job_memory(self, resources: dict[str, Any]) -> int:
        """Memory of one job: the node type's, or its cores' share of the smallest node."""
        mem = int(resources.get("memory") or 0)
        if mem:
            return mem
        per_core = memory_per_core(self.nodes())
        if per_core is None:
            per_core = parse_bytes("1GiB")
        return per_core * max(int(resources.get("CPU") or 1), 1)

    def partition(self) -> dict[str, str]:
        parts = self._partitions()
        want = self.provider_config.get("partition")
        names = ", ".join(p["name"] + ("*" if p["default"] else "") for p in parts)
        for p in parts:
            if (want and p["name"] == want) or (not want and p["default"]):
                return p
        if want:
            raise ConfigError(f"provider.partition: '{want}' is not a partition Slurm on "
                              f"{self.where} knows (sinfo: {names or 'no partitions'})",
                              field="provider.partition", value=want)
        raise ConfigError(f"provider.partition: Slurm on {self.where} has no default "
                          f"partition; name one (sinfo: {names})", field="provider.partition")

    def _all_localhost(self) -> bool:
        try:
            return self.partition()["nodelist"] in ("localhost", "localhost[]")
        except ConfigError:
            return False

    def _scheduler_host(self) -> str:
        host = self.provider_config.get("scheduler_host")
        if host:
            return host
        return "127.0.0.1" if self._all_localhost() else "0.0.0.0"

    def _interface(self) -> str | None:
        iface = self.provider_config.get("interface")
        if iface:
            return iface
        return "lo" if self._all_localhost() else None

    def check(self, cfg: dict[str, Any] | None = None) -> None:
        """Refuse, naming the field, what Slurm would refuse or never run; queue nothing."""
        if self._checked:
            return
        self._checking = True
        try:
            if self._sinfo is None:  # both round trips at once; sinfo's error comes first
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(2) as pool:
                    asks = [pool.submit(self._partitions), pool.submit(self._all_nodes)]
                for f in asks:
                    f.result()
            self._check(cfg)
        finally:
            self._checking = False
        self._checked = True

    def _check(self, cfg: dict[str, Any] | None) -> None:
        from ..hpc.base import parse_duration

        p = self.provider_config
        part = self.partition()
        if part["avail"] != "up":
            raise ConfigError(f"provider.partition: partition '{part['name']}' is "
                              f"{part['avail']} (sinfo)", field="provider.partition")
        walltime = p.get("walltime")
        if walltime:
            seconds = parse_duration(walltime, field="provider.walltime")
            limit = part["time_limit"]
            if limit not in ("infinite", "UNLIMITED", "n/a"):
                max_s = parse_duration(limit, field="provider.walltime")
                if seconds and max_s and seconds > max_s:
                    raise ConfigError(
                        f"provider.walltime: {walltime} is over the time limit of partition "
                        f"'{part['name']}' (sinfo TIMELIMIT {limit})",
                        field="provider.walltime", value=walltime)
        # one job must fit on one node of the partition, or Slurm keeps it pending forever
        self._check_fit(cfg, part)
        # Slurm's own answers, asked at once (each is a round trip to slurmctld/slurmdbd)
        asks: list[tuple[str, str, list[str], bytes | None]] = []
        for key, what in (("account", "account"), ("qos", "qos")):
            if p.get(key):
                fmt = "Account" if key == "account" else "Name"
                asks.append((key, what, ["sacctmgr", "-n", "-P", "show", what,
                                         f"format={fmt}"], None))
        # the real job scripts, through sbatch --test-only (nothing is queued)
        asks.append(("worker", "sbatch", ["sbatch", "--test-only",
                                          f"--job-name={self._job_name('worker')}"],
                     self.job_script(NODE_KIND_WORKER, self._resources(cfg, "worker"),
                                     {"scheduler_address": "tcp://127.0.0.1:1"}).encode()))
        if self.mode == "job":
            asks.append(("head", "sbatch", ["sbatch", "--test-only",
                                            f"--job-name={self._job_name('head')}"],
                         self.job_script(NODE_KIND_HEAD, self._resources(cfg, "head"),
                                         {}).encode()))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda a: self._run(a[2], a[2][0], input=a[3]), asks))
        for (key, what, _argv, _input), r in zip(asks, answers, strict=True):
            if what == "sbatch":
                if r.rc != 0:
                    answer = r.message.strip()
                    low = answer.lower()
                    fld = next((f for word, f in REFUSAL_FIELDS if word in low),
                               "job_extra_directives")
                    raise ConfigError(f"provider.{fld}: sbatch refused the {key} job script: "
                                      f"{answer}", field=f"provider.{fld}")
                continue
            value = p[key]
            if r.rc == 0:  # accounting runs: it is the list of what exists
                known = sorted({x.strip() for x in r.stdout.splitlines() if x.strip()})
                if value not in known:
                    raise ConfigError(
                        f"provider.{key}: '{value}' is not a{'n' if key == 'account' else ''} "
                        f"{what} Slurm knows (sacctmgr show {what}: {', '.join(known)})",
                        field=f"provider.{key}", value=value)

    def _check_fit(self, cfg: dict[str, Any] | None, part: dict[str, str]) -> None:
        nodes = self.nodes()
        res = self._resources(cfg, "worker")
        from ..hpc.slurm import slurm_int

        cpus = max((c for n in nodes if (c := slurm_int(n.get("CPUTot"))) is not None),
                   default=None)
        if cpus is not None and int(res.get("CPU") or 1) > cpus:
            raise ConfigError(
                f"provider.cores: {res.get('CPU')} cores per worker job; the largest node of "
                f"partition '{part['name']}' has {cpus} (scontrol show node CPUTot)",
                field="provider.cores", value=res.get("CPU"))
        mem = max((m for n in nodes if (m := slurm_int(n.get("RealMemory"))) is not None),
                  default=None)
        if mem is not None and self.job_memory(res) > mem * 2**20:
            raise ConfigError(
                f"provider.memory: {format_bytes(self.job_memory(res))} per worker job; the "
                f"largest node of partition '{part['name']}' has {mem} MB (scontrol show "
                "node RealMemory)", field="provider.memory",
                value=self.provider_config.get("memory"))

    def _resources(self, cfg: dict[str, Any] | None, type_name: str) -> dict[str, Any]:
        if cfg:
            head = cfg.get("head_node_type", "head")
            types = cfg.get("available_node_types") or {}
            if type_name == "worker":
                names = [t for t in types if t != head]
                if names:
                    return types[names[0]].get("resources") or {}
            elif head in types:
                return types[head].get("resources") or {}
        res = self.fill_resources(self.provider_config,
                                  self.default_node_types(self.provider_config)[type_name])
        res["memory"] = parse_bytes(res["memory"], field="provider.memory") if res.get(
            "memory") else 0
        return res

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        self.check(cluster_config)
        return cluster_config

    def capacity(self) -> Capacity:
        """The partition's idle cores (sinfo); the up-front check refuses more."""
        self.check()
        if time.monotonic() - self._sinfo_at > FACTS_SECONDS:
            self._sinfo = None  # idle cores change: ask again
        part = self.partition()
        counts = sinfo_cpus(part["cpus"])
        if counts is None:
            raise ProviderError(f"sinfo on {self.where} answered {part['cpus']!r} for the CPUs "
                                f"of partition '{part['name']}', not allocated/idle/other/"
                                "total")
        _alloc, idle, _other, total = counts
        return Capacity(cpus=idle, max_nodes=None, description=(
            f"partition '{part['name']}' on {self.where} has {idle} idle of {total} CPU "
            f"cores on {part['nodes']} node(s) ({part['nodelist']}; sinfo)"))

    def offers(self, query=None) -> OfferSet:
        from ..hpc.slurm import slurm_int
        from ..placement.model import Offer, OfferSet

        cap = self.capacity()
        part = self.partition()
        total = (sinfo_cpus(part["cpus"]) or (0, 0, 0, 0))[3]
        mem = slurm_int(part["memory"].rstrip("+"))
        per_node = mem * 2**20 if mem is not None else None
        free_mem = free_memory(self.nodes())
        return OfferSet([Offer(
            key=f"slurm/{part['name']}", provider="slurm", region=self.where,
            availability_zone=part["name"], price_per_hour=0.0,
            total={"CPU": float(total)}, free={"CPU": cap.cpus, "memory": float(free_mem)},
            capabilities={"memory_per_node": per_node, "nodes": part["nodes"]},
            instances=[{"cluster": self.cluster_name}] if self._jobs() else [],
            description=cap.description)])

    # NodeProvider --------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        out = []
        if self.mode == "login" and tag_filters.get(TAG_NODE_KIND) in (None, NODE_KIND_HEAD):
            out += self.local().non_terminated_nodes(tag_filters)
        for job_id, job in self._jobs().items():
            if job["state"] not in ALIVE:
                continue
            tags = self.node_tags(job_id)
            if all(tags.get(k) == v for k, v in tag_filters.items()):
                out.append(job_id)
        return out

    def is_running(self, node_id: str) -> bool:
        if self._is_local_node(node_id):
            return self.local().is_running(node_id)
        job = self._jobs().get(node_id)
        return job is not None and job["state"] in ALIVE

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        if self._is_local_node(node_id):
            return self.local().node_tags(node_id)
        job = self._jobs().get(node_id)
        if job is None:
            return {}
        tags = {k: v for k, v in job["tags"].items() if k != "ns"}
        tags[TAG_NODE_STATUS] = STATUS_UP_TO_DATE if job["state"] == "RUNNING" \
            else STATUS_UNINITIALIZED
        return tags

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        # identity tags are fixed in the job's comment; the status is read from Slurm's state
        if self._is_local_node(node_id):
            self.local().set_node_tags(node_id, tags)

    def internal_ip(self, node_id: str) -> str | None:
        if self._is_local_node(node_id):
            return self.local().internal_ip(node_id)
        job = self._jobs().get(node_id)
        return job["node"] if job and job["node"] not in ("", "(null)") else None

    def node_info(self, node_id: str) -> dict[str, Any]:
        if self._is_local_node(node_id):
            return {**self.local().node_info(node_id), "where": "login node"}
        job = self._jobs().get(node_id)
        if job is None:
            acct = self._accounting(node_id)
            return {"slurm_job_id": node_id, "slurm_state": acct.get("state", "GONE"),
                    **{k: v for k, v in acct.items() if k != "state"}}
        return {"slurm_job_id": node_id, "slurm_state": job["state"],
                "slurm_node": job["node"], "elapsed": job["elapsed"],
                "time_limit": job["time_limit"], "reason": job["reason"],
                "log": self._log_path(node_id)}

    def _log_path(self, job_id: str) -> str:
        return f"{self.workdir}/{job_id}.out"

    def _job_name(self, role: str) -> str:
        return f"cloudtik-{self.cluster_name}-{role}"[:64]

    # job scripts (dask-jobqueue's) ---------------------------------------------------------------
    def job_script(self, role: str, resources: dict[str, Any], runtime: dict[str, Any]) -> str:
        SLURMJob = _slurm_job_class()
        p = self.provider_config
        cores = max(int(resources.get("CPU") or 1), 1)
        memory = self.job_memory(resources)
        extra = list(p.get("job_extra_directives") or [])
        if p.get("qos"):
            extra.append(f"--qos={p['qos']}")
        gpus = int(resources.get("GPU") or 0)
        if gpus:
            extra.append(f"--gres=gpu:{gpus}")
        prologue = list(p.get("job_script_prologue") or [])
        prologue += list(runtime.get("setup_commands") or [])
        for k, v in sorted((runtime.get("env") or {}).items()):
            prologue.append(f"export {k}={shlex.quote(str(v))}")
        head_node = runtime.get("head_node_id") if role == NODE_KIND_WORKER else None
        if head_node and self.mode == "job" and not runtime.get("scheduler_address"):
            # queued with the head: Dask waits death_timeout for the scheduler file, so
            # first the head job must have started (Slurm makes its log then)
            prologue.append(f"while [ ! -e {shlex.quote(self._log_path(head_node))} ]; "
                            "do sleep 0.05; done")
        if role == NODE_KIND_HEAD:  # the reaper asks check_idle over HTTP
            prologue.append("export DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES="
                            + shlex.quote(repr(HTTP_ROUTES)))
        iface = self._interface()
        skip = [] if p.get("walltime") else ["-t "]
        processes = int(p.get("processes") or 1) if role == NODE_KIND_WORKER else 1
        dask_opts = runtime.get("dask") or {}
        tls_args = self._tls_args()
        # with TLS the dashboards (no authentication of their own) stay on the node's loopback
        worker_args = [*tls_args, "--dashboard-address", "127.0.0.1:0"] if tls_args else []
        scheduler = runtime.get("scheduler_address") or (
            "--scheduler-file " + shlex.quote(self._scheduler_file(head_node)) if head_node
            else ("tls" if tls_args else "tcp") + "://scheduler:8786")
        job = SLURMJob(
            scheduler=scheduler,
            name="$SLURM_JOB_ID", cores=cores, memory=str(memory), processes=processes,
            walltime=p.get("walltime") or "00:30:00", queue=p.get("partition"),
            account=p.get("account"), job_extra_directives=extra,
            job_script_prologue=prologue, job_directives_skip=skip, python=self.python,
            interface=iface, death_timeout=60, local_directory=p.get("local_directory"),
            job_name=self._job_name(role),
            worker_extra_args=worker_args + list(dask_opts.get("worker_options") or []))
        if role == NODE_KIND_HEAD:
            sched = [self.python, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
                     f"{self.workdir}/scheduler-$SLURM_JOB_ID.json", "--port", "0"]
            if iface == "lo":
                sched += ["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"]
            else:
                sched += (["--interface", iface] if iface else []) + [
                    "--dashboard-address", "127.0.0.1:0" if tls_args else ":0"]
            sched += tls_args + list(dask_opts.get("scheduler_options") or [])
            if tls_args:  # Dask's own file; the relay publishes scheduler-<id>.json
                sched[sched.index("--scheduler-file") + 1] = \
                    f"{self.workdir}/scheduler-$SLURM_JOB_ID.dask.json"
            job._command_template = " ".join(_shell_arg(a) for a in sched)
            if tls_args:
                relay = [self.python, self._relay_file(), self._tls_dir(),
                         f"{self.workdir}/scheduler-$SLURM_JOB_ID.dask.json",
                         f"{self.workdir}/scheduler-$SLURM_JOB_ID.json"]
                job._command_template = RELAY_WRAPPER.format(
                    command=job._command_template,
                    relay=" ".join(_shell_arg(a) for a in relay) + ' "$dask_pid"')
                return job.job_script()
        job._command_template = KILL_WRAPPER.format(command=job._command_template)
        return job.job_script()

    def _scheduler_file(self, head_node: str) -> str:
        """The file workers of ``head_node`` read the scheduler's address from: Dask's own
        of a scheduler job, or the one ``_publish_login_scheduler`` writes."""
        if self.mode == "job" and self.tls:  # Dask's; the relay publishes scheduler-<id>.json
            return f"{self.workdir}/scheduler-{head_node}.dask.json"
        return f"{self.workdir}/scheduler-{head_node}.json"

    def _publish_login_scheduler(self, head_node: str, info: ConnectInfo) -> None:
        """A login-node scheduler's address as its worker jobs dial it, as a scheduler file
        in the job folder (which the compute nodes share)."""
        data = json.dumps({"address": self._worker_address(info.scheduler_address)})
        shell = self.backend.shell
        shell.mkdir(self.workdir)
        shell.write_bytes(self._scheduler_file(head_node), data.encode(), mode=0o600)

    async def wait_head_ready(self, head_node_id: str, ctx: Any,
                              timeout: float) -> ConnectInfo:
        import asyncio

        info = await super().wait_head_ready(head_node_id, ctx, timeout)
        if self._is_local_node(head_node_id):  # its workers may be queued already
            await asyncio.to_thread(self._publish_login_scheduler, head_node_id, info)
        return info

    def _worker_address(self, address: str) -> str:
        """What workers on compute nodes dial: a login scheduler bound to all addresses is
        reached by this machine's name."""
        if self._tunnelled():
            # the manager knows the scheduler by this process's end of the tunnel; the
            # workers dial the scheduler job's own address
            port = address.rsplit(":", 1)[-1]
            with _TUNNELS_LOCK:
                for key, t in _TUNNELS.items():
                    if key[:3] == (self.where, self.ns, self.cluster_name) and \
                            str(t.port) == port:
                        return f"{address.split('://', 1)[0]}://{key[3]}"
            for job_id, job in self._jobs().items():
                if job["tags"].get(TAG_NODE_KIND) == NODE_KIND_HEAD:
                    info = self.connect_info(job_id)
                    if info is not None:
                        return info.extra.get("remote_scheduler_address") or address
        if self.mode == "login" and self._scheduler_host() in ("0.0.0.0", ""):
            scheme = address.split("://", 1)[0] if "://" in address else "tcp"
            port = address.rsplit(":", 1)[1]
            return f"{scheme}://{socket.getfqdn()}:{port}"
        return address

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, dict[str, Any]]:
        runtime = dict(node_config.get("runtime") or {})
        role = runtime.get("role") or tags.get(TAG_NODE_KIND, NODE_KIND_WORKER)
        if role == NODE_KIND_HEAD and self.mode == "login":
            return self.local().create_node(node_config, tags, count)
        self.check()
        if runtime.get("scheduler_address"):
            runtime["scheduler_address"] = self._worker_address(runtime["scheduler_address"])
        head_node = runtime.get("head_node_id")
        if head_node and role == NODE_KIND_WORKER and self._is_local_node(head_node):
            info = self.local().connect_info(head_node)  # up already (scale, a repair)
            if info is not None:
                self._publish_login_scheduler(head_node, info)
        script = self.job_script(role, runtime.get("resources") or {}, runtime).encode()
        self.backend.shell.mkdir(self.workdir)
        self._stage_tls()
        comment = encode_comment(self.ns, {**tags, TAG_CLUSTER_NAME: self.cluster_name})
        made: dict[str, dict[str, Any]] = {}
        argv = ["sbatch", "--parsable", f"--job-name={self._job_name(role)}",
                f"--comment={comment}", f"--chdir={self.workdir}",
                f"--output={self.workdir}/%j.out"]
        from concurrent.futures import ThreadPoolExecutor

        try:  # the submissions go at once (each waits for slurmctld); all are looked at
            with ThreadPoolExecutor(min(count, 8)) as pool:
                answers = list(pool.map(
                    lambda _i: _try(lambda: self._run(argv, "sbatch", input=script)),
                    range(count)))
            problems = []
            for r in answers:
                if isinstance(r, Exception):
                    problems.append(r)
                elif r.rc != 0:
                    problems.append(NodeLaunchError(f"sbatch refused the {role} job: "
                                                    f"{r.message}"))
                elif not r.stdout.strip().split(";", 1)[0].isdigit():
                    problems.append(NodeLaunchError(f"sbatch answered {r.stdout.strip()!r}, "
                                                    "not a job id"))
                else:
                    job_id = r.stdout.strip().split(";", 1)[0]
                    made[job_id] = {"slurm_job_id": job_id}
            if problems:
                raise problems[0]
        except Exception:
            if made:  # nothing half-made stays queued
                self._cancel(list(made))
            raise
        finally:
            self._forget_cache()
        return made

    def _cancel(self, job_ids: list[str], wait: float = 30.0) -> None:
        r = self._run(["scancel", *job_ids], "scancel")
        if r.rc != 0 and "Invalid job id" not in r.stderr and \
                "already completing or completed" not in r.stderr:
            raise ProviderError(f"scancel on {self.where} failed: {r.message}")
        # gone from squeue (no COMPLETING left): the job's processes have ended
        deadline = time.monotonic() + wait
        while True:
            listed = self._jobs(fresh=True)  # one squeue a round, not one per job
            left = [j for j in job_ids if j in listed]
            if not left or time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        local = [n for n in node_ids if self._is_local_node(n)]
        jobs = [n for n in node_ids if not self._is_local_node(n)]
        if jobs:
            self._cancel(jobs)
        if local:
            self.local().terminate_nodes(local)

    def sweep_orphans(self) -> int:
        return self.local().sweep_orphans() if self.mode == "login" else 0

    def cleanup(self) -> None:
        """After the last job is gone: this process's tunnels, the staged certificates and
        the cluster's TLS material (a next ``up`` makes a new CA)."""
        from ..runtime.tls import remove_cluster_tls

        self._close_tunnels()
        if self.mode == "login":
            self.local().cleanup()
        # the ended heads' scheduler files: a job id Slurm gives again must not find one
        self.backend.shell.run(["sh", "-c", 'rm -f -- "$1"/scheduler-*.json', "sh",
                                self.workdir])
        r = self.backend.shell.run(["rm", "-rf", "--", self._tls_dir()])
        if r.rc != 0:
            raise ProviderError(f"cannot remove {self._tls_dir()} on {self.where}: "
                                f"{r.message}")
        remove_cluster_tls(self.context.state_dir, self.cluster_name)

    # runtime ---------------------------------------------------------------------------------
    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        if self._is_local_node(head_node_id):
            return self.local().connect_info(head_node_id)
        try:
            data = json.loads(self.backend.shell.read_bytes(
                f"{self.workdir}/scheduler-{head_node_id}.json"))
        except (NotFoundError, ValueError):
            return None
        from ..runtime.tls import attach
        from .slurm_hosts import UntrustedAddress, check_address, job_hosts, split_host

        # the file is the job's (the user's code wrote it): every host in it must be a
        # node Slurm gave that job, or nothing here connects there (slurm_hosts.py)
        address = data.get("address") if isinstance(data, dict) else None
        if not isinstance(address, str):
            raise UntrustedAddress(f"Slurm job {head_node_id}'s scheduler file has no "
                                   "scheduler address")
        allowed = job_hosts(self.backend, head_node_id, remote=self._tunnelled())
        if not allowed:  # the job runs nowhere now: a file left behind names nothing
            return None
        check_address(address, allowed, head_node_id, "scheduler address")
        host, sport = split_host(address)
        host = f"[{host}]" if ":" in host else host  # as Dask writes an IPv6 address
        port = (data.get("services") or {}).get("dashboard")
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise UntrustedAddress(f"Slurm job {head_node_id}'s scheduler file names "
                                   f"dashboard port {port!r}, not a port number")
        extra: dict[str, Any] = {"slurm_job_id": head_node_id}
        relay = None
        if self.tls:
            extra["tls"] = True
            # the dashboard listens on the scheduler node's loopback only; the relay beside
            # it (mutual TLS, the cluster's CA) is its way in, and the Jupyter server's
            # dashboard proxy connects there with the cluster's client certificate
            port = None
            ours = data.get("cloudtik") or {}
            relay = ours.get("dashboard_relay")
            if relay is not None and not isinstance(relay, str):
                raise UntrustedAddress(f"Slurm job {head_node_id}'s scheduler file names "
                                       f"dashboard relay {relay!r}, not host:port")
            if relay:
                check_address(relay, allowed, head_node_id, "dashboard relay")
                extra["dashboard_tls_address"] = f"https://{relay}"
            elif ours.get("dashboard_relay_error"):
                extra["dashboard_error"] = ours["dashboard_relay_error"]
        dash = f"http://{host}:{port}" if port else None
        if self._tunnelled():
            extra["tunnel"] = {"via": self.where, "to": f"{host}:{sport}",
                               "dashboard_to": f"{host}:{port}" if port else None,
                               "relay_to": relay}
            extra["remote_scheduler_address"] = address
        info = ConnectInfo(
            scheduler_address=address,
            dashboard_link=f"{dash}/status" if dash else (
                f"https://{relay}/status" if relay else None),
            http_address=dash, extra=extra)
        return attach(self._through_tunnels(info), self.context.state_dir,
                      self.cluster_name)

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        if self._is_local_node(node_id):
            return self.local().node_logs(node_id, tail)
        try:
            text = self.backend.shell.read_bytes(self._log_path(node_id)).decode(
                errors="replace")
        except NotFoundError:
            return ""
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def recent_nodes(self, limit: int = 50) -> list[str]:
        out = self.local().recent_nodes(limit) if self.mode == "login" else []
        try:
            files = self.backend.shell.walk(self.workdir)
        except NotFoundError:
            files = []
        ids = {name[:-4] for name, _ in files if name.endswith(".out") and name[:-4].isdigit()}
        ids |= set(self._jobs())
        return out + sorted(ids, key=int)[-limit:]

    def node_failure_hint(self, node_id: str) -> str:
        if self._is_local_node(node_id):
            return self.local().node_failure_hint(node_id)
        job = self._jobs(fresh=True).get(node_id)
        state = job["state"] if job else (self._accounting(node_id).get("state") or "gone")
        return (f"Slurm job {node_id} is {state}; {self._log_path(node_id)} ends with:\n"
                + self.node_logs(node_id, 8))

