"""Stopping a Slurm cluster's nodes: ``scancel``, then waiting until ``squeue`` no
longer lists them (their processes have ended); and after the last job, what the
cluster leaves: this process's tunnels, the login-node scheduler, the heads'
scheduler files and the cluster's TLS material.
"""

from __future__ import annotations

import time

from ..core.errors import ProviderError


class SlurmStop:
    """Cancelling jobs and cleaning up (a part of ``SlurmNodeProvider``)."""

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
        # deferred: start-up (runtime.tls ~21 ms, loads ssl, socket)
        from ..runtime.tls import remove_cluster_tls

        self._close_tunnels()
        if self.mode == "login":
            self.local().cleanup()
        # the ended heads' scheduler files: a job id Slurm gives again must not find one
        self.login.shell.run(["sh", "-c", 'rm -f -- "$1"/scheduler-*.json', "sh",
                                self.workdir])
        r = self.login.shell.run(["rm", "-rf", "--", self._tls_dir()])
        if r.rc != 0:
            raise ProviderError(f"cannot remove {self._tls_dir()} on {self.where}: "
                                f"{r.message}")
        remove_cluster_tls(self.context.state_dir, self.cluster_name)
