"""Placement routes of the server extension: zones (select, boot, release) and reservations.

The same endpoints as the standalone zone server (``jupyter_cloudtik.placement.handlers``),
here behind Jupyter's authentication and the ``cloudtik`` permission: a parent zone calls
this server with a token of this server.  Bodies are checked against ``openapi.yaml``.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from ..placement.handlers import reservation_view
from ..placement.settings import Placement
from ..placement.zones import ZoneService

RESERVATION_ID = r"(?P<reservation_id>[^/]+)"


def _service(ctx) -> ZoneService:
    return ZoneService(ctx.store, ctx.settings, Placement(parent=ctx.settings))


class _ZoneHandler(CloudTikHandler):
    @property
    def zones(self) -> ZoneService:
        return self.ctx.feature("placement", _service)


class ZoneSelectHandler(_ZoneHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Estimate where a request would go; options carry sealed hints."""
        self.write_json(await self.zones.select(self.json_body("ZoneSelect")))


class ZoneBootHandler(_ZoneHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Reserve exactly where the hints (from select) say; all parts or none."""
        self.write_json(await self.zones.boot(self.json_body("ZoneBoot")))


class ZoneReleaseHandler(_ZoneHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Give back a reservation made by boot (and its parts in child zones)."""
        self.write_json(await self.zones.release(self.json_body("ZoneRelease")))


class ReservationHandler(_ZoneHandler):
    @web.authenticated
    @authorized
    async def get(self, reservation_id: str) -> None:
        """A reservation and its instances (claims: offer, state, node, price)."""
        self.write_json(reservation_view(self.zones.reservations.get(reservation_id)))


class ServersHandler(_ZoneHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The nodes booted under a reservation and their states, across zones."""
        self.write_json(await self.zones.servers(self.get_query_argument("reservation_id",
                                                                         "")))


ROUTES = [
    (r"/zones/select", ZoneSelectHandler),
    (r"/zones/boot", ZoneBootHandler),
    (r"/zones/release", ZoneReleaseHandler),
    (rf"/reservations/{RESERVATION_ID}", ReservationHandler),
    (r"/servers", ServersHandler),
]
