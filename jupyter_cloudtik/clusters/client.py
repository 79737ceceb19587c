"""How the faces reach the core: a backend with the same calls in every setting.

``CoreBackend`` runs the async core in this process on the process's one loop thread
(``core.bridge``), so it works the same from a kernel, whose main thread already runs a
loop, and from the CLI.  A
backend that talks to a Jupyter server's REST API offers the same methods; ``get_backend``
picks one from the environment, so magics, widgets and the ``Cluster`` API never care.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol

from ..core import env
from ..core.bridge import LoopThread, bridge, choose_client
from ..core.errors import ConflictError
from ..core.models import ClusterInfo, ConnectInfo
from ..core.operations import Event, OperationInfo, StartedOperation, Target

API_URL_ENV = env.API_URL
__all__ = ["API_URL_ENV", "Backend", "CoreBackend", "LoopThread", "get_backend",
           "resolve_name"]


class Backend(Protocol):
    """What every face may ask; implemented in process and over REST."""

    kind: str

    def start_up(self, config: dict[str, Any] | None, *, name: str | None,
                 workers: int | None, provider: str | None) -> str: ...
    def start_down(self, name: str) -> str: ...
    def start_scale(self, name: str, workers: int, node_type: str | None) -> str: ...
    def operation(self, op_id: str) -> OperationInfo: ...
    def events(self, op_id: str, after: int = 0) -> Iterator[Event]: ...
    def wait(self, op_id: str) -> Any: ...
    def cancel(self, op_id: str) -> OperationInfo: ...
    def operations(self, cluster: str | None = None) -> list[OperationInfo]: ...
    def status(self, name: str) -> ClusterInfo: ...
    def get(self, name: str) -> ClusterInfo: ...
    def list(self, include_stopped: bool = False) -> list[ClusterInfo]: ...
    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]: ...
    def connect_info(self, name: str) -> tuple[str, ConnectInfo]: ...
    def providers(self) -> list[dict[str, Any]]: ...


def links_through_server(manager: Any) -> bool:
    """In a terminal of a Jupyter server that serves this state folder's dashboards
    (``CLOUDTIK_SERVER_LINKS``, server/extension.py), show them through that server as
    its magics and panel do: ``JUPYTER_SERVER_URL``'s origin (the hub's public URL on
    JupyterHub, whose single-user server's own address a browser cannot open) and the
    server's path.  Returns whether it applies."""
    import json
    from urllib.parse import urlsplit

    try:
        spec = json.loads(os.environ.get(env.SERVER_LINKS) or "null")
        paths = str(spec["dashboard"]), str(spec["spark"])
        same = os.path.realpath(spec["state_dir"]) == os.path.realpath(
            manager.settings.state_dir)
    except (ValueError, TypeError, KeyError):
        return False
    if not same:
        return False
    origin = ""
    for var in ("JUPYTERHUB_PUBLIC_URL", env.JUPYTER_SERVER_URL):
        parts = urlsplit(os.environ.get(var) or "")
        if parts.scheme in ("http", "https") and parts.netloc:
            origin = f"{parts.scheme}://{parts.netloc}"
            break
        if var == "JUPYTERHUB_PUBLIC_URL" and os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):
            break  # on a hub without a public URL: the path, on the hub's address
    manager.dashboard_prefix, manager.spark_ui_prefix = (origin + p for p in paths)
    return True


class CoreBackend:
    """The core in this process."""

    kind = "core"

    def __init__(self, settings=None, manager=None) -> None:
        # deferred: start-up (clusters.manager ~60 ms, loads yaml, importlib.metadata)
        from .manager import ClusterManager

        self.runner = bridge()  # the process's one loop thread
        if manager is None:
            manager = ClusterManager(settings=settings)
            links_through_server(manager)
        self.manager = manager

    def _start(self, coro) -> StartedOperation:
        return StartedOperation(self.runner.run(coro).info)

    def start_up(self, config=None, *, name=None, workers=None, provider=None) -> str:
        op_id = self._start(self.manager.start_up(
            config, name=name, workers=workers, provider=provider))
        self._maybe_start_reaper(op_id)
        return op_id

    def start_down(self, name: str) -> str:
        return self._start(self.manager.start_down(name))

    def start_scale(self, name: str, workers: int, node_type: str | None = None) -> str:
        return self._start(self.manager.start_scale(name, workers, node_type))

    def operation(self, op_id: str) -> OperationInfo:
        return self.manager.ops.get(op_id)

    def events(self, op_id: str, after: int = 0) -> Iterator[Event]:
        """Events of an operation as they happen, until it is final (blocking iterator)."""
        return self.runner.iterate(lambda: self.manager.ops.watch(op_id, after=after))

    def wait(self, op_id: str) -> Any:
        if getattr(self, "_workspaces", None) is not None and self._workspaces.runner.runs(op_id):
            return self.runner.run(self._workspaces.wait(op_id))
        return self.runner.run(self.manager.wait(op_id))

    def cancel(self, op_id: str) -> OperationInfo:
        return self.runner.run(self.manager.cancel(op_id))

    def operations(self, cluster: str | None = None, limit: int = 50) -> list[OperationInfo]:
        return self.manager.ops.list(
            target=str(Target("cluster", cluster)) if cluster else None, limit=limit)

    def status(self, name: str) -> ClusterInfo:
        return self.runner.run(self.manager.status(name))

    def get(self, name: str) -> ClusterInfo:
        return self.manager.get(name)

    def list(self, include_stopped: bool = False) -> list[ClusterInfo]:
        return self.manager.list(include_stopped=include_stopped)

    def logs(self, name: str, node_id: str | None = None, tail: int = 200) -> dict[str, str]:
        return self.manager.logs(name, node_id, tail)

    def connect_info(self, name: str) -> tuple[str, ConnectInfo]:
        return self.manager.connect_info(name)

    def adapt(self, name: str, minimum: Any, maximum: Any, interval: Any = None,
              wait_count: Any = None) -> dict[str, Any]:
        """Record the bounds; the loop runs where the clusters live, not here: a Jupyter
        server on this state folder if one runs, else the reaper daemon (started now), so
        it keeps going after this process (a CLI, a plain IPython) exits."""
        # deferred: start-up (clusters.adaptive ~29 ms, loads urllib.request, yaml; clusters.reaper
        #   ~61 ms, loads yaml, urllib.request)
        from . import adaptive
        from .reaper import ensure_reaper, reaper_running

        adaptive.validate(self.manager, name, minimum, maximum, interval, wait_count)
        settings = self.manager.settings
        if not settings.start_reaper and adaptive.lease_holder(self.manager.store) is None \
                and not reaper_running(settings.state_dir):
            raise ConflictError(
                "adaptive scaling runs in a Jupyter server or the reaper daemon, so that "
                "it outlives this process; neither runs for this state folder and "
                "c.CloudTik.start_reaper is False: start a Jupyter server, or turn "
                "start_reaper on", field="name", value=name)
        spec = adaptive.adapt(self.manager, name, minimum, maximum, interval, wait_count)
        ensure_reaper(settings, self.manager.store)
        return spec.to_dict()

    def usage(self, name: str) -> dict[str, Any]:
        # deferred: start-up (clusters.usage ~12 ms, loads urllib.request, http.client)
        from . import usage

        usage.sample(self.manager)
        return usage.usage(self.manager, name)

    def adapt_off(self, name: str) -> None:
        # deferred: start-up (clusters.adaptive ~29 ms, loads urllib.request, yaml)
        from . import adaptive

        adaptive.adapt_off(self.manager, name)

    def providers(self) -> list[dict[str, Any]]:
        return self.manager.providers()

    # workspaces (same store, same operations and events) -------------------------------
    @property
    def workspaces(self):
        if getattr(self, "_workspaces", None) is None:
            # deferred: start-up (core.features ~28 ms, loads importlib.metadata)
            from ..core.features import feature_service

            self._workspaces = feature_service("workspace_manager")(settings=self.manager.settings,
                                                store=self.manager.store,
                                                user=self.manager.user)
        return self._workspaces

    def start_workspace_create(self, name: str, config: dict[str, Any] | None = None,
                               provider: str | None = None) -> str:
        return self._start(self.workspaces.start_create(name, config, provider))

    def start_workspace_delete(self, name: str, delete_storage: bool = True) -> str:
        return self._start(self.workspaces.start_delete(name, delete_storage))

    def workspace_get(self, name: str):
        return self.workspaces.get(name)

    def workspace_list(self, include_deleted: bool = False):
        return self.workspaces.list(include_deleted)

    def workspace_status(self, name: str) -> dict[str, Any]:
        return self.runner.run(self.workspaces.status(name))

    def _maybe_start_reaper(self, op_id: str) -> None:
        # deferred: start-up (clusters.reaper ~59 ms, loads yaml, urllib.request)
        from .reaper import ensure_reaper

        try:
            ensure_reaper(self.manager.settings, self.manager.store)
        except Exception as e:  # the cluster still works; only idle shutdown is missing
            self.manager.ops.emit(op_id, "reaper", f"idle reaper not started: {e}",
                                  level="warning")


def get_backend(settings=None) -> Backend:
    """The backend for this process: the server's REST API inside a Jupyter server kernel
    (``CLOUDTIK_API_URL`` set), else the core in process.  Cached per state folder."""

    def rest() -> Backend:
        # deferred: start-up (clusters.rest ~58 ms, loads requests, urllib3)
        from .rest import RestBackend

        return RestBackend.from_environment()

    return choose_client("clusters", rest, lambda s: CoreBackend(settings=s), settings)


def resolve_name(backend: Backend, name: str | None) -> str:
    """The cluster a command means when no name was given: the only running one."""
    if name:
        return name
    clusters = backend.list()
    if len(clusters) == 1:
        return clusters[0].name
    if not clusters:
        raise ConflictError("there are no clusters; start one with `up`", field="name")
    raise ConflictError(
        f"there are {len(clusters)} clusters ({', '.join(c.name for c in clusters)}); "
        "say which one", field="name")
