"""A Dask preload (``--preload``) that gives a local node its Bokeh dashboard after it is up.

Why: a scheduler builds its dashboard in its constructor and a worker before it registers,
and both import Bokeh first: about 0.5 s of CPU per process when the launcher has not
loaded Bokeh yet (the first ``up`` of a session), 0.15 s when it has.  That time sat on the
path of every ``up``: the head answered only after it, and on a 2-core laptop the workers'
own copies fought the head for the cores.  A node therefore starts with ``--no-dashboard``
and its usual ``--dashboard-address`` (the port already serves Dask's plain HTTP routes:
health, metrics, the JSON API), and this preload adds the dashboard on the same port,
importing it in a background thread at a low CPU priority: a scheduler's a moment after
its start, a worker's only when one of its pages is asked for (LocalCluster's workers
have no dashboard at all).

Until then a dashboard page is not a 404: the request asks for the dashboard at once and
waits for it (up to ``WAIT_SECONDS``), then is sent again to the same page (a relative
redirect, so it also works behind the server's proxy prefix).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import threading
from typing import Any

from tornado import web

from ...core import env

logger = logging.getLogger(__name__)

#: how long after a scheduler's start its dashboard is loaded if nobody asks for it first
#: (env ``CLOUDTIK_DASHBOARD_DELAY``, read by each node: this module is loaded by the
#: launcher, whose environment is not the node's); a worker's loads when asked for
DELAY_SECONDS = 1.0
WAIT_SECONDS = 30.0
#: the CPU niceness of the importing thread (Linux: per thread); the node's own threads
#: keep theirs, so a starting cluster is not slowed by its dashboards
IMPORT_NICENESS = 10


class _Waiting(web.RequestHandler):
    """Any page the plain routes do not serve, while the dashboard loads."""

    def initialize(self, state: dict[str, Any]) -> None:
        self.state = state

    async def get(self, *args: Any) -> None:
        self.state["start"]()
        try:
            await asyncio.wait_for(self.state["ready"].wait(), WAIT_SECONDS)
        except asyncio.TimeoutError:
            raise web.HTTPError(503, "the dashboard is still loading") from None
        path = self.request.path.rsplit("/", 1)[-1] or "./"
        query = f"?{self.request.query}" if self.request.query else ""
        self.redirect(path + query, status=307)

    head = get


def _import_quietly(name: str, loop: asyncio.AbstractEventLoop,
                    done: asyncio.Future) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IMPORT_NICENESS)
    except (OSError, AttributeError):
        pass
    try:
        result: Any = importlib.import_module(name)
        ok = True
    except BaseException as e:  # reported on the loop
        result, ok = e, False

    def deliver() -> None:
        if not done.done():
            (done.set_result if ok else done.set_exception)(result)

    try:
        loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the node stopped meanwhile
        pass


def _delay() -> float:
    raw = os.environ.get(env.DASHBOARD_DELAY)
    try:
        return DELAY_SECONDS if raw is None else max(float(raw), 0.0)
    except ValueError:
        logger.warning(env.DASHBOARD_DELAY + ": %r is not a number of seconds; the "
                       "dashboard loads after the default %.1f s", raw, DELAY_SECONDS)
        return DELAY_SECONDS


async def _attach(server: Any, module: str, state: dict[str, Any], waiting: web.Application
                  ) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    threading.Thread(target=_import_quietly, args=(module, loop, done),
                     name="cloudtik-dashboard-import", daemon=True).start()
    from distributed.http.utils import get_handlers

    app, head = server.http_application, module.endswith(".scheduler")
    try:
        dashboard = await done
    except ImportError:  # no Bokeh: say so where the dashboard would be, as Dask does
        if head:
            app.add_handlers(r".*", get_handlers(
                server, ["distributed.http.scheduler.missing_bokeh"], "/"))
    except Exception:
        logger.exception("the dashboard could not be loaded")
    else:
        dashboard.connect(app, server.http_server, server, prefix="")
        if head:  # worker pages through the scheduler's port
            try:
                app.add_handlers(r".*", get_handlers(server, ["distributed.http.proxy"], "/"))
            except Exception:
                logger.exception("the dashboard's proxy to worker pages could not be added")
    finally:
        if waiting in app.applications:
            app.applications.remove(waiting)
        state["ready"].set()


def dask_setup(server: Any) -> None:
    """Called by Dask when the scheduler or worker starts (its loop runs)."""
    from distributed.scheduler import Scheduler

    head = isinstance(server, Scheduler)
    module = "distributed.dashboard.scheduler" if head else "distributed.dashboard.worker"
    state: dict[str, Any] = {"ready": asyncio.Event(), "task": None}

    def start() -> None:
        if state["task"] is None:  # kept here: a task only the loop holds may be collected
            state["task"] = asyncio.ensure_future(_attach(server, module, state, waiting))

    state["start"] = start
    waiting = web.Application([(r"/.*", _Waiting, {"state": state})])
    server.http_application.applications.insert(0, waiting)
    if head:  # a worker's own pages are rarely opened (LocalCluster's workers have none):
        # its dashboard loads when one is asked for, never by itself
        asyncio.get_running_loop().call_later(_delay(), start)
