"""Submitting a Slurm cluster's nodes: the job scripts of ``count`` nodes go to
``sbatch`` at once (each waits for slurmctld), with the cluster's tags in the job's
comment; every answer is looked at, and if any submission failed the jobs that were
queued are cancelled, so nothing half-made stays.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import NodeLaunchError
from .base import NODE_KIND_HEAD, NODE_KIND_WORKER, TAG_CLUSTER_NAME, TAG_NODE_KIND
from .slurm_parse import encode_comment


def _try(fn):
    try:
        return fn()
    except Exception as e:  # handed back to the caller, which cancels what was made
        return e


class SlurmSubmit:
    """Creating nodes as Slurm jobs (a part of ``SlurmNodeProvider``)."""

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, dict[str, Any]]:
        runtime = dict(node_config.get("runtime") or {})
        role = runtime.get("role") or tags.get(TAG_NODE_KIND, NODE_KIND_WORKER)
        if role == NODE_KIND_HEAD and self.mode == "login":
            return self.local().create_node(node_config, tags, count)
        self.prepare_environment(runtime)  # its packages (runtime.pip), before the check
        self.check()
        if runtime.get("scheduler_address"):
            runtime["scheduler_address"] = self._worker_address(runtime["scheduler_address"])
        head_node = runtime.get("head_node_id")
        if head_node and role == NODE_KIND_WORKER and self._is_local_node(head_node):
            info = self.local().connect_info(head_node)  # up already (scale, a repair)
            if info is not None:
                self._publish_login_scheduler(head_node, info)
        script = self.job_script(role, runtime.get("resources") or {}, runtime).encode()
        self.login.shell.mkdir(self.workdir)
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
