"""Kept for compatibility: the routes are assembled in ``jupyter_cloudtik.api.routes``
from the features' routes (``core/features.py``, pyproject.toml)."""

from ..api.routes import (  # noqa: F401
    API_PREFIX,
    build_routes,
    lifecycle_hooks,
    route_table,
)
