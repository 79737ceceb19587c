"""What every cloudtik REST handler shares: who may call, how input is read, how errors look.

* Authentication is jupyter_server's (token, cookie + XSRF for browsers), plus the kernel
  token the extension gives kernels, which is accepted here and nowhere else.  It is a
  capability, not the user's key: a kernel may use its server's clusters, jobs and
  storages (local paths inside the root, like everyone's), but what holds credentials or
  administers — adding or removing storages and workspaces, the hub's catalogue, quotas,
  audit and egress rules — answers 403 naming what is refused (:data:`KERNEL_REFUSED`).
* Authorization is jupyter_server's authorizer with ``auth_resource = "cloudtik"``.
* Errors are JSON ``{"message", "reason", "field"}``: ``CloudTikError`` keeps its status
  and reason; anything unexpected is a 500 whose body says to look at the server log and
  never carries a traceback.
* Bodies are size-checked, parsed and validated against the schemas of ``openapi.yaml``,
  so a bad request gets a 4xx that names the field.
"""

from __future__ import annotations

import json
import logging
import re
from http.client import responses
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core import jsontext
from ..core.errors import CloudTikError, ConfigError, NotFoundError, PermissionDeniedError
from . import openapi

log = logging.getLogger("jupyter_cloudtik.server")

AUTH_RESOURCE = "cloudtik"

_REASONS = {
    400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 413: "too_large",
    415: "unsupported_media_type", 500: "error", 502: "provider_error", 504: "timeout",
}


_WRITE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_ANY = frozenset({"GET", "HEAD", "OPTIONS"}) | _WRITE

# (methods, path under cloudtik/api/, what is refused): what stays with the user
KERNEL_REFUSED: list[tuple[frozenset[str], re.Pattern[str], str]] = [
    (frozenset({"POST"}), re.compile(r"storages/?$"),
     "adding a storage (it carries credentials)"),
    (frozenset({"PUT", "PATCH", "DELETE"}), re.compile(r"storages/[^/]+/?$"),
     "changing or removing a storage and its credentials"),
    (_WRITE, re.compile(r"workspaces(?:/.*)?$"),
     "creating or deleting a workspace (it carries cloud credentials)"),
    (_ANY, re.compile(r"hub/(?:catalog|quotas|audit)(?:/.*)?$"),
     "the hub's catalogue, quotas and audit log"),
    (_WRITE, re.compile(r"hub/egress/rules(?:/.*)?$"),
     "changing egress rules (they carry credentials)"),
    (_WRITE, re.compile(r"hub/egress/shares(?:/.*)?$"),
     "answering egress share offers (consent stays with the user)"),
]


def kernel_refusal(method: str, api_path: str) -> str | None:
    """What a kernel-token request of ``method`` on ``api_path`` (relative to
    ``cloudtik/api/``) may not do, or None when it may."""
    path = api_path.lstrip("/")
    for methods, pattern, what in KERNEL_REFUSED:
        if method.upper() in methods and pattern.match(path):
            return what
    return None


class _KernelIdentity:
    """The server's identity provider, except that the kernel token is a known user.

    Used only by cloudtik handlers: other routes never accept the kernel token.
    """

    def __init__(self, real: Any, user: Any) -> None:
        self._real = real
        self._user = user

    def get_user(self, handler: Any) -> Any:
        handler._token_authenticated = True
        return self._user

    def is_token_authenticated(self, handler: Any) -> bool:
        return True

    def should_check_origin(self, handler: Any) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _KernelAuthorizer:
    """A kernel token may use resource ``cloudtik`` and nothing else."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource == AUTH_RESOURCE

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _kernel_user() -> Any:
    from jupyter_server.auth.identity import User

    return User(username="kernel", name="notebook kernel", display_name="notebook kernel")


class CloudTikHandler(APIHandler):
    """Base of every cloudtik REST handler."""

    auth_resource = AUTH_RESOURCE
    _kernel_request = False

    # who is calling --------------------------------------------------------------------
    @property
    def ctx(self):
        """The server's context; in the hub sidekick, the calling user's view of it."""
        ctx = self.settings["cloudtik"]
        for_request = getattr(ctx, "for_request", None)
        return for_request(self) if for_request is not None else ctx

    @property
    def manager(self):
        return self.ctx.manager

    def _bearer_token(self) -> str | None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip()
        return None

    async def prepare(self) -> None:
        # the server's own context: the hub's per-user view needs the user, known only
        # after authentication (in super().prepare())
        self._kernel_request = self.settings["cloudtik"].is_kernel_token(self._bearer_token())
        await super().prepare()
        if self._kernel_request:
            what = kernel_refusal(self.request.method or "GET", self.api_subpath())
            if what is not None:
                raise PermissionDeniedError(
                    f"token: the kernel token may not be used for {what}; that stays with "
                    "the user (JupyterLab's panel, or the server's own token)", field="token")
        length = self.request.headers.get("Content-Length")
        limit = self.body_limit()
        if (length and length.isdigit() and int(length) > limit) or len(
                self.request.body or b"") > limit:
            raise web.HTTPError(413, f"body: the request body is larger than {limit} bytes "
                                     "(c.CloudTikServer.max_body_bytes)")

    def body_limit(self) -> int:
        """The largest body this request may have (c.CloudTikServer.max_body_bytes)."""
        return self.settings["cloudtik"].server.max_body_bytes

    def api_subpath(self) -> str:
        """The request's path under ``{base_url}cloudtik/api/``."""
        from jupyter_server.utils import url_path_join

        prefix = url_path_join(self.base_url, "cloudtik/api/")
        path = self.request.path
        return path[len(prefix):] if path.startswith(prefix) else path

    @property
    def identity_provider(self):
        real = super().identity_provider
        if self._kernel_request:
            return _KernelIdentity(real, _kernel_user())
        return real

    @property
    def authorizer(self):
        real = super().authorizer
        if self._kernel_request:
            return _KernelAuthorizer(real)
        return real

    def check_xsrf_cookie(self) -> None:
        """Checked once the caller is known (``prepare``), not before.

        jupyter_server does the same, but JupyterHub's service auth replaces its check with
        one that cannot tell "too early" from "not token-authenticated"; deferring here
        keeps token-authenticated API calls free of XSRF and browser calls checked."""
        if not hasattr(self, "_jupyter_current_user"):
            return
        super().check_xsrf_cookie()

    def on_connection_close(self) -> None:
        closed = getattr(self, "_stream_closed", None)
        if closed is not None:
            closed.set()

    # input ---------------------------------------------------------------------------
    def json_body(self, schema_name: str, required: bool = True) -> dict[str, Any]:
        """The request body, parsed and checked against ``components/schemas/<name>``.

        A required body must be sent (``{}`` where every field is optional): an empty one
        is a 400 naming ``body``, not the defaults a client did not ask for."""
        raw = self.request.body or b""
        if not raw.strip() and required:
            raise ConfigError(
                f"body: missing; send a JSON object ({schema_name} in openapi.yaml"
                "; {} where every field is optional)", field="body")
        return parse_json_body(raw, schema_name)

    def int_arg(self, name: str, default: int, minimum: int = 0,
                maximum: int = 1_000_000) -> int:
        text = self.get_argument(name, None)
        if text is None or text == "":
            return default
        # digits 0-9 only: int() also takes "1_000", spaces and other scripts' digits
        if not re.fullmatch(r"-?[0-9]{1,30}", text, flags=re.ASCII):
            raise ConfigError(f"{name}: {text[:40]!r} is not a whole number", field=name)
        value = int(text)
        if not minimum <= value <= maximum:
            raise ConfigError(f"{name}: {value} is outside {minimum}..{maximum}", field=name)
        return value

    def bool_arg(self, name: str, default: bool = False) -> bool:
        text = self.get_argument(name, None)
        if text is None or text == "":
            return default
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: {text!r} is not true or false", field=name)

    def str_arg(self, name: str, max_length: int = 200) -> str | None:
        text = self.get_argument(name, None)
        if text is not None and len(text) > max_length:
            raise ConfigError(f"{name}: longer than {max_length} characters", field=name)
        return text or None

    def wants_event_stream(self) -> bool:
        return "text/event-stream" in self.request.headers.get("Accept", "")

    # output --------------------------------------------------------------------------
    def scrub(self, text: str) -> str:
        """What an answer may not show this caller, taken out (the hub: the sidekick's
        state folder and HPC work folders are named, not shown, to users)."""
        try:
            ctx = self.ctx
        except CloudTikError:  # not a caller of the hub (refused before): nothing of theirs
            ctx = self.settings["cloudtik"]
            if getattr(ctx, "for_request", None) is not None:
                return ctx.scrub_anonymous(text)
        scrub = getattr(ctx, "scrub", None)
        return scrub(text) if scrub is not None else text

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(self.scrub(json.dumps(data, default=str)))

    def api_path(self, *parts: str) -> str:
        from jupyter_server.utils import url_path_join

        return url_path_join(self.base_url, "cloudtik/api", *parts)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, CloudTikError):
            status_code = exc.http_status if 400 <= exc.http_status < 600 else 500
            body = exc.to_dict()
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message % exc.args if exc.log_message and exc.args else (
                exc.log_message or responses.get(status_code, "error"))
            if status_code == 403 and not getattr(self, "_jupyter_current_user", None):
                message = ("not authenticated: log in, or send a token as "
                           "'Authorization: token <token>'")
            body = {"message": message, "reason": _REASONS.get(status_code, "error"),
                    "field": "body" if status_code == 413 else None}
        else:
            body = {"message": "internal error in the cloudtik API; the server log has the "
                               "details", "reason": "error", "field": None}
            status_code = 500
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(self.scrub(json.dumps(body)))

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[override]
        if isinstance(value, CloudTikError):
            log.info("%s %s: %s (%s)", self.request.method, self.request.path, value.message,
                     value.reason)
            return
        if isinstance(value, web.HTTPError):
            return super().log_exception(typ, value, tb)
        log.error("%s %s failed", self.request.method, self.request.path,
                  exc_info=(typ, value, tb))


class NotFoundHandler(CloudTikHandler):
    """Any other path under the API: a JSON 404 (after the same auth checks)."""

    def _missing(self) -> None:
        # a CloudTikError, not tornado's HTTPError, whose message doubles every '%'
        raise NotFoundError(f"no API route {self.request.method} {self.request.path}")

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self._missing()

    @web.authenticated
    @authorized
    async def post(self) -> None:
        self._missing()

    @web.authenticated
    @authorized
    async def put(self) -> None:
        self._missing()

    @web.authenticated
    @authorized
    async def patch(self) -> None:
        self._missing()

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        self._missing()


def parse_json_body(raw: bytes, schema_name: str) -> dict[str, Any]:
    """A request body, parsed and checked against ``components/schemas/<schema_name>``."""
    data: Any = jsontext.loads(raw, "body") if raw.strip() else {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"body: expected a JSON object, got {type(data).__name__}", field="body")
    openapi.validate_body(data, schema_name)
    return data
