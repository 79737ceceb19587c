"""The runtime interface: what runs on a cluster's nodes, and how the core talks to it.

A runtime (Dask, Spark, later Ray) is one class registered under the entry point group
``jupyter_cloudtik.runtimes``.  A cluster config names the runtimes its nodes run
(``runtime: {types: [spark]}``, or ``[dask, spark]`` for both on the same nodes); the
core finds each by name and asks it, never a runtime module directly:

* ``validate``       refuse a config early (a missing Java runtime, a bad option);
* ``node_config``    what a node of a role needs, merged into ``node_config["runtime"]``
                     (the provider hands it to the node: the local provider's node process,
                     Huawei Cloud's user data);
* ``start_local``    on a node: start the runtime's processes (children of the node);
* ``head_info``      on the core's side: how to reach the head's runtime (connect info);
* ``connected_workers`` / ``retire_workers`` / ``idle_since`` / ``observe``: health,
                     scaling and idle shutdown, asked over the runtime's own HTTP endpoints;
* ``client``         where the user is: a connected client (a Dask ``Client``, a
                     ``SparkSession``).

Node-runtime contributions that are not a runtime (storage mounts) come from the
features' ``node_runtime`` parts (``core/features.py``): every runtime's processes see them.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..core import plugins

if TYPE_CHECKING:
    from ..core.models import ConnectInfo
    from ..providers.base import NodeProvider

RUNTIMES = "jupyter_cloudtik.runtimes"
DEFAULT_RUNTIMES = ("dask",)
HTTP_TIMEOUT = 3.0


class RuntimeUnreachable(Exception):
    """The runtime's head (scheduler, master) did not answer."""


def http_json(url: str, body: dict[str, Any] | None = None,
              timeout: float = HTTP_TIMEOUT,
              unreachable: type[RuntimeUnreachable] = RuntimeUnreachable,
              context: ssl.SSLContext | None = None) -> Any:
    """GET (or POST ``body``) a JSON endpoint; 404 is ``LookupError``, anything else
    unreachable is ``unreachable`` (a runtime passes its own subclass, so its callers can
    tell whose head did not answer).  ``context``: an HTTPS endpoint's TLS (a cluster's
    client certificate, for a head's mutual-TLS relay)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if data:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise LookupError(url) from e
        raise unreachable(f"{url}: HTTP {e.code}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise unreachable(f"{url}: {e}") from e


class Runtime:
    """One runtime; stateless, so the core makes one whenever it needs to ask."""

    #: short name (the entry point name), as written in ``runtime.types``
    name: ClassVar[str] = ""
    #: what the user calls to get a client (``client`` for Dask, ``spark`` for Spark)
    client_method: ClassVar[str] = "client"

    # config ------------------------------------------------------------------------------
    def validate(self, cfg: dict[str, Any]) -> None:
        """Refuse a config before anything starts (``ConfigError`` naming the field)."""

    def node_config(self, cfg: dict[str, Any], role: str,
                    info: ConnectInfo | None) -> dict[str, Any]:
        """What a node of ``role`` needs, under ``node_config["runtime"][self.name]``.

        ``info`` is the head's connect info for workers (None for the head)."""
        return dict((cfg.get("runtime") or {}).get(self.name) or {})

    # on a node --------------------------------------------------------------------------
    def start_local(self, spec: dict[str, Any]
                    ) -> subprocess.Popen | list[subprocess.Popen] | None:
        """Start this runtime's processes on a node (children of the node process, in its
        process group, so stopping the node stops them); returns the process(es) to wait
        for (the node ends when one of them ends), or None when the runtime runs inside
        the node process itself (Dask)."""
        return None

    # from the core ----------------------------------------------------------------------
    def head_info(self, node_dir: Path, host: str) -> dict[str, Any] | None:
        """What the head's node folder says about this runtime once it is up, or None."""
        path = node_dir / f"runtime-{self.name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    async def connected_workers(self, info: ConnectInfo, prov: NodeProvider,
                                node_ids: list[str]) -> dict[str, str]:
        """{node id: runtime address} of the worker nodes that have joined the head."""
        raise NotImplementedError

    async def retire_workers(self, info: ConnectInfo, addresses: list[str]) -> None:
        """Let these workers leave gracefully before their nodes are stopped."""

    async def idle_since(self, info: ConnectInfo) -> float | None:
        """Since when the runtime has had nothing to do (epoch seconds), None if busy;
        ``LookupError`` when it cannot tell."""
        raise LookupError(f"the {self.name} runtime does not report idleness")

    async def observe(self, info: ConnectInfo) -> dict[str, Any]:
        """The runtime's own view of the cluster for status (workers, cores, apps)."""
        return {}

    def client(self, info: ConnectInfo, **kwargs: Any) -> Any:
        raise NotImplementedError

    # after the cluster ------------------------------------------------------------------
    def release_local(self, state_dir: str | os.PathLike[str], cluster: str) -> None:
        """The cluster's last node on this machine is gone (the local provider's
        ``cleanup``): release what this runtime's nodes can leave behind on the machine,
        so the provider needs to know no runtime's leftovers.  Nothing by default."""


def with_runtime(config: dict[str, Any] | None,
                 runtime: str | list[str] | None, *,
                 sync_env: bool = False) -> dict[str, Any] | None:
    """``config`` with ``runtime.types`` set from a short form: "spark", "dask,spark" or a
    list (``--runtime`` of the magics and the CLI, ``Cluster.up(runtime=...)``), and
    ``runtime.sync_env`` set by ``--sync-env`` / ``Cluster.up(sync_env=True)``."""
    if runtime is None and not sync_env:
        return config
    out = dict(config or {})
    rt = dict(out.get("runtime") or {})
    if runtime is not None:
        types = runtime.split(",") if isinstance(runtime, str) else list(runtime)
        rt["types"] = [str(t).strip() for t in types if str(t).strip()]
    if sync_env:
        rt["sync_env"] = True
    out["runtime"] = rt
    return out


def runtime_class(name: str, field: str = "runtime.types") -> type[Runtime]:
    return plugins.load(RUNTIMES, name, field=field, what="runtime")


def installed() -> list[str]:
    return plugins.installed(RUNTIMES)


def types_of(cfg: dict[str, Any]) -> list[str]:
    return list((cfg.get("runtime") or {}).get("types") or DEFAULT_RUNTIMES)


def runtimes_of(cfg: dict[str, Any]) -> list[Runtime]:
    return [runtime_class(t)() for t in types_of(cfg)]


def check_types(types: list[str]) -> None:
    """Every named runtime is installed; the error lists the installed ones."""
    # deferred: start-up (core.config ~12 ms, loads yaml)
    from ..core.config import check_runtime_types

    check_runtime_types(types)


async def connected_workers(cfg: dict[str, Any], info: ConnectInfo, prov: NodeProvider,
                            node_ids: list[str]) -> dict[str, str]:
    """Workers that have joined every runtime of the cluster (the first runtime's
    addresses); a worker node counts once each of its runtimes has it."""
    out: dict[str, str] | None = None
    for rt in runtimes_of(cfg):
        seen = await rt.connected_workers(info, prov, node_ids)
        out = seen if out is None else {n: a for n, a in out.items() if n in seen}
    return out or {}


async def observe(cfg: dict[str, Any], info: ConnectInfo) -> dict[str, Any]:
    """{runtime name: its own view} for the runtimes that offer one (status)."""
    out: dict[str, Any] = {}
    for rt in runtimes_of(cfg):
        try:
            view = await rt.observe(info)
        except (RuntimeUnreachable, LookupError) as e:
            view = {"error": str(e)}
        if view:
            out[rt.name] = view
    return out


async def idle_since(cfg: dict[str, Any], info: ConnectInfo) -> float | None:
    """Since when every runtime of the cluster has been idle (the latest), None if one is
    busy; ``LookupError`` when one cannot tell."""
    latest = 0.0
    for rt in runtimes_of(cfg):
        since = await rt.idle_since(info)
        if since is None:
            return None
        latest = max(latest, since)
    return latest
