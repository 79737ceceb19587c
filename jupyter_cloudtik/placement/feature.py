"""Placement's faces: ``jupyter cloudtik zones|reservations``, its REST routes, its tables."""

from ..core.features import Feature

FEATURE = Feature(
    "placement",
    cli=("jupyter_cloudtik.placement.cli",),
    routes=("jupyter_cloudtik.server.placement_handlers",),
    migrations=(("placement", "jupyter_cloudtik.placement.reservations:MIGRATIONS"),),
)
