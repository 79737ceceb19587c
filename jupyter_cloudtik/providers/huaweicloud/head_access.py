"""Reaching a huaweicloud head: its addresses, the runtimes it runs (Dask, Spark) and
their mutual-TLS endpoints (a mixin of ``HuaweiCloudNodeProvider``, nodes.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ...core.errors import NodeLaunchError, OperationTimeout
from ...core.models import ConnectInfo
from ...runtime.base import RuntimeUnreachable, http_json
from ...runtime.spark import NODE_MASTER_PORT, NODE_UI_PORT, pyspark_version
from ...runtime.tls import SPARK_UI_ALPN, client_security, client_ssl_context, load_cluster_tls
from .servers import RUNTIMES_METADATA, addresses
from .userdata import DASHBOARD_PORT, DASHBOARD_TLS_PORT, SCHEDULER_PORT

if TYPE_CHECKING:
    from distributed import Client

    from ...core.operations import OperationContext


class HeadAccess:
    """How a client reaches the head; needs ``_server``, ``is_running``, ``external_ip``,
    ``node_failure_hint``, ``provider_config``, ``context`` and ``cluster_name`` of the node
    provider."""

    def _head_host(self, head_node_id: str) -> tuple[str | None, str | None]:
        s = self._server(head_node_id)
        if s is None:
            return None, None
        private, public = addresses(s)
        reach = private if self.provider_config.get("use_internal_ips") or not public else public
        return private, reach

    def runtime_types(self, head_node_id: str) -> list[str]:
        """What the head runs (its server metadata; Dask when it says nothing)."""
        s = self._server(head_node_id)
        text = ((s.metadata or {}).get(RUNTIMES_METADATA) if s is not None else None) or ""
        return [t for t in text.split(",") if t] or ["dask"]

    def spark_info(self, head_node_id: str) -> dict[str, Any] | None:
        """The head's Spark master once it is alive: its ``spark://`` URL at the head's
        private IP (port 7077, open to the VPC only), and its UI, which listens on the
        head's loopback (``http://127.0.0.1:8080``) and is reached from outside only
        through the head's mutual-TLS relay (port 8788, the same as Dask's dashboard,
        with ALPN ``cloudtik-spark``): ``ui_tls_address``, which the Jupyter server's
        Spark UI route proxies to with the cluster's client certificate.  The UI's own
        answer must name this head's master: another cluster's master is not this one.
        A head reached only on its loopback (a workspace made before the relay served
        Spark has no 8788 rule: an SSH tunnel, docs/spark.md) is read there."""
        private, reach = self._head_host(head_node_id)
        if private is None:
            return None
        master = f"spark://{private}:{NODE_MASTER_PORT}"
        ui = f"http://127.0.0.1:{NODE_UI_PORT}"
        relay = f"https://{reach}:{DASHBOARD_TLS_PORT}" if reach else None
        tls = load_cluster_tls(self.context.state_dir, self.cluster_name)
        state: Any = None
        if relay and tls is not None:
            try:
                state = http_json(f"{relay}/json/", timeout=2, context=client_ssl_context(
                    tls.client_credentials(), alpn=SPARK_UI_ALPN))
            except (RuntimeUnreachable, LookupError):
                state = None
        if not isinstance(state, dict) or state.get("url") != master:
            relay = None
            try:
                state = http_json(f"{ui}/json/", timeout=2)
            except (RuntimeUnreachable, LookupError):
                return None
        if not isinstance(state, dict) or state.get("url") != master \
                or state.get("status") != "ALIVE":
            return None
        # the nodes refused to boot with another pyspark than the client's
        # the driver (c.spark()) listens at its own address, not the head's
        facts = {"master_url": master, "ui": ui, "version": pyspark_version(),
                 "driver_host": None}
        if relay:
            facts["ui_tls_address"] = relay
        return facts

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        types = self.runtime_types(head_node_id)
        spark = None
        if "spark" in types:
            spark = self.spark_info(head_node_id)
            if spark is None:
                return None
        if "dask" not in types:
            tls = load_cluster_tls(self.context.state_dir, self.cluster_name)
            return ConnectInfo(scheduler_address=spark["master_url"], dashboard_link=None,
                               http_address=None,
                               extra={"spark": spark, "head_node": head_node_id},
                               credentials=tls.client_credentials() if tls else None)
        info = self._dask_connect_info(head_node_id)
        if info is not None and spark is not None:
            info.extra["spark"] = spark
        return info

    def _dask_connect_info(self, head_node_id: str) -> ConnectInfo | None:
        """The head's scheduler, once it completes a mutual-TLS handshake with our client
        certificate.  The dashboard listens on the head's loopback only; from outside it
        is reached through the head's relay (port 8788), which requires the same client
        certificate: ``dashboard_link`` is that HTTPS address (a Jupyter server serves it
        under its own URL with the certificate; a browser has none), and ``http_address``
        stays empty (the manager asks the scheduler over the TLS Dask connection)."""
        import socket
        import ssl

        private, reach = self._head_host(head_node_id)
        tls = load_cluster_tls(self.context.state_dir, self.cluster_name)
        if private is None or reach is None or tls is None:
            return None
        ctx = client_ssl_context(tls.client_credentials())
        try:
            with socket.create_connection((reach, SCHEDULER_PORT), timeout=2) as raw, \
                    ctx.wrap_socket(raw) as conn:
                conn.getpeercert()
        except (OSError, ssl.SSLError):
            return None
        ip = self.external_ip(head_node_id) or private
        dashboard = f"https://{reach}:{DASHBOARD_TLS_PORT}"
        return ConnectInfo(
            scheduler_address=f"tls://{private}:{SCHEDULER_PORT}",
            dashboard_link=f"{dashboard}/status", http_address=None,
            extra={"public_scheduler_address": f"tls://{reach}:{SCHEDULER_PORT}",
                   "head_node": head_node_id, "tls": True,
                   "dashboard_tls_address": dashboard,
                   "dashboard": f"mutual TLS at {dashboard} (the cluster's client "
                                f"certificate), served by a Jupyter server at "
                                f"cloudtik/dashboard/{self.cluster_name}/; or on the head's "
                                f"loopback: ssh -L {DASHBOARD_PORT}:127.0.0.1:"
                                f"{DASHBOARD_PORT} root@{ip}, then http://127.0.0.1:"
                                f"{DASHBOARD_PORT}/status"},
            credentials=tls.client_credentials())

    async def wait_head_ready(self, head_node_id: str, ctx: OperationContext,
                              timeout: float) -> ConnectInfo:
        deadline = time.monotonic() + timeout
        said = False
        while True:
            ctx.checkpoint()
            info = await asyncio.to_thread(self.connect_info, head_node_id)
            if info is not None:
                return info
            if not await asyncio.to_thread(self.is_running, head_node_id):
                raise NodeLaunchError(f"the head node {head_node_id} stopped while starting: "
                                      + await asyncio.to_thread(self.node_failure_hint,
                                                                head_node_id))
            if not said:
                ip = await asyncio.to_thread(self.external_ip, head_node_id)
                ctx.progress("head", f"head server {head_node_id} is booting"
                             + (f" (EIP {ip})" if ip else ""), 0.15)
                said = True
            if time.monotonic() > deadline:
                raise OperationTimeout(f"the head node {head_node_id} did not start its "
                                       f"scheduler within {timeout:.0f}s")
            await asyncio.sleep(0.25)

    @classmethod
    def make_client(cls, info: ConnectInfo, **kwargs: Any) -> Client:
        from distributed import Client

        address = (info.extra or {}).get("public_scheduler_address") or info.scheduler_address
        sec = client_security(info)
        if sec is not None:
            kwargs.setdefault("security", sec)
        return Client(address, **kwargs)
