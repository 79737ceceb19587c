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
* **Transport** is the one the HPC backends share (``transport.slurm.SlurmLogin`` and
  its ``LocalShell``/``SSHShell``): ``backend:`` names a configured HPC backend of type slurm
  (its host, user, key in the secret store, ``SLURM_CONF``...), or ``host:``/``user:``/
  ``port:`` give one inline (key: secret ``ssh_key`` of scope ``hpc:slurm``).
* **Before anything is queued** the request is checked against Slurm: ``sinfo`` for the
  partition, its time limit and its idle cores (the placement offer), ``sacctmgr`` for
  accounts and QOS when accounting runs, and ``sbatch --test-only`` with the real job
  script, whose refusal is quoted.  Every refusal names the provider field.

``SlurmNodeProvider`` is assembled from one part per job: ``slurm_transport`` (the login
node, the Slurm commands and the job folder), ``slurm_tls`` (the certificates staged for
the jobs and the dashboard relay's code), ``slurm_tunnel`` (the SSH tunnel to a scheduler
job), ``slurm_partition`` (what the partition is and has: capacity and placement offer),
``slurm_checks`` (the up-front refusals), ``slurm_nodes`` (the jobs ``squeue`` lists, read
as nodes), ``slurm_job_script`` (dask-jobqueue's job scripts), ``slurm_scheduler`` (where
the scheduler runs and how it is reached; the hosts a scheduler file may name are
``slurm_hosts``), ``slurm_submit`` (``sbatch``) and ``slurm_stop`` (``scancel`` and
cleaning up); what Slurm's commands print is read by ``slurm_parse``.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import ConfigError
from .base import NodeProvider, ProviderContext
from .slurm_checks import SlurmChecks
from .slurm_environment import SlurmEnvironment
from .slurm_job_script import SlurmJobScript
from .slurm_nodes import SlurmNodes
from .slurm_partition import SlurmPartition
from .slurm_scheduler import SlurmScheduler
from .slurm_stop import SlurmStop
from .slurm_submit import SlurmSubmit
from .slurm_tls import SlurmTls
from .slurm_transport import SlurmTransport
from .slurm_tunnel import SlurmTunnel

if TYPE_CHECKING:
    from ..transport.slurm import SlurmLogin


def _ns(state_dir: Any) -> str:
    return hashlib.sha1(str(state_dir).encode()).hexdigest()[:8]


class SlurmNodeProvider(SlurmTransport, SlurmEnvironment, SlurmTls, SlurmTunnel,
                        SlurmPartition, SlurmChecks, SlurmNodes, SlurmJobScript,
                        SlurmScheduler, SlurmSubmit, SlurmStop, NodeProvider):
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
                                      "locally; over SSH the session's environment, "
                                      "built on the system as for HPC jobs)."},
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
        self._login: SlurmLogin | None = None
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
        self._env: dict[str, Any] | None = None  # the built environment (over SSH)

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
