"""The SSH tunnel to a scheduler job: over SSH with ``scheduler: job`` this process
reaches the scheduler (and its dashboard or TLS relay) through ports forwarded over the
provider's SSH connection, opened again when that connection is gone and by a new
process (a restarted kernel, the CLI); ``down`` closes them.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.errors import BackendUnavailable, ProviderError
from ..core.models import ConnectInfo

# (login node, state namespace, cluster, "host:port") -> transport.shell.Tunnel of this process
_TUNNELS: dict[tuple[str, str, str, str], Any] = {}
_TUNNELS_LOCK = threading.Lock()


class SlurmTunnel:
    """This process's forwarded ports to a scheduler job (a part of ``SlurmNodeProvider``)."""

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

            try:
                t = self.login.shell.forward_local_port(host, int(port))
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
