"""Kept for compatibility: the base handler lives in the shared API layer
(``jupyter_cloudtik.api.base``), which the hub's sidekick uses too."""

from ..api.base import (  # noqa: F401
    AUTH_RESOURCE,
    CloudTikHandler,
    NotFoundHandler,
    _kernel_user,
    _KernelAuthorizer,
    _KernelIdentity,
)
