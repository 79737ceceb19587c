"""Errors meant to be read by people.

Every face (magics, CLI, REST, hub service) turns a :class:`CloudTikError` into a message
for the user, never a traceback.  The REST layer maps ``http_status`` and ``reason``
straight into its JSON error body ``{"message", "reason", "field"}``, so the attributes
here are part of the public API.
"""

from __future__ import annotations

from typing import Any


class CloudTikError(Exception):
    """Base class: an error whose message is fit to show to a user as is."""

    http_status = 500
    reason = "error"

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "reason": self.reason}
        out["field"] = self.field
        return out


class ConfigError(CloudTikError):
    """Bad configuration or input; ``field`` is the dotted path of the bad value."""

    http_status = 400
    reason = "invalid"


class NotFoundError(CloudTikError):
    http_status = 404
    reason = "not_found"


class ConflictError(CloudTikError):
    """The request contradicts the recorded state (e.g. same name, other config)."""

    http_status = 409
    reason = "conflict"


class CapacityError(CloudTikError):
    """More resources were asked for than the provider can give; nothing was started."""

    http_status = 409
    reason = "capacity"


class PermissionDeniedError(CloudTikError):
    http_status = 403
    reason = "forbidden"


class OperationCancelled(CloudTikError):
    http_status = 409
    reason = "cancelled"


class ProviderError(CloudTikError):
    """A provider (cloud API, local processes) failed; the message names what failed."""

    http_status = 502
    reason = "provider_error"


class NodeLaunchError(ProviderError):
    """A node could not be created: capacity or quota at the provider, or a failed start."""

    reason = "node_launch_failed"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code


class OperationTimeout(CloudTikError):
    http_status = 504
    reason = "timeout"


_BY_REASON: dict[str, type[CloudTikError]] = {
    cls.reason: cls
    for cls in (
        ConfigError, NotFoundError, ConflictError, CapacityError, PermissionDeniedError,
        OperationCancelled, ProviderError, NodeLaunchError, OperationTimeout,
    )
}


def error_from_dict(data: dict[str, Any]) -> CloudTikError:
    """Rebuild an error that crossed a process or HTTP boundary as ``to_dict()``."""
    cls = _BY_REASON.get(str(data.get("reason")), CloudTikError)
    return cls(str(data.get("message") or "unknown error"), field=data.get("field"))
