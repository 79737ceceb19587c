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
        problems = self.details.get("problems")
        if problems and len(problems) > 1:
            out["problems"] = [{"field": p["field"], "message": p["message"]}
                               for p in problems]
        return out


class ConfigError(CloudTikError):
    """Bad configuration or input; ``field`` is the dotted path of the bad value.

    A config with several faults raises one ConfigError naming all of them (``problems``,
    each ``{"field", "message"}``; ``field`` is the first), so a user fixes a file in one
    round instead of one fault per attempt."""

    http_status = 400
    reason = "invalid"

    @classmethod
    def combine(cls, errors: list[ConfigError]) -> ConfigError:
        """One error for several: every problem listed, the first one's field."""
        problems: list[dict[str, Any]] = []
        for e in errors:
            problems += e.details.get("problems") or [
                {"field": e.field, "message": e.message, "value": e.details.get("value")}]
        if len(problems) == 1:
            return errors[0]
        lines = "; ".join(p["message"] for p in problems)
        return cls(f"{len(problems)} problems in the config: {lines}",
                   field=problems[0]["field"], value=problems[0].get("value"),
                   problems=problems)


class ConfigProblems:
    """Collects ConfigErrors of independent checks, then raises them together.

    ``with problems.check(): ...`` runs one check; a ConfigError it raises is kept and the
    next check runs. ``problems.raise_any()`` raises them combined."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def check(self) -> _Collect:
        return _Collect(self)

    def raise_any(self) -> None:
        if self.errors:
            raise ConfigError.combine(self.errors)


class _Collect:
    def __init__(self, owner: ConfigProblems) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and isinstance(exc, ConfigError):
            self.owner.errors.append(exc)
            return True
        return False


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


#: what a command reports as the user's mistake (exit 2), not the system's (exit 1)
USER_ERRORS = (ConfigError, NotFoundError, ConflictError, CapacityError)


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


class BackendUnavailable(ProviderError):
    """The backend could not be reached (network, daemon down, 5xx): try again later.

    Distinct from other ``ProviderError``s, which mean the backend answered "no".
    """

    reason = "backend_unavailable"


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
