"""Placement settings (``c.Placement.*`` in ``jupyter_cloudtik_config.py`` or the server's
config), created with ``parent=`` the core ``CloudTik`` settings like every feature."""

from __future__ import annotations

import os
import socket

from traitlets import Dict, Float, Int, List, Type, Unicode, default
from traitlets.config import Configurable

from ..core import env

ZONE_KEY_ENV = env.ZONE_KEY


class Placement(Configurable):
    """How nodes are placed: filters, weighers, reservations, zones."""

    default_filters = List(
        Unicode(),
        default_value=["availability_zone", "capabilities", "max_price", "json"],
        help="Filters applied when a request names none.  'resources', 'quota' and "
             "'excluded' (offers that just refused a node) are always applied: capacity "
             "is never optional.  Each filter only acts when the request asks for it "
             "(e.g. 'max_price' needs a max_price).",
    ).tag(config=True)

    weighers = Dict(
        default_value={"cost": 1.0, "spread": 1.0, "pack": 1.0, "spot": 1.0,
                       "anti_affinity": 0.5, "recent_failures": 2.0},
        help="Weigher multipliers (a request may override them; 0 switches one off).  "
             "'spread' and 'pack' act only for the request's strategy, 'spot' only when "
             "the request prefers spot.",
    ).tag(config=True)

    reservation_ttl = Float(
        900.0, help="Seconds a reservation holds its claims when no node is created for it."
    ).tag(config=True)

    failure_window = Float(
        900.0, help="Seconds a refused placement counts against its offer "
                    "(the recent_failures weigher)."
    ).tag(config=True)

    max_failover = Int(
        3, help="How many other offers a node is retried on when the cloud refuses it."
    ).tag(config=True)

    alternates = Int(3, help="Alternate offers recorded per placed instance.").tag(config=True)

    zone_name = Unicode(
        help="Name of this zone (what a parent calls it).  Default: the host name."
    ).tag(config=True)

    zone_key = Unicode(
        help=f"Fernet key(s) that seal this zone's hints, newest first, comma-separated. "
             f"Default: ${ZONE_KEY_ENV}, else <state_dir>/zone.key (created 0600).  Each zone "
             f"must have its own key.",
    ).tag(config=True)

    hint_ttl = Float(
        300.0, help="Seconds a sealed hint stays valid after `select` issued it."
    ).tag(config=True)

    zone_timeout = Float(
        3.0, help="Seconds to wait for a child zone's answer before skipping it."
    ).tag(config=True)

    boot_timeout = Float(
        120.0, help="Seconds to wait for a child zone to boot: it creates the nodes before "
                    "it answers, which takes longer than an estimate."
    ).tag(config=True)

    zone_nodes_class = Type(
        default_value="jupyter_cloudtik.clusters.zone_nodes.ZoneNodes", klass=object,
        help="What creates, lists and ends the nodes of a reservation booted in this zone "
             "(called with the store and the CloudTik settings).",
    ).tag(config=True)

    zone_retry = Float(
        30.0, help="Seconds a child zone that did not answer is skipped (doubles with each "
                   "further failure, up to 10 minutes)."
    ).tag(config=True)

    zone_options = Int(
        8, help="Most options a zone returns from `select` (its best offers)."
    ).tag(config=True)

    offer_catalog = Unicode(
        "", help="JSON file with extra offers (and pools) this zone can place on: "
                 '{"offers": [...], "pools": [...]}.  Used for dry runs and tests, and for '
                 "sites whose capacity is known but not reported by a provider."
    ).tag(config=True)

    zone_providers = List(
        Unicode(), default_value=["local"],
        help="Providers whose offers this zone answers `select` with.",
    ).tag(config=True)

    @default("zone_name")
    def _default_zone_name(self) -> str:
        return os.environ.get(env.ZONE_NAME) or socket.gethostname()
