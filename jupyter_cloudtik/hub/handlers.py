"""The sidekick's own routes, beside the shared cluster/storage/job ones.

Under ``{prefix}cloudtik/api/hub/``: who am I, the catalogue (users see what they may use;
admins change it), quotas, the audit log, egress rules and session settings, side-kicks.
Under ``{prefix}sidekicks/{user}/{name}/``: the user's running side-kicks, proxied with
hub auth (only their owner, or an admin, gets through).  ``{prefix}admin`` is a small admin
page over the same API (catalogue, quotas, every user's cost, audit).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..api.base import CloudTikHandler
from ..api.forward import forward, request_headers
from ..core.errors import CloudTikError, ConfigError, NotFoundError, PermissionDeniedError
from . import bootstrap
from .catalog import KINDS, Caller
from .context import caller_of

KIND = r"(?P<kind>[a-z]+)"
NAME = r"(?P<name>[^/]+)"


class HubHandler(CloudTikHandler):
    @property
    def hub(self) -> Any:
        return self.settings["cloudtik"]

    @property
    def caller(self) -> Caller:
        return caller_of(self)

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
        items = self.hub.catalog.visible(c, kind)
        self.write_json({"resources": [r.to_dict(admin=c.admin) for r in items]})


class CatalogItemHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, kind: str, name: str) -> None:
        c = self.caller
        res = self.hub.catalog.get(kind, name) if c.admin else \
            self.hub.catalog.usable(c, kind, name)
        self.write_json(res.to_dict(admin=c.admin))

    @web.authenticated
    @authorized
    async def put(self, kind: str, name: str) -> None:
        c = self.require_admin()
        body = self.json_body("HubResource")
        self._check_local_execution(kind, name, body.get("spec") or {})
        if kind == "storage":
            self._sync_storage(name, body)  # checked by rclone's schema before it is kept
        res = self.hub.catalog.put(kind, name, body, actor=c.name)
        if kind == "provider":
            # so the admin can create the provider's workspace with the same account
            self.hub.deliver_provider_credentials(
                res, {"provider": dict(res.spec.get("config") or {})})
        self.write_json(res.to_dict(admin=True))

    @web.authenticated
    @authorized
    async def delete(self, kind: str, name: str) -> None:
        c = self.require_admin()
        if kind == "storage":
            storage = self.hub.storage_manager()
            try:
                await storage.remove(name)
            except NotFoundError:
                pass
        self.hub.catalog.delete(kind, name, actor=c.name)
        self.set_status(204)
        self.finish()

    def _check_local_execution(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        if self.hub.hub.allow_local_execution:
            return
        if kind == "provider" and spec.get("type") == "local":
            raise ConfigError(
                "spec.type: 'local' runs users' clusters on the sidekick's own machine under "
                "its account, which holds every credential; offer a remote provider, or set "
                "c.CloudTikHub.allow_local_execution = True for trusted users",
                field="spec.type", value="local")
        if kind == "hpc":
            backends = {b["name"]: b for b in self.hub.job_manager().backends()}
            btype = (backends.get(name) or {}).get("type")
            if btype in ("local", "dask"):
                raise ConfigError(
                    f"name: HPC backend '{name}' ({btype}) runs users' jobs on the sidekick's "
                    "own machine; offer a remote backend (slurm, firecrest, arc), or set "
                    "c.CloudTikHub.allow_local_execution = True for trusted users",
                    field="name", value=name)

    def _sync_storage(self, name: str, body: dict[str, Any]) -> None:
        """A catalogue storage is a storage of the sidekick's storage manager, whose
        catalogue checks the options against rclone's schema and keeps the sensitive ones
        in the secret store.  Done first: a storage rclone refuses never reaches the
        catalogue, and a refused change leaves the previous one in place."""
        from .catalog import validate_spec

        spec = body.get("spec") or {}
        validate_spec("storage", name, spec)
        options = dict(spec.get("options") or {})
        options.update(self.hub.catalog.secret_values("storage", name))
        options.update({k: v for k, v in (body.get("secrets") or {}).items()
                        if v and v != "<secret>"})
        self.hub.storage_manager().add(
            name, backend=spec["type"], options=options, source=spec.get("source"),
            read_only=bool(spec.get("read_only", True)),
            description=body.get("description") or "", replace=True)


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
# who a rule acts for, and the consent behind it: hub/egress_rules.py
class EgressRulesHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Rules the caller owns (admins: all), with the state of each share; values
        never shown.  What acts on the caller's own sessions: ``egress/applies``."""
        self.write_json({"rules": self.hub.egress_rules.owned(self.caller)})


class EgressRuleHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.write_json(self.hub.egress_rules.get(self.caller, name))

    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        """Create or replace a rule.  A user's rule applies to them, and to each user it
        names once that user accepted the share; an admin's applies as configured."""
        c = self.caller
        body = self.json_body("HubEgressRule")
        rule, detail = self.hub.egress_rules.put(c, name, body)
        self.hub.catalog.audit(c.name, "egress.put", f"egress:{name}", detail)
        await bootstrap.push_egress(self.hub)
        self.write_json(rule)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        c = self.caller
        self.hub.egress_rules.delete(c, name)
        self.hub.catalog.audit(c.name, "egress.delete", f"egress:{name}", {})
        await bootstrap.push_egress(self.hub)
        self.set_status(204)
        self.finish()


class EgressRuleShareHandler(HubHandler):
    @web.authenticated
    @authorized
    async def delete(self, name: str, user: str) -> None:
        """The owner revokes a share (offered or accepted): it stops at once."""
        c = self.caller
        rule = self.hub.egress_rules.revoke(c, name, user)
        self.hub.catalog.audit(c.name, "egress.revoke", f"egress:{name}", {"user": user})
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
        share = self.hub.egress_rules.decide(c, name, accept=action == "accept")
        self.hub.catalog.audit(c.name, f"egress.{action}", f"egress:{name}",
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
def _spec_for(hub: Any, caller: Caller, name: str) -> Any:
    from .sidekick_specs import SidekickSpec

    res = hub.catalog.usable(caller, "sidekick", name)
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
                                       "description", "")})


class SidekicksHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The side-kicks the caller may start, with the state of theirs."""
        c = self.caller
        mine = {i.name: i for i in self.hub.sidekicks.list(c.name)}
        out = []
        for res in self.hub.catalog.visible(c, "sidekick"):
            info = mine.get(res.name)
            out.append({"name": res.name, "description": res.description,
                        "state": info.state if info else "stopped",
                        "instance": info.to_dict() if info else None})
        self.write_json({"sidekicks": out})


class SidekickHandler(HubHandler):
    def prefix(self, user: str, name: str) -> str:
        from .sidekick_supervisor import sidekick_prefix

        return sidekick_prefix(user, name, url_path_join(self.base_url, "sidekicks"))

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        c = self.caller
        self.hub.catalog.usable(c, "sidekick", name)
        self.write_json(self.hub.sidekicks.get(c.name, name).to_dict())

    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        """Start (idempotent); answers once the side-kick passes its health check."""
        c = self.caller
        spec = _spec_for(self.hub, c, name)
        info = await self.hub.sidekicks.start(c.name, spec, prefix=self.prefix(c.name, name))
        self.write_json(info.to_dict(), status=201)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        c = self.caller
        self.hub.catalog.usable(c, "sidekick", name)
        info = await self.hub.sidekicks.stop(c.name, name)
        self.write_json(info.to_dict() if info is not None else {"name": name,
                                                                  "state": "stopped"})


class SidekickLogsHandler(HubHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        c = self.caller
        self.hub.catalog.usable(c, "sidekick", name)
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


class AdminPageHandler(BrowserPageHandler):
    """A small admin page over the same API (catalogue, quotas, audit)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        from importlib.resources import files

        if not self.caller.admin:
            raise web.HTTPError(403, "only sidekick admins may open this page")
        html = (files("jupyter_cloudtik.hub") / "admin.html").read_text()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'; "
                        "script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'")
        self.finish(html.replace("{{API}}", url_path_join(self.base_url,
                                                          "cloudtik/api/hub/")))


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
        (api + r"/sidekicks", SidekicksHandler),
        (api + r"/sidekicks/_stop-mine", SidekickStopUserHandler),
        (api + rf"/sidekicks/{NAME}", SidekickHandler),
        (api + rf"/sidekicks/{NAME}/logs", SidekickLogsHandler),
        (url_path_join(base_url, "sidekicks") + r"/(?P<user>[^/]+)/(?P<name>[^/]+)(?P<rest>/.*)?",
         SidekickProxyHandler),
        (url_path_join(base_url, "admin"), AdminPageHandler),
    ]
