"""Starting and stopping what the sidekick runs beside its API.

* the catalogue file (``c.CloudTikHub.catalog_file``), applied at start-up, so a hub's
  admin can keep the catalogue in configuration management;
* the egress proxy (``egress.supervisor.EgressSupervisor``), fed with the rules in the
  state DB and one proxy credential per user that asked for session settings;
* the side-kick supervisor (``sidekick_supervisor.SidekickSupervisor``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets as pysecrets
from pathlib import Path
from typing import Any

import yaml

from ..core.config import load_yaml
from ..core.errors import ConfigError
from .catalog import Caller

log = logging.getLogger("jupyter_cloudtik.hub")


def load_catalog_file(ctx: Any) -> None:
    path = ctx.hub.catalog_file
    if not path:
        return
    try:
        data = load_yaml(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"c.CloudTikHub.catalog_file: cannot read {path!r}: {e}",
                          field="catalog_file") from None
    for i, item in enumerate(data.get("resources") or []):
        where = f"{path}: resources[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping", field="resources")
        body = dict(item)
        secrets_in = body.get("secrets") or {}
        resolved = {}
        for key, value in secrets_in.items():
            if isinstance(value, dict) and set(value) == {"env"}:
                if value["env"] not in os.environ:
                    raise ConfigError(f"{where}.secrets.{key}: environment variable "
                                      f"{value['env']} is not set", field=f"secrets.{key}")
                resolved[key] = os.environ[value["env"]]
            elif isinstance(value, str):
                resolved[key] = value
            else:
                raise ConfigError(f"{where}.secrets.{key}: expected text or {{env: NAME}}",
                                  field=f"secrets.{key}")
        body["secrets"] = resolved
        kind, name = body.pop("kind", None), body.pop("name", None)
        try:
            res = ctx.catalog.put(kind, name, body, actor="catalog-file")
        except ConfigError as e:
            raise ConfigError(f"{where}: {e.message}", field=e.field) from None
        if kind == "provider":  # as a PUT of the API does: the admin can then create the
            # provider's workspace with the same account (docs/hub.md, API)
            ctx.deliver_provider_credentials(
                res, {"provider": dict(res.spec.get("config") or {})})
    for subject, limits in (data.get("quotas") or {}).items():
        try:
            ctx.catalog.set_quota(subject, limits or {}, actor="catalog-file")
        except ConfigError as e:
            raise ConfigError(f"{path}: quotas.{subject}: {e.message}", field=e.field) from None


def start_services(ctx: Any) -> None:
    """Start the egress proxy and the side-kick supervisor on the server's loop."""
    from .sidekick_supervisor import SidekickSupervisor

    state = Path(ctx.settings.state_dir) / "hub"
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    ctx.sidekicks = SidekickSupervisor(state, secret_resolver=lambda ref: _sidekick_secret(
        ctx, ref), log=log)
    loop = asyncio.get_event_loop()

    async def start() -> None:
        ctx.sidekicks.start_background()  # stops side-kicks orphaned by a previous run
        if ctx.hub.egress_enabled:
            from .egress.supervisor import EgressSupervisor

            ctx.egress = EgressSupervisor(
                state, port=ctx.hub.egress_port,
                upstream_ca_bundle=ctx.hub.egress_upstream_ca_bundle or None,
                no_proxy=ctx.hub.egress_no_proxy,
                deny_networks=ctx.hub.egress_deny_networks, engine=ctx.hub.egress_engine)
            await ctx.egress.start()
            await push_egress(ctx)

    ctx.services_ready = loop.create_task(start())
    if ctx.hub.session_check_interval > 0:
        ctx.session_watch = loop.create_task(_watch_sessions(ctx))


async def _watch_sessions(ctx: Any) -> None:
    """Side-kicks end with their user's session, however it ended (stopped from the hub's
    page, culled, crashed): ask the hub which users still have a running server."""
    import json

    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    auth = None
    while True:
        await asyncio.sleep(ctx.hub.session_check_interval)
        try:
            if auth is None:
                from jupyterhub.services.auth import HubAuth

                auth = HubAuth()
            users = {i.user for i in ctx.sidekicks.list() if i.active}
            for user in users:
                req = HTTPRequest(f"{auth.api_url}/users/{user}",
                                  headers={"Authorization": f"token {auth.api_token}"},
                                  request_timeout=10)
                resp = await AsyncHTTPClient().fetch(req, raise_error=False)
                if resp.code != 200:
                    continue  # the hub does not say: leave them (idle timeouts still apply)
                model = json.loads(resp.body)
                servers = model.get("servers")
                if servers is None:
                    log.warning("the sidekick may not read servers (scope read:servers); "
                                "side-kicks will not stop with sessions")
                    continue
                if not any(s.get("ready") or s.get("pending") for s in servers.values()):
                    await ctx.sidekicks.stop_user(user, reason="the user's server stopped")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("checking users' sessions failed")


async def stop_services(ctx: Any) -> None:
    watch = getattr(ctx, "session_watch", None)
    if watch is not None:
        watch.cancel()
    if ctx.sidekicks is not None:
        await ctx.sidekicks.shutdown()
        await ctx.sidekicks.stop_background()
    if ctx.egress is not None:
        await ctx.egress.stop()
    for name in ("storage", "hpc"):
        manager = ctx.started(name)
        if manager is not None and hasattr(manager, "shutdown"):
            try:
                manager.shutdown()
            except Exception:
                log.exception("stopping %s failed", name)


def _sidekick_secret(ctx: Any, ref: str) -> str:
    """``{"secret": "NAME"}`` in a side-kick's env names a secret of its catalogue entry;
    the catalogue turns it into ``"<sidekick>/NAME"``."""
    sidekick, _, name = ref.partition("/")
    values = ctx.catalog.secret_values("sidekick", sidekick)
    if name not in values:
        raise ConfigError(f"env: side-kick '{sidekick}' has no secret named '{name}'",
                          field="env")
    return values[name]


# egress --------------------------------------------------------------------------------
def rules_for_proxy(ctx: Any) -> list[dict[str, Any]]:
    """Each rule with the users it applies to now (consent resolved: egress_rules.py)."""
    return ctx.egress_rules.for_proxy()


async def push_egress(ctx: Any) -> None:
    if ctx.egress is None:
        return
    clients = [{"user": c.name, "token": token, "groups": list(c.groups)}
               for c, token in ctx.egress_clients.values()]
    await ctx.egress.update(clients, rules_for_proxy(ctx))


async def session_env_for(ctx: Any, caller: Caller) -> dict[str, Any]:
    """Proxy settings for ``caller``'s sessions: a proxy credential of their own (not any
    secret of a rule), the proxy URL and the deployment CA to trust."""
    if ctx.egress is None:
        raise ConfigError("egress: the egress proxy is not enabled on this hub "
                          "(c.CloudTikHub.egress_enabled)", field="egress")
    await asyncio.wait_for(asyncio.shield(ctx.services_ready), 30)
    entry = ctx.egress_clients.get(caller.name)
    if entry is None or entry[0] != caller:
        token = entry[1] if entry else pysecrets.token_urlsafe(24)
        ctx.egress_clients[caller.name] = (caller, token)
        await push_egress(ctx)
    token = ctx.egress_clients[caller.name][1]
    env = ctx.egress.session_env(caller.name, token)
    return {"env": env, "ca_pem": Path(ctx.egress.ca_cert_path).read_text()}
