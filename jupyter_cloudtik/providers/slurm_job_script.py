"""The job scripts of a Slurm cluster's nodes: dask-jobqueue's ``SLURMJob`` template
(imported without its process-wide SIGINT handler), the worker's or scheduler's
command inside a wrapper that ends Dask itself on ``scancel`` or at the time limit,
and with TLS the scheduler's dashboard relay beside it.
"""

from __future__ import annotations

import shlex
import sys
import threading
from typing import Any

from .base import NODE_KIND_HEAD, NODE_KIND_WORKER

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
HTTP_ROUTES = ["distributed.http.scheduler.prometheus", "distributed.http.scheduler.info",
               "distributed.http.scheduler.json", "distributed.http.scheduler.api",
               "distributed.http.health", "distributed.http.proxy",
               "distributed.http.statics"]
_IMPORT_LOCK = threading.Lock()


def _shell_arg(arg: str) -> str:
    """``arg`` quoted for the job's shell, with ``$SLURM_JOB_ID`` left to expand."""
    return '"$SLURM_JOB_ID"'.join(shlex.quote(p) if p else "" for p in
                                  arg.split("$SLURM_JOB_ID"))


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


class SlurmJobScript:
    """A node's job script and job name (a part of ``SlurmNodeProvider``)."""

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
        env = self.prepare_environment(runtime)  # over SSH: built there unless it is
        prologue = list(env["prologue"]) if env else []
        prologue += list(p.get("job_script_prologue") or [])
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

    def _job_name(self, role: str) -> str:
        return f"cloudtik-{self.cluster_name}-{role}"[:64]
