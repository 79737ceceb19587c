"""Placement: where the nodes of a cluster go.

Filter (absolute), weigh (relative, normalised, lower cost wins), place all N instances of
a request at once against virtually depleted capacity, hold the result as claims under a
reservation id, and ask nested zones over HTTP with hints sealed by each zone's own key.
See docs/placement.md.
"""

from ..offers import Choice, Explanation, Offer, Plan, Pool, Request, VirtualState
from .engine import Engine, PlacementError, naive_place
from .filters import Filter
from .weighers import Weigher

__all__ = [
    "Choice", "Engine", "Explanation", "Filter", "Offer", "Placement", "PlacementError",
    "Plan", "Pool", "Request", "VirtualState", "Weigher", "naive_place",
]

from .settings import Placement
