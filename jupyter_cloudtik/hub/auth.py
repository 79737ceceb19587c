"""Who is calling the sidekick, and what they may do: JupyterHub OAuth and scopes.

Browsers log in through the hub (OAuth, as for any hub service); API clients — the
user's single-user server delegating for the user, scripts — send a hub token.  Either
way the hub tells us the user's name and the token's scopes.  ``custom:cloudtik:use``
lets a user use the sidekick at all; ``custom:cloudtik:admin`` (or being a hub admin, or a
member of ``c.CloudTikHub.admin_groups``) makes them an admin.  Groups decide what of the
catalogue a user sees; when the token's model does not carry them, the sidekick asks the
hub with its own token (scope ``read:users:groups``) and caches the answer briefly.

Only resource ``cloudtik`` is ever authorized: the jupyter_server routes that come with
the app (kernels, contents, ...) answer 403 to everybody.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_server.auth.authorizer import Authorizer
from jupyterhub.singleuser.extension import JupyterHubIdentityProvider
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .catalog import Caller
from .context import ADMIN_SCOPE, USE_SCOPE
from .settings import CloudTikHub

_groups_cache: dict[str, tuple[float, tuple[str, ...]]] = {}


class HubIdentityProvider(JupyterHubIdentityProvider):
    """JupyterHub's identity provider for services, plus the caller's groups and role."""

    @property
    def hub_settings(self) -> CloudTikHub:
        if getattr(self, "_hub_settings", None) is None:
            self._hub_settings = CloudTikHub(parent=self.parent)
        return self._hub_settings

    async def get_user(self, handler: Any) -> Any:
        user = await super().get_user(handler)
        if user is None or getattr(user, "cloudtik_caller", None) is not None:
            return user
        model = user.hub_user
        scopes = set(model.get("scopes") or [])
        groups = model.get("groups")
        if groups is None:
            groups = await self._groups(model["name"])
        admin = bool(model.get("admin")) or ADMIN_SCOPE in scopes or any(
            g in self.hub_settings.admin_groups for g in groups)
        user.cloudtik_caller = Caller(model["name"], tuple(sorted(groups)), admin)
        user.cloudtik_may_use = admin or USE_SCOPE in scopes
        # the person's own browser: the sidekick's OAuth cookie (XSRF checked by HubOAuth),
        # whose token belongs to a hub login session — not a bearer token (a server's, a
        # kernel's, a script's), nor one smuggled into the cookie with ?token= (an API
        # token has no login session)
        user.cloudtik_browser_session = bool(model.get("session_id")) and not getattr(
            handler, "_token_authenticated", False)
        ctx = handler.settings.get("cloudtik")
        if ctx is not None and user.cloudtik_may_use:
            ctx.remember(user.cloudtik_caller)
        return user

    async def _groups(self, name: str) -> tuple[str, ...]:
        ttl = self.hub_settings.group_cache_seconds
        hit = _groups_cache.get(name)
        if hit and time.monotonic() - hit[0] < ttl:
            return hit[1]
        auth = self.hub_auth
        req = HTTPRequest(f"{auth.api_url}/users/{name}",
                          headers={"Authorization": f"token {auth.api_token}"},
                          request_timeout=10)
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
            groups = tuple(json.loads(resp.body).get("groups") or []) \
                if resp.code == 200 else None
        except (OSError, ValueError):
            groups = None
        if groups is None:
            # treated as in no group (only what is offered to the user by name or to
            # everyone) until the next lookup; the service needs read:users:groups
            self.log.warning("cloudtik: could not read the hub groups of %s", name)
            groups = ()
        _groups_cache[name] = (time.monotonic(), groups)
        return groups


class HubAuthorizer(Authorizer):
    """Resource ``cloudtik`` for holders of the use (or admin) scope; nothing else."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource == "cloudtik" and bool(getattr(user, "cloudtik_may_use", False))
