"""A Slurm cluster's nodes as Slurm says they are: its jobs in ``squeue`` (matched by
the namespace and cluster in their comment, cached for ``CACHE_SECONDS``), what
``sacct`` keeps of a job that ended, and each node's tags, state, address, log and
failure hint read from them — never a list kept here.
"""

from __future__ import annotations

import time
from typing import Any

from ..core.errors import NotFoundError, ProviderError
from .base import (
    NODE_KIND_HEAD,
    STATUS_UNINITIALIZED,
    STATUS_UP_TO_DATE,
    TAG_NODE_KIND,
    TAG_NODE_STATUS,
)
from .slurm_parse import ALIVE, SQUEUE_FORMAT, parse_sacct_job, parse_squeue_jobs

CACHE_SECONDS = 0.3


class SlurmNodes:
    """Reading the cluster's nodes from Slurm (a part of ``SlurmNodeProvider``)."""

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

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        if self._is_local_node(node_id):
            return self.local().node_logs(node_id, tail)
        try:
            text = self.login.shell.read_bytes(self._log_path(node_id)).decode(
                errors="replace")
        except NotFoundError:
            return ""
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def recent_nodes(self, limit: int = 50) -> list[str]:
        out = self.local().recent_nodes(limit) if self.mode == "login" else []
        try:
            files = self.login.shell.walk(self.workdir)
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
