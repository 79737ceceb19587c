"""Where a Slurm cluster's scheduler runs and how it is reached.  ``scheduler: login``:
a detached process on the login node through the ``local`` provider, whose address
is published as a scheduler file in the job folder for the worker jobs.
``scheduler: job``: a Slurm job that writes its own scheduler file, whose every host
must be one of the job's nodes (``slurm_hosts.py``) before anything connects there.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ..core.errors import NotFoundError
from ..core.models import ConnectInfo
from .base import NODE_KIND_HEAD, TAG_NODE_KIND
from .slurm_hosts import UntrustedAddress, check_address, job_hosts, split_host
from .slurm_tunnel import _TUNNELS, _TUNNELS_LOCK


class SlurmScheduler:
    """The head's scheduler: on the login node or as a job (a part of
    ``SlurmNodeProvider``)."""

    def local(self):
        """The login-node scheduler's provider (``scheduler: login``)."""
        if self._local is None:
            # deferred: start-up (providers.local ~41 ms, loads traitlets, psutil)
            from .local import LocalNodeProvider

            local = LocalNodeProvider(
                {"type": "local", "host": self._scheduler_host(), "launch_method": "fork"},
                self.cluster_name, self.context)
            local.tls = self.tls  # same rule as the jobs; the same cluster certificates
            self._local = local
        return self._local

    def _is_local_node(self, node_id: str) -> bool:
        return not node_id.isdigit()

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
        shell = self.login.shell
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

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        if self._is_local_node(head_node_id):
            return self.local().connect_info(head_node_id)
        try:
            data = json.loads(self.login.shell.read_bytes(
                f"{self.workdir}/scheduler-{head_node_id}.json"))
        except (NotFoundError, ValueError):
            return None
        from ..runtime.tls import attach  # deferred: start-up (runtime.tls ~9 ms, loads ssl)

        # the file is the job's (the user's code wrote it): every host in it must be a
        # node Slurm gave that job, or nothing here connects there (slurm_hosts.py)
        address = data.get("address") if isinstance(data, dict) else None
        if not isinstance(address, str):
            raise UntrustedAddress(f"Slurm job {head_node_id}'s scheduler file has no "
                                   "scheduler address")
        allowed = job_hosts(self.login, head_node_id, remote=self._tunnelled())
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
