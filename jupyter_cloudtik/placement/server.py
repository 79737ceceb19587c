"""A standalone zone server: ``python -m jupyter_cloudtik.placement.server``.

Serves select / boot / release and reservations of the zone whose state folder is
``$CLOUDTIK_STATE_DIR`` (its child zones are those added there with ``jupyter cloudtik
zone add``).  Accepted tokens come from ``$CLOUDTIK_ZONE_TOKEN`` (comma-separated), never
from the command line, where other users could read them.  With ``--port 0`` it picks a
free port; the first line on stdout is ``listening on http://HOST:PORT``.

Under Jupyter, the server extension mounts the same handlers instead (Jupyter's auth).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from ..core import env
from ..core.errors import CloudTikError
from ..core.store import Store
from .settings import Placement

TOKEN_ENV = env.ZONE_TOKEN


def main(argv: list[str] | None = None) -> int:
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    # deferred: start-up (core.settings ~6 ms, loads jupyter_core, platformdirs; placement.handlers
    #   ~50 ms, loads cryptography, jupyter_core; placement.zones ~22 ms, loads cryptography,
    #   jupyter_core)
    from ..core.settings import default_settings
    from .handlers import make_app
    from .zones import ZoneService

    ap = argparse.ArgumentParser(prog="python -m jupyter_cloudtik.placement.server",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--zone-name", help="this zone's name (default: c.Placement.zone_name)")
    ap.add_argument("--catalog", help="JSON file of offers this zone places on")
    ap.add_argument("--providers", help="comma-separated providers whose offers count "
                                        "(default: c.Placement.zone_providers; '' for none)")
    args = ap.parse_args(argv)

    settings = default_settings()
    placement = Placement(parent=settings)
    if args.zone_name:
        placement.zone_name = args.zone_name
    if args.catalog:
        placement.offer_catalog = args.catalog
    if args.providers is not None:
        placement.zone_providers = [p for p in args.providers.split(",") if p]
    tokens = [t for t in os.environ.get(TOKEN_ENV, "").split(",") if t]
    try:
        store = Store(settings.state_dir)
        service = ZoneService(store, settings, placement)
        app = make_app(service, tokens)
    except CloudTikError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2

    async def serve() -> None:
        sockets = bind_sockets(args.port, args.host)
        server = HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        print(f"listening on http://{args.host}:{port} (zone '{service.name}')", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
