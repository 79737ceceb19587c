"""The ``dask-gateway`` provider: clusters on an existing Dask Gateway server.

A Dask Gateway (Kubernetes, Hadoop/YARN, Slurm or local backends) runs the scheduler and
the workers itself; this provider maps our cluster model onto it:

* the head node is the gateway cluster (node id: the gateway's cluster name);
* worker nodes are the workers the gateway started (node id: the Dask worker name);
  ``create_node(count=N)`` scales the gateway cluster up by N and returns the N new
  workers once they joined, ``terminate_nodes`` scales it down (the gateway picks which
  workers go) or stops the whole gateway cluster when the head is among them.

The gateway is the truth about what exists; which gateway cluster belongs to which of our
clusters, and the tags of our model, are kept in the table ``gateway_clusters`` (a gateway
has no tags).  Authentication follows dask-gateway: ``basic`` (user name, and a password
from ``DASK_GATEWAY_PASSWORD`` or the secret store), ``jupyterhub`` (the API token of the
JupyterHub session) or ``kerberos``; ``cluster_options`` are passed through.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import ConfigError, NodeLaunchError, OperationTimeout, ProviderError
from ..core.grants import policy_for
from ..core.store import Store, dumps, loads
from .base import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    TAG_CLUSTER_NAME,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    ConnectInfo,
    NodeProvider,
)

if TYPE_CHECKING:
    from distributed import Client

    from ..core.operations import OperationContext

GATEWAY_MIGRATIONS = [
    """
    CREATE TABLE gateway_clusters (
        gateway_name TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        address TEXT NOT NULL,
        tags TEXT NOT NULL,
        worker_tags TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL
    );
    CREATE INDEX gateway_clusters_cluster ON gateway_clusters(cluster);
    """,
]
PASSWORD_ENV = "DASK_GATEWAY_PASSWORD"
SECRET_SCOPE = "provider:dask-gateway"
ALIVE = ("PENDING", "RUNNING")
IDENTITY_ATTEMPTS = 4
LOOP_ATTEMPTS = 3  # the client's event loop, started again when it did not start
IDENTITY_TIMEOUT = 15
POLL = 0.05


def _password(username: str | None, address: str, store=None) -> str | None:
    if store is not None:
        # deferred: start-up (core.secrets ~23 ms, loads traitlets, cryptography)
        from ..core.secrets import SecretStore

        secrets = SecretStore(store)
        name = f"{username}@{address}"
        if secrets.has(SECRET_SCOPE, name):
            grant = policy_for(store).service(
                "gateway", name, "log in to the Dask Gateway that runs the cluster")
            return secrets.reveal(grant, name)
    return os.environ.get(PASSWORD_ENV)


def close_gateway(gw) -> None:
    """Close a sync ``Gateway`` once: dask-gateway's ``__del__`` closes it again and fails
    when its loop is already stopped, so the loop runner is dropped after closing."""
    try:
        gw.close()
    finally:
        if hasattr(gw, "_loop_runner"):
            del gw._loop_runner


def make_auth(auth: dict[str, Any] | None, address: str, store=None):
    """A dask-gateway ``GatewayAuth`` from our config (None: dask-gateway's own config)."""
    from dask_gateway.auth import BasicAuth, JupyterHubAuth, KerberosAuth, get_auth

    if not auth:
        return get_auth(None)
    kind = auth.get("type")
    if kind == "basic":
        return BasicAuth(auth.get("username"), _password(auth.get("username"), address, store))
    if kind == "jupyterhub":
        return JupyterHubAuth()
    if kind == "kerberos":
        return KerberosAuth()
    raise ConfigError(f"provider.auth.type: {kind!r} is not one of basic, jupyterhub, "
                      "kerberos", field="provider.auth.type", value=kind)


class DaskGatewayNodeProvider(NodeProvider):
    provider_type = "dask-gateway"
    # storage.remotes: the rclone config goes to the workers as a worker plugin over the
    # gateway's TLS connection once they are up; the gateway's options carry nothing private
    delivers_secrets_at_runtime: ClassVar[bool] = True
    # a scale-down is a new count for the gateway's scheduler, which chooses the workers to
    # close (dask_gateway.scheduler_preload: heartbeat -> workers_to_close -> retire_workers)
    picks_workers_to_retire: ClassVar[bool] = True
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "title": "Dask Gateway",
        "description": "Clusters on an existing Dask Gateway server.",
        "additionalProperties": False,
        "properties": {
            "type": {"const": "dask-gateway"},
            "address": {"type": "string", "pattern": r"^https?://",
                        "description": "The gateway's address (default: dask config "
                                       "gateway.address)."},
            "proxy_address": {"type": "string"},
            "public_address": {"type": "string"},
            "auth": {"type": "object", "additionalProperties": False, "required": ["type"],
                     "properties": {"type": {"enum": ["basic", "jupyterhub", "kerberos"]},
                                    "username": {"type": "string"}}},
            "cluster_options": {"type": "object",
                                "description": "Options of the gateway's cluster form, "
                                               "passed through (e.g. worker_cores)."},
            "start_timeout": {"type": "number", "minimum": 1},
        },
    }

    def __init__(self, provider_config, cluster_name, context) -> None:
        super().__init__(provider_config, cluster_name, context)
        self.store = context.store
        self.store.ensure_schema("gateway", GATEWAY_MIGRATIONS)
        import dask

        self.address = provider_config.get("address") or dask.config.get(
            "gateway.address", None)
        if not self.address:
            raise ConfigError("provider.address: the Dask Gateway address is missing (or set "
                              "dask config gateway.address)", field="provider.address")
        self.timeout = float(provider_config.get("start_timeout")
                             or context.settings.operation_timeout)

    @classmethod
    def provisioned(cls, provider_config: dict[str, Any], node_type: dict[str, Any],
                    role: str = "worker") -> dict[str, float]:
        """What the gateway gives: its cluster options' cores (the catalogue's, on a hub),
        one by default; the node type's declared ``CPU`` does not reach the gateway."""
        options = provider_config.get("cluster_options") or {}
        key = "scheduler_cores" if role == "head" else "worker_cores"
        try:
            cores = float(options.get(key) or 1)
        except (TypeError, ValueError):
            cores = 1.0
        return {"CPU": max(cores, 1.0)}

    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        return {"head": {"node_config": {}, "resources": {"CPU": 0}},
                "worker": {"node_config": {}, "resources": {"CPU": 1}, "min_workers": 1,
                           "max_workers": 100}}

    # the gateway ----------------------------------------------------------------------------
    def _gateway(self):
        from dask_gateway import Gateway

        p = self.provider_config
        auth = make_auth(p.get("auth"), self.address, self.store)
        for attempt in range(LOOP_ATTEMPTS):
            try:
                return Gateway(self.address, proxy_address=p.get("proxy_address"),
                               public_address=p.get("public_address"), auth=auth)
            except AssertionError:
                # distributed's LoopRunner waits 10 s for the client's event-loop thread
                # and then fails `assert loop is not None` (utils.py, _start_unlocked): a
                # loaded machine, not a bad gateway (a clean-clone CI run ended an `up`
                # with "internal error: AssertionError" so)
                if attempt + 1 == LOOP_ATTEMPTS:
                    raise ProviderError(
                        f"Dask Gateway {self.address}: the client's event loop did not start "
                        f"within 10 s, {LOOP_ATTEMPTS} times (is this machine overloaded?)"
                    ) from None
        raise AssertionError("unreachable")

    def _call(self, what: str, fn):
        try:
            gw = self._gateway()
        except (ValueError, TypeError) as e:
            raise ConfigError(f"provider: {e}", field="provider") from None
        try:
            return fn(gw)
        except (OSError, TimeoutError) as e:
            raise ProviderError(f"Dask Gateway {self.address}: {what} failed: {e}") from None
        except ValueError as e:  # dask-gateway reports HTTP errors as ValueError
            raise ProviderError(f"Dask Gateway {self.address}: {what} failed: {e}") from None
        finally:
            close_gateway(gw)

    def _rows(self):
        return self.store.query("SELECT * FROM gateway_clusters WHERE cluster = ? AND "
                                "address = ? ORDER BY created_at", (self.cluster_name,
                                                                    self.address))

    def _report(self, name: str):
        def get(gw):
            try:
                return gw.get_cluster(name)
            except ValueError as e:
                if "404" in str(e) or "not found" in str(e).lower():
                    return None
                raise

        return self._call("looking up a cluster", get)

    def _live_head(self):
        """(row, report) of this cluster's gateway cluster, forgetting ones that ended."""
        for row in self._rows():
            report = self._report(row["gateway_name"])
            if report is not None and report.status.name in ALIVE:
                return row, report
            with self.store.transaction() as conn:
                conn.execute("DELETE FROM gateway_clusters WHERE gateway_name = ?",
                             (row["gateway_name"],))
        return None, None

    def _workers(self, report) -> dict[str, str]:
        """{worker name: address} from the scheduler's identity (through the gateway)."""
        if report is None or report.status.name != "RUNNING" or not report.dashboard_link:
            return {}
        url = report.dashboard_link.rsplit("/status", 1)[0] + "/json/identity.json"
        # A scheduler that does not answer is not a scheduler without workers: reading it
        # as "none" made a scale-down stop waiting at once and a scale-up ask for too few.
        for attempt in range(IDENTITY_ATTEMPTS):
            try:
                with urllib.request.urlopen(url, timeout=IDENTITY_TIMEOUT) as r:
                    data = json.loads(r.read())
                break
            except (urllib.error.URLError, OSError, ValueError) as e:
                error = e
                if attempt + 1 < IDENTITY_ATTEMPTS:
                    time.sleep(0.5 * (attempt + 1))
        else:
            raise ProviderError(f"Dask Gateway {self.address}: the scheduler of "
                                f"{report.name} did not say which workers it has: {error}")
        return {str(w.get("name") or a): a for a, w in (data.get("workers") or {}).items()}

    # NodeProvider ---------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        row, report = self._live_head()
        if row is None:
            return []
        out = []
        head_tags = loads(row["tags"], {})
        if all(head_tags.get(k) == v for k, v in tag_filters.items()):
            out.append(row["gateway_name"])
        if tag_filters.get(TAG_NODE_KIND) not in (None, NODE_KIND_WORKER):
            return out
        wtags = loads(row["worker_tags"], {})
        for name in self._workers(report):
            tags = next(iter(wtags.values()), {})
            if all(tags.get(k) == v for k, v in tag_filters.items()):
                out.append(name)
        return out

    def _row(self, node_id: str):
        return self.store.query_one("SELECT * FROM gateway_clusters WHERE gateway_name = ?",
                                    (node_id,))

    def is_running(self, node_id: str) -> bool:
        row = self._row(node_id)
        if row is not None:
            report = self._report(node_id)
            return report is not None and report.status.name in ALIVE
        _, report = self._live_head()
        return node_id in self._workers(report)

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        row = self._row(node_id)
        if row is not None:
            return loads(row["tags"], {})
        heads = self._rows()
        if not heads:
            return {}
        return next(iter(loads(heads[-1]["worker_tags"], {}).values()), {})

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM gateway_clusters WHERE gateway_name = ?",
                               (node_id,)).fetchone()
            if row is not None:
                merged = {**loads(row["tags"], {}), **tags}
                conn.execute("UPDATE gateway_clusters SET tags = ? WHERE gateway_name = ?",
                             (dumps(merged), node_id))

    def internal_ip(self, node_id: str) -> str | None:
        return None

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, dict[str, Any]]:
        kind = tags.get(TAG_NODE_KIND)
        if kind == NODE_KIND_HEAD:
            options = dict(self.provider_config.get("cluster_options") or {})

            def new(gw):
                opts = gw.cluster_options() if options else None
                if opts is not None:
                    for k, v in options.items():
                        if k not in opts:
                            raise ConfigError(
                                f"provider.cluster_options.{k}: not an option of this gateway "
                                f"(options: {', '.join(opts) or 'none'})",
                                field=f"provider.cluster_options.{k}")
                        opts[k] = v
                return gw.submit(cluster_options=opts)

            name = self._call("creating a cluster", new)
            with self.store.transaction() as conn:
                conn.execute("INSERT INTO gateway_clusters (gateway_name, cluster, address, "
                             "tags, created_at) VALUES (?, ?, ?, ?, ?)",
                             (name, self.cluster_name, self.address,
                              dumps({**tags, TAG_CLUSTER_NAME: self.cluster_name}),
                              time.time()))
            return {name: {"gateway_cluster": name}}
        row, report = self._live_head()
        if row is None:
            raise NodeLaunchError("the gateway cluster is gone; run `up` again to start a new "
                                  "one")
        wtype = tags.get(TAG_NODE_TYPE, "worker")
        known = loads(row["worker_tags"], {})
        if known and wtype not in known:
            raise ConfigError(f"available_node_types: a Dask Gateway cluster has one worker "
                              f"type; '{wtype}' is a second one", field="available_node_types")
        with self.store.transaction() as conn:
            conn.execute("UPDATE gateway_clusters SET worker_tags = ? WHERE gateway_name = ?",
                         (dumps({wtype: {**tags, TAG_CLUSTER_NAME: self.cluster_name}}),
                          row["gateway_name"]))
        before = set(self._workers(report))
        self._call("scaling up", lambda gw: gw.scale_cluster(row["gateway_name"],
                                                             len(before) + count))
        deadline = time.monotonic() + self.timeout
        while True:
            new = [n for n in self._workers(report) if n not in before]
            if len(new) >= count:
                return {n: {} for n in new[:count]}
            if time.monotonic() > deadline:
                raise OperationTimeout(f"the gateway started {len(new)} of {count} workers "
                                       f"within {self.timeout:.0f}s")
            time.sleep(POLL)

    def terminate_nodes(self, node_ids: list[str]) -> None:
        heads = [n for n in node_ids if self._row(n) is not None]
        for name in heads:
            def stop(gw, name=name):
                try:
                    gw.stop_cluster(name)
                except ValueError as e:
                    if "404" not in str(e):
                        raise
            self._call("stopping a cluster", stop)
            with self.store.transaction() as conn:
                conn.execute("DELETE FROM gateway_clusters WHERE gateway_name = ?", (name,))
        workers = [n for n in node_ids if n not in heads]
        if workers and not heads:
            row, report = self._live_head()
            if row is None:
                return
            current = self._workers(report)
            keep = [n for n in current if n not in workers]
            if len(keep) < len(current):
                # The scheduler retires len(current) - len(keep) workers of its choosing, not
                # necessarily ``workers``: wait for the count, never for the names, or a
                # survivor we meant to stop ends the wait while a replacement is on its way.
                self._call("scaling down", lambda gw: gw.scale_cluster(row["gateway_name"],
                                                                       len(keep)))
                deadline = time.monotonic() + self.timeout
                while True:
                    now = self._workers(report)
                    if len(now) <= len(keep):
                        return
                    if time.monotonic() > deadline:
                        raise OperationTimeout(
                            f"the gateway still runs {len(now)} workers {self.timeout:.0f}s "
                            f"after being asked for {len(keep)}")
                    time.sleep(POLL)

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        report = self._report(head_node_id)
        if report is None or report.status.name != "RUNNING":
            return None
        http = report.dashboard_link.rsplit("/status", 1)[0] if report.dashboard_link else None
        p = self.provider_config
        return ConnectInfo(
            scheduler_address=f"gateway://{head_node_id}", dashboard_link=report.dashboard_link,
            http_address=http,
            extra={"gateway_address": self.address, "gateway_cluster": head_node_id,
                   "proxy_address": p.get("proxy_address"),
                   "public_address": p.get("public_address"), "auth": p.get("auth")})

    async def wait_head_ready(self, head_node_id: str, ctx: OperationContext,
                              timeout: float) -> ConnectInfo:
        import asyncio

        deadline = time.monotonic() + timeout
        while True:
            ctx.checkpoint()
            report = await asyncio.to_thread(self._report, head_node_id)
            if report is None or report.status.name not in ALIVE:
                raise NodeLaunchError(f"the gateway cluster {head_node_id} ended while "
                                      "starting" + (f" ({report.status.name})" if report
                                                    else ""))
            if report.status.name == "RUNNING":
                info = await asyncio.to_thread(self.connect_info, head_node_id)
                if info is not None:
                    return info
            if time.monotonic() > deadline:
                raise OperationTimeout(f"the gateway cluster {head_node_id} did not start "
                                       f"within {timeout:.0f}s")
            await asyncio.sleep(POLL)

    @classmethod
    async def register_worker_plugin(cls, info: ConnectInfo, plugin: Any) -> None:
        """Over the gateway's own connection (TLS with the cluster's gateway-made
        certificate, through the gateway's proxy), like the user's client."""
        import asyncio

        def register() -> None:
            client = cls.make_client(info, set_as_default=False)
            try:
                client.register_plugin(plugin)
            finally:
                client.close()

        await asyncio.to_thread(register)

    @classmethod
    def make_client(cls, info: ConnectInfo, **kwargs: Any) -> Client:
        from dask_gateway import GatewayCluster

        # deferred: start-up (core.settings ~18 ms, loads traitlets, jupyter_core)
        from ..core.settings import default_settings

        x = info.extra or {}
        address = x["gateway_address"]
        store = Store(default_settings().state_dir)
        cluster = GatewayCluster.from_name(
            x["gateway_cluster"], shutdown_on_close=False, address=address,
            proxy_address=x.get("proxy_address"), public_address=x.get("public_address"),
            auth=make_auth(x.get("auth"), address, store))
        client = cluster.get_client(set_as_default=kwargs.pop("set_as_default", True))
        client._cloudtik_gateway_cluster = cluster  # alive as long as the client
        return client

    def node_failure_hint(self, node_id: str) -> str:
        report = self._report(node_id)
        return f"gateway status {report.status.name}" if report else "not known to the gateway"
