"""Kept for compatibility: forwarding lives in ``jupyter_cloudtik.api.forward``."""

from ..api.forward import NOT_FORWARDED, NOT_RETURNED, forward, request_headers  # noqa: F401
