"""The sidekick's own routes, beside the shared cluster/storage/job ones.

Under ``{prefix}cloudtik/api/hub/``: who am I, the catalogue (users see what they may use;
admins change it), quotas, the audit log, egress rules and session settings, side-kicks.
Under ``{prefix}sidekicks/{user}/{name}/``: the user's running side-kicks, proxied with
hub auth (only their owner, or an admin, gets through).  ``{prefix}admin`` is a small admin
page over the same API (catalogue, quotas, every user's cost, audit).
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..api.base import CloudTikHandler
from ..api.forward import forward, request_headers
from ..core.errors import CloudTikError, ConfigError, NotFoundError, PermissionDeniedError
from . import bootstrap
from .catalog import KINDS, Caller
from .context import caller_of
from .sidekicks.specs import SidekickSpec
from .sidekicks.supervisor import sidekick_prefix

KIND = r"(?P<kind>[a-z]+)"
NAME = r"(?P<name>[^/]+)"


class HubHandler(CloudTikHandler):
    @property
    def hub(self) -> Any:
        return self.settings["cloudtik"]

    @property
    def caller(self) -> Caller:
        return caller_of(self)

    def require_browser_session(self, what: str) -> None:
        """What stays with the person (credentials, consent): their own browser session
        only, never a bearer token a server, kernel or script holds."""
        self.hub.require_held(self.hub.held_allowed(self), what)

    def require_admin(self) -> Caller:
        caller = self.caller
        if not caller.admin:
            raise PermissionDeniedError(
                "only sidekick admins may do this (hub admins, holders of "
                "custom:cloudtik:admin or members of c.CloudTikHub.admin_groups)",
                field="user")
        return caller


class WhoAmIHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        c = self.caller
        self.write_json({"name": c.name, "groups": list(c.groups), "admin": c.admin,
                         "quota": self.hub.catalog.quota_for(c)})


class CatalogHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        kind = self.str_arg("kind")
        if kind is not None and kind not in KINDS:
            raise ConfigError(f"kind: {kind!r} is not one of {', '.join(KINDS)}",
                              field="kind", value=kind)
        c = self.caller
        kinds = [kind] if kind else list(KINDS)
        items = [r for k in kinds for r in self.hub.visible(c, k)]
        self.write_json({"resources": [r.to_dict(admin=c.admin) for r in items]})


class CatalogItemHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, kind: str, name: str) -> None:
        c = self.caller
        if kind not in KINDS:
            raise ConfigError(f"kind: {kind!r} is not one of {', '.join(KINDS)}",
                              field="kind", value=kind)
        res = self.hub.catalog.get(kind, name) if c.admin else \
            self.hub.usable(c, kind, name, field="name")
        self.write_json(res.to_dict(admin=c.admin))

    @web.authenticated
    @authorized
    async def put(self, kind: str, name: str) -> None:
        c = self.require_admin()
        self.require_browser_session("changing the catalogue (it carries credentials)")
        body = self.json_body("HubResource")
        res = bootstrap.apply_resource(self.hub, c, kind, name, body)
        self.write_json(res.to_dict(admin=True))

    @web.authenticated
    @authorized
    async def delete(self, kind: str, name: str) -> None:
        c = self.require_admin()
        self.require_browser_session("changing the catalogue")
        if kind == "storage":
            storage = self.hub.storage_manager()
            try:
                await storage.remove(name)
            except NotFoundError:
                pass
        self.hub.catalog.delete(kind, name, actor=c.name)
        self.set_status(204)
        self.finish()


class QuotasHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        c = self.caller
        if c.admin:
            self.write_json({"quotas": self.hub.catalog.quotas()})
        else:
            self.write_json({"quotas": [self.hub.catalog.quota_for(c)]})


class QuotaHandler(HubHandler):
    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        c = self.require_admin()
        self.require_browser_session("changing a quota")
        body = self.json_body("HubQuota")
        self.write_json(self.hub.catalog.set_quota(name, body, actor=c.name))


class AuditHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.require_admin()
        self.write_json({"entries": self.hub.catalog.audit_log(
            limit=self.int_arg("limit", 200, 1, 5000), after=self.int_arg("after", 0))})


class UsageHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every user's clusters, workers now, cost per hour and cost so far (admins)."""
        self.require_admin()
        self.write_json(self.hub.usage_by_user())


# egress --------------------------------------------------------------------------------
# who a rule acts for, and the consent behind it: hub/egress_consent.py
class EgressRulesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Rules the caller owns (admins: all), with the state of each share; values
        never shown.  What acts on the caller's own sessions: ``egress/applies``."""
        self.write_json({"rules": self.hub.egress_rules.owned(self.caller)})


class EgressRuleHandler(HubHandler):
    """A rule of the caller's own namespace (admins: the admin namespace, or a user's
    rule with ``?owner=NAME``): ids belong to their owner (hub/egress_consent.py)."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.write_json(self.hub.egress_rules.get(self.caller, name, self.str_arg("owner")))

    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        """Create or replace a rule.  A user's rule applies to them, and to each user it
        names once that user accepted the share; an admin's applies as configured."""
        c = self.caller
        self.require_browser_session("changing an egress rule (it carries a credential)")
        body = self.json_body("HubEgressRule")
        rule, detail = self.hub.egress_rules.put(c, name, body, self.str_arg("owner"))
        self.hub.catalog.audit(c.name, "egress.put", f"egress:{detail['ref']}", detail)
        await bootstrap.push_egress(self.hub)
        self.write_json(rule)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        c = self.caller
        self.require_browser_session("removing an egress rule")
        ref = self.hub.egress_rules.delete(c, name, self.str_arg("owner"))
        self.hub.catalog.audit(c.name, "egress.delete", f"egress:{ref}", {})
        await bootstrap.push_egress(self.hub)
        self.set_status(204)
        self.finish()


class EgressRuleShareHandler(HubHandler):
    @web.authenticated
    @authorized
    async def delete(self, name: str, user: str) -> None:
        """The owner revokes a share (offered or accepted): it stops at once."""
        c = self.caller
        self.require_browser_session("revoking an egress share")
        rule = self.hub.egress_rules.revoke(c, name, user, self.str_arg("owner"))
        self.hub.catalog.audit(c.name, "egress.revoke", f"egress:{rule['ref']}",
                               {"user": user})
        await bootstrap.push_egress(self.hub)
        self.write_json(rule)


class EgressAppliesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every rule that acts on the caller's sessions, or is offered to them: their
        own, shares offered to them (pending, accepted, declined) and admins' rules
        that apply to them; ``applied`` lists the ids in force now."""
        self.write_json(self.hub.egress_rules.applies_to(self.caller))


class EgressSharesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Rules other users offered to the caller, and the caller's answer so far."""
        self.write_json({"shares": self.hub.egress_rules.offers(self.caller)})


class EgressShareDecisionHandler(HubHandler):
    @web.authenticated
    @authorized
    async def post(self, name: str, action: str) -> None:
        """``accept``: the rule applies to the caller's sessions from now on;
        ``decline``: it does not (also withdraws an earlier acceptance)."""
        c = self.caller
        self.require_browser_session("answering an egress share offer (consent stays "
                                     "with you)")
        share = self.hub.egress_rules.decide(c, name, accept=action == "accept",
                                             owner=self.str_arg("owner"))
        self.hub.catalog.audit(c.name, f"egress.{action}", f"egress:{share['ref']}",
                               {"owner": share["owner"]})
        await bootstrap.push_egress(self.hub)
        self.write_json(share)


class EgressSessionHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The proxy settings a session of the caller should have (env + CA)."""
        self.write_json(await bootstrap.session_env_for(self.hub, self.caller))


# side-kicks ----------------------------------------------------------------------------
def _spec_for(hub: Any, caller: Caller, name: str) -> tuple[Any, Any]:
    """The side-kick's spec and the caller's grant to run it (its secrets are read against
    that grant, at this start and at every restart)."""
    grant = hub.grant(caller, "sidekick", name, "run", field="name")
    res = hub.catalog.get("sidekick", name)
    spec = dict(res.spec)
    env = {}
    for key, value in (spec.pop("env", None) or {}).items():
        if isinstance(value, dict) and "secret" in value:
            value = {"secret": f"{name}/{value['secret']}"}
        env[key] = value
    spec.pop("allowed_users", None)
    spec.pop("allowed_groups", None)
    return SidekickSpec.from_dict({**spec, "env": env, "name": name,
                                   "description": res.description or spec.get(
                                       "description", "")}), grant


class SidekicksHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The side-kicks the caller may start, with the state of theirs."""
        c = self.caller
        mine = {i.name: i for i in self.hub.sidekicks.list(c.name)}
        out = []
        for res in self.hub.visible(c, "sidekick"):
            info = mine.get(res.name)
            out.append({"name": res.name, "description": res.description,
                        "state": info.state if info else "stopped",
                        "instance": info.to_dict() if info else None})
        self.write_json({"sidekicks": out})


class SidekickHandler(HubHandler):
    def prefix(self, user: str, name: str) -> str:
        return sidekick_prefix(user, name, url_path_join(self.base_url, "sidekicks"))

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        c = self.caller
        self.hub.grant(c, "sidekick", name, "run", field="name")
        self.write_json(self.hub.sidekicks.get(c.name, name).to_dict())

    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        """Start (idempotent); answers once the side-kick passes its health check."""
        c = self.caller
        spec, grant = _spec_for(self.hub, c, name)
        info = await self.hub.sidekicks.start(
            c.name, spec, prefix=self.prefix(c.name, name),
            secret_resolver=bootstrap.sidekick_secrets(self.hub, grant))
        self.write_json(info.to_dict(), status=201)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        c = self.caller
        self.hub.grant(c, "sidekick", name, "run", field="name")
        info = await self.hub.sidekicks.stop(c.name, name)
        self.write_json(info.to_dict() if info is not None else {"name": name,
                                                                  "state": "stopped"})


class SidekickLogsHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        c = self.caller
        self.hub.grant(c, "sidekick", name, "run", field="name")
        text = await self.hub.sidekicks.logs(c.name, name, self.int_arg("tail", 200, 0,
                                                                          100_000))
        self.write_json({"name": name, "logs": text})


class SidekickStopUserHandler(HubHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Stop every side-kick of the caller (the single-user server calls this when it
        stops, so side-kicks end with the session)."""
        await self.hub.sidekicks.stop_user(self.caller.name)
        self.write_json({"stopped": True})



# interactive HPC kernels (hub/kernels.py) -----------------------------------------------
KERNEL_ID = r"(?P<kid>[^/]+)"


class KernelProfilesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The kernel profiles the caller may start (their server's kernel specs)."""
        self.write_json({"profiles": self.hub.kernels.profiles(self.caller)})


class KernelSizesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.json_body("HubKernelSize")
        p = await self.hub.kernels.size(self.caller, body.get("profile"), body.get("custom"))
        self.write_json({"name": p.name, "display_name": p.title()})


class KernelsHandler(HubHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Submit a kernel's job; the caller's server then watches and reaches it."""
        body = self.json_body("HubKernelStart")
        self.write_json(await self.hub.kernels.start(self.caller, body), status=201)


class KernelHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, kid: str) -> None:
        self.write_json(await self.hub.kernels.status(self.caller, kid))

    @web.authenticated
    @authorized
    async def delete(self, kid: str) -> None:
        await self.hub.kernels.delete(self.caller, kid)
        self.set_status(204)
        self.finish()


class KernelActionHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, kid: str, kaction: str) -> None:
        if kaction != "ports":
            raise web.HTTPError(405)
        self.write_json(await self.hub.kernels.ports(self.caller, kid))

    @web.authenticated
    @authorized
    async def post(self, kid: str, kaction: str) -> None:
        k = self.hub.kernels
        if kaction == "connect":
            self.write_json(await k.connect(self.caller, kid))
        elif kaction == "signal":
            body = self.json_body("HubKernelSignal")
            await k.signal(self.caller, kid, body.get("signal"))
            self.write_json({"signal": body.get("signal")})
        elif kaction == "cancel":
            await k.cancel(self.caller, kid)
            self.write_json({"cancelled": True})
        else:
            raise web.HTTPError(405)


class KernelChannelHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """One kernel port as a websocket of binary frames: the user's server joins a local
    port to it, the sidekick joins it to the kernel's port on the node."""

    auth_resource = "cloudtik"

    def set_default_headers(self) -> None:  # JupyterHandler's are for pages
        pass

    @ws_authenticated
    async def get(self, kid: str, name: str) -> None:
        if not await ensure_async(self.authorizer.is_authorized(self, self.current_user,
                                                               "execute", "cloudtik")):
            raise web.HTTPError(403)
        # a token in the header (the user's server), never a browser's cookie: a page
        # cannot set that header on a websocket, so no page of any origin opens one
        if not self.request.headers.get("Authorization"):
            raise web.HTTPError(403, "kernel channels take a token (Authorization), not a "
                                     "browser session")
        try:
            self._reader, self._writer = await self.settings["cloudtik"].kernels.open_channel(
                caller_of(self), kid, name)
        except CloudTikError as e:
            raise web.HTTPError(e.http_status, e.message) from None
        except OSError as e:
            raise web.HTTPError(502, f"the kernel's port did not answer: {e}") from None
        await super().get(kid, name)

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open()
        self._pump = asyncio.ensure_future(self._from_kernel())

    async def _from_kernel(self) -> None:
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                await self.write_message(data, binary=True)
        except (OSError, WebSocketClosedError):
            pass
        finally:
            self.close()

    async def on_message(self, message: str | bytes) -> None:
        if isinstance(message, str):
            message = message.encode()
        try:
            self._writer.write(message)
            await self._writer.drain()
        except OSError:
            self.close()

    def on_close(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            writer.close()
        pump = getattr(self, "_pump", None)
        if pump is not None:
            pump.cancel()


class BrowserPageHandler(JupyterHandler):
    """Pages a browser navigates to (not API calls): an unauthenticated visit is sent to
    the hub's login (OAuth) instead of answered 403."""

    auth_resource = "cloudtik"

    @property
    def hub(self) -> Any:
        return self.settings["cloudtik"]

    @property
    def caller(self) -> Caller:
        return caller_of(self)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, CloudTikError):
            status_code, message = exc.http_status, exc.message
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message or "error"
        else:
            message = "internal error; the sidekick's log has the details"
        self.set_status(status_code)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code}: {message}\n")


class SidekickProxyHandler(BrowserPageHandler):
    """``{prefix}sidekicks/{user}/{name}/...`` → the side-kick, for its owner only."""

    async def _proxy(self, user: str, name: str, rest: str) -> None:
        c = self.caller
        if c.name != user and not c.admin:
            raise web.HTTPError(404, "no such side-kick")
        target, extra = self.hub.sidekicks.proxy_target(user, name)
        await forward(self, target + self.request.path,
                      request_headers(self, {**extra, "X-Forwarded-User": c.name}),
                      unavailable=f"side-kick '{name}' did not answer", timeout=300)

    @web.authenticated
    @authorized
    async def get(self, user: str, name: str, rest: str) -> None:
        await self._proxy(user, name, rest)

    @web.authenticated
    @authorized
    async def post(self, user: str, name: str, rest: str) -> None:
        await self._proxy(user, name, rest)

    @web.authenticated
    @authorized
    async def put(self, user: str, name: str, rest: str) -> None:
        await self._proxy(user, name, rest)

    @web.authenticated
    @authorized
    async def delete(self, user: str, name: str, rest: str) -> None:
        await self._proxy(user, name, rest)

    def check_xsrf_cookie(self) -> None:
        """Proxied apps have their own forms and cannot know our XSRF token: token-
        authenticated calls pass; cookie-authenticated ones must come from this origin."""
        if not hasattr(self, "_jupyter_current_user"):
            return
        if self.token_authenticated:
            return
        if self.request.method not in ("GET", "HEAD", "OPTIONS") and not (
                self.request.headers.get("Origin") and self.check_origin()):
            raise web.HTTPError(403, "cross-origin request to a side-kick refused")


class _PageHandler(BrowserPageHandler):
    page = ""

    def render_page(self) -> None:
        from importlib.resources import files

        html = (files("jupyter_cloudtik.hub") / self.page).read_text()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'; "
                        "script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; "
                        "frame-ancestors 'none'")
        self.set_header("X-Frame-Options", "DENY")
        self.xsrf_token  # noqa: B018 — sets the _xsrf cookie the page sends back
        self.finish(html.replace("{{API}}", url_path_join(self.base_url, "cloudtik/api/hub/"))
                    .replace("{{ROOT}}", url_path_join(self.base_url, "cloudtik/api/")))


class AdminPageHandler(_PageHandler):
    """A small admin page over the same API (catalogue, quotas, audit)."""

    page = "admin.html"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        if not self.caller.admin:
            raise web.HTTPError(403, "only sidekick admins may open this page")
        self.render_page()


class EgressPageHandler(_PageHandler):
    """Each user's own page for their egress rules and the shares offered to them: what
    no token may change (docs/security.md#what-stays-with-the-person)."""

    page = "egress.html"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.render_page()


def hub_routes(base_url: str) -> list[tuple[str, Any]]:
    api = url_path_join(base_url, "cloudtik/api/hub")
    return [
        (api + r"/whoami", WhoAmIHandler),
        (api + r"/catalog", CatalogHandler),
        (api + rf"/catalog/{KIND}/{NAME}", CatalogItemHandler),
        (api + r"/quotas", QuotasHandler),
        (api + rf"/quotas/{NAME}", QuotaHandler),
        (api + r"/audit", AuditHandler),
        (api + r"/usage", UsageHandler),
        (api + r"/egress/rules", EgressRulesHandler),
        (api + rf"/egress/rules/{NAME}", EgressRuleHandler),
        (api + rf"/egress/rules/{NAME}/shares/(?P<user>[^/]+)", EgressRuleShareHandler),
        (api + r"/egress/applies", EgressAppliesHandler),
        (api + r"/egress/shares", EgressSharesHandler),
        (api + rf"/egress/shares/{NAME}/(?P<action>accept|decline)",
         EgressShareDecisionHandler),
        (api + r"/egress/session", EgressSessionHandler),
        (api + r"/kernel-profiles", KernelProfilesHandler),
        (api + r"/kernel-sizes", KernelSizesHandler),
        (api + r"/kernels", KernelsHandler),
        (api + rf"/kernels/{KERNEL_ID}", KernelHandler),
        (api + rf"/kernels/{KERNEL_ID}/(?P<kaction>ports|connect|signal|cancel)",
         KernelActionHandler),
        (api + rf"/kernels/{KERNEL_ID}/channels/(?P<name>[a-z_]+)", KernelChannelHandler),
        (api + r"/sidekicks", SidekicksHandler),
        (api + r"/sidekicks/_stop-mine", SidekickStopUserHandler),
        (api + rf"/sidekicks/{NAME}", SidekickHandler),
        (api + rf"/sidekicks/{NAME}/logs", SidekickLogsHandler),
        (url_path_join(base_url, "sidekicks") + r"/(?P<user>[^/]+)/(?P<name>[^/]+)(?P<rest>/.*)?",
         SidekickProxyHandler),
        (url_path_join(base_url, "admin"), AdminPageHandler),
        (url_path_join(base_url, "egress"), EgressPageHandler),
    ]
