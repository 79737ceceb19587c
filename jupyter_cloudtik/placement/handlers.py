"""REST endpoints of placement, as tornado handlers.

* ``POST /cloudtik/api/zones/select``   estimate (nothing is created), sealed options
* ``POST /cloudtik/api/zones/boot``     place where the hints say; returns a reservation id
* ``POST /cloudtik/api/zones/release``  give a reservation made by ``boot`` back
* ``GET  /cloudtik/api/reservations/{id}``  a reservation and its instances
* ``GET  /cloudtik/api/servers?reservation_id=ID``  the nodes booted under a reservation
  and their states, across zones (the seed's ``GET /servers?reservation_id=``)

The handlers only translate: parse JSON, call ``ZoneService`` / ``Reservations``, write
JSON; errors become ``{"message", "reason", "field"}`` with the error's HTTP status.  The
same mixin serves two hosts:

* ``make_app(service, tokens)``: a standalone tornado application that checks
  ``Authorization: token <t>`` against the accepted tokens (``python -m
  jupyter_cloudtik.placement.server``; the tests run three of them on loopback);
* ``jupyter_cloudtik.server.placement_handlers``: the same endpoints in the Jupyter server
  extension (Jupyter's auth and the ``cloudtik`` permission, bodies checked against
  ``openapi.yaml``), sharing ``ZoneService`` and ``reservation_view``.
"""

from __future__ import annotations

import json
from typing import Any

from tornado import web

from ..core import jsontext
from ..core.errors import CloudTikError, ConfigError
from .zones import API, SERVERS_API, ZoneService, same_token

RESERVATIONS_API = "/cloudtik/api/reservations"
ACTIONS = ("select", "boot", "release")


class PlacementAPIMixin:
    """The endpoints' logic, independent of how the host authenticates."""

    service: ZoneService

    def _body(self) -> Any:
        return jsontext.loads(self.request.body or b"{}", "body")

    def _send(self, status: int, data: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))

    def _fail(self, err: CloudTikError) -> None:
        self._send(err.http_status, {"message": err.message, "reason": err.reason,
                                     "field": err.field})

    async def _zone_action(self, action: str) -> None:
        if action not in ACTIONS:
            self._send(404, {"message": f"no zone action '{action}' (actions: "
                                        f"{', '.join(ACTIONS)})", "reason": "not_found",
                             "field": None})
            return
        try:
            body = self._body()
            out = await getattr(self.service, action)(body)
        except CloudTikError as e:
            self._fail(e)
            return
        self._send(200, out)

    def _reservation(self, rid: str) -> None:
        try:
            res = self.service.reservations.get(rid)
        except CloudTikError as e:
            self._fail(e)
            return
        self._send(200, reservation_view(res))

    async def _servers(self) -> None:
        try:
            out = await self.service.servers(self.get_query_argument("reservation_id", ""))
        except CloudTikError as e:
            self._fail(e)
            return
        self._send(200, out)


def reservation_view(res) -> dict[str, Any]:
    """A reservation as the API shows it.  One made by ``boot`` (for a parent zone) shows
    counts and prices only: a parent never learns this zone's offers."""
    data = res.to_dict()
    if res.source == "zone":
        data["claims"] = [c.public() for c in res.claims]
        data["remote"] = [{"count": r["count"], "price_per_hour": r["price_per_hour"],
                           "state": r["state"]} for r in res.remote]
        data["explanation"] = []
    return data


class _TokenAuth(web.RequestHandler):
    """Bearer-token auth of the standalone server: ``Authorization: token <t>``."""

    def initialize(self, service: ZoneService, tokens: list[str]) -> None:
        self.service = service
        self.tokens = tokens

    def prepare(self) -> None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not same_token(given.strip(),
                                                                       self.tokens):
            self.set_status(401)
            self.set_header("Content-Type", "application/json")
            self.set_header("WWW-Authenticate", "token")
            self.finish(json.dumps({"message": "authentication required: send "
                                               "'Authorization: token <token>'",
                                    "reason": "unauthorized", "field": None}))

    def check_xsrf_cookie(self) -> None:  # token-authenticated API, no cookies
        return None


class ZoneActionHandler(PlacementAPIMixin, _TokenAuth):
    async def post(self, action: str) -> None:
        await self._zone_action(action)


class ReservationHandler(PlacementAPIMixin, _TokenAuth):
    def get(self, rid: str) -> None:
        self._reservation(rid)


class ServersHandler(PlacementAPIMixin, _TokenAuth):
    async def get(self) -> None:
        await self._servers()


def handlers(service: ZoneService, tokens: list[str], base: str = "") -> list[tuple]:
    kw = {"service": service, "tokens": tokens}
    return [
        (rf"{base}{API}/([a-z]+)", ZoneActionHandler, kw),
        (rf"{base}{RESERVATIONS_API}/([0-9a-f]+)", ReservationHandler, kw),
        (rf"{base}{SERVERS_API}", ServersHandler, kw),
    ]


def make_app(service: ZoneService, tokens: list[str]) -> web.Application:
    """A standalone application serving the placement endpoints (token auth)."""
    if not [t for t in tokens if t]:
        raise ConfigError("tokens: the zone server needs at least one token "
                          "($CLOUDTIK_ZONE_TOKEN)", field="tokens")
    return web.Application(handlers(service, tokens))
