"""REST for adaptive scaling: ``clusters/{name}/adapt`` (GET the bounds, PUT them, DELETE to
turn it off).  The loop runs in this server (or the hub sidekick) on its event loop, so it
keeps going when the kernel that asked for it is gone (``clusters/adaptive.py``).  It starts
with the host (bounds recorded before a restart are followed again at once, with no
request) and holds the store's adaptive lease; when the host stops it hands the lease
back and makes sure the reaper daemon runs, which goes on adapting with no server."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from . import adaptive, usage

NAME = r"(?P<name>[^/]+)"


def runner(root_ctx: Any) -> adaptive.AdaptiveRunner:
    """The one runner of this process, following every adaptive cluster of its store."""
    r = getattr(root_ctx, "_adaptive_runner", None)
    if r is None:
        r = root_ctx._adaptive_runner = adaptive.AdaptiveRunner(
            root_ctx.manager, lease=adaptive.Lease(root_ctx.manager.store, "server"))
    r.start()
    u = getattr(root_ctx, "_usage_recorder", None)
    if u is None:
        u = root_ctx._usage_recorder = usage.UsageRecorder(root_ctx.manager)
    u.start()
    return r


class ClusterUsageHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        """Cost so far, cost per hour and the size/price samples of the cluster's life."""
        runner(self.settings["cloudtik"])
        self.write_json(usage.usage(self.manager, name))


class ClusterAdaptHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        spec = adaptive.adaptive_of(self.manager, name)
        self.write_json({"cluster": name, "adaptive": spec.to_dict() if spec else None})

    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        """Adapt between ``minimum`` and ``maximum`` workers (the scheduler's own target)."""
        body = self.json_body("ClusterAdapt")
        spec = adaptive.adapt(self.manager, name, body.get("minimum"), body.get("maximum"),
                              body.get("interval"), body.get("wait_count"))
        runner(self.settings["cloudtik"])
        self.write_json({"cluster": name, "adaptive": spec.to_dict()})

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        adaptive.adapt_off(self.manager, name)
        self.write_json({"cluster": name, "adaptive": None})


HOOK_HOSTS = ("server", "hub")  # both hosts own clusters, so both run the loop


def startup(ctx: Any) -> None:
    """Clusters adapted before a restart go on adapting, with no request needed."""
    runner(ctx)


def shutdown(ctx: Any) -> None:
    """Hand adaptive scaling to the reaper daemon: it keeps going with the server gone."""
    u = getattr(ctx, "_usage_recorder", None)
    if u is not None:
        u.stop()  # the reaper records usage while it holds the lease
    r = getattr(ctx, "_adaptive_runner", None)
    if r is None:
        return
    r.stop_now()
    from .reaper import ensure_reaper  # deferred: start-up (clusters.reaper ~26 ms, loads psutil)

    ensure_reaper(ctx.manager.settings, ctx.manager.store)


ROUTES: list[tuple[str, Any]] = [
    (rf"/clusters/{NAME}/adapt", ClusterAdaptHandler),
    (rf"/clusters/{NAME}/usage", ClusterUsageHandler),
]
