"""Kept for compatibility: event streams live in ``jupyter_cloudtik.api.sse``."""

from ..api.sse import format_event, stream_events  # noqa: F401
