"""Starting and stopping what the sidekick runs beside its API.

* the catalogue file (``c.CloudTikHub.catalog_file``), applied at start-up, so a hub's
  admin can keep the catalogue in configuration management;
* the egress proxy (``egress.supervisor.EgressSupervisor``), fed with the rules in the
  state DB and one proxy credential per user that asked for session settings;
* the side-kick supervisor (``sidekicks.supervisor.SidekickSupervisor``).
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
from ..core.errors import ConfigError, NotFoundError
from .backend_kinds import local_backend_type
from .catalog import KINDS, NAME_RE, SECRET, Caller, validate_spec

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
        resolved = {key: _from_env(value, f"{where}.secrets.{key}")
                    for key, value in secrets_in.items()}
        body["secrets"] = resolved
        for key in ("read_only_credentials",):
            if isinstance(body.get(key), dict):
                body[key] = {k: _from_env(v, f"{where}.{key}.{k}")
                             for k, v in body[key].items()}
        kind, name = body.pop("kind", None), body.pop("name", None)
        try:  # exactly what an admin's PUT does
            apply_resource(ctx, CATALOG_FILE_ADMIN, kind, name, body)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e.message}", field=e.field) from None
    for subject, limits in (data.get("quotas") or {}).items():
        try:
            ctx.catalog.set_quota(subject, limits or {}, actor="catalog-file")
        except ConfigError as e:
            raise ConfigError(f"{path}: quotas.{subject}: {e.message}", field=e.field) from None


def _from_env(value: Any, where: str) -> str:
    """A secret of the catalogue file: text, or ``{env: NAME}`` read from the service's
    environment (so the file itself holds none)."""
    field = where.split(": ", 1)[-1]
    if isinstance(value, dict) and set(value) == {"env"}:
        if value["env"] not in os.environ:
            raise ConfigError(f"{where}: environment variable {value['env']} is not set",
                              field=field)
        return os.environ[value["env"]]
    if isinstance(value, str):
        return value
    raise ConfigError(f"{where}: expected text or {{env: NAME}}", field=field)


#: who the catalogue file's changes are recorded as (an admin of the service's own)
CATALOG_FILE_ADMIN = Caller("catalog-file", (), True)


def apply_resource(ctx: Any, admin: Caller, kind: Any, name: Any,
                   body: dict[str, Any]) -> Any:
    """An admin's catalogue change (API PUT or the catalogue file): checked as a whole —
    local execution, a storage's options against rclone's schema — before it is kept."""
    if kind not in KINDS:
        raise ConfigError(f"kind: {kind!r} is not one of {', '.join(KINDS)}", field="kind",
                          value=kind)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"name: {name!r} is not a valid name (a lowercase letter, then "
                          "up to 62 lowercase letters, digits, '-' or '_')", field="name",
                          value=name)
    _check_local_execution(ctx, kind, name, body.get("spec") or {})
    ro = body.get("read_only_credentials")
    if ro is not None and kind != "storage":
        raise ConfigError(f"read_only_credentials: only a storage has them, not a {kind}",
                          field="read_only_credentials")
    if kind == "storage":
        _sync_storage(ctx, admin, name, body)  # checked by rclone's schema before it is kept
    res = ctx.catalog.put(kind, name, body, actor=admin.name)
    if kind == "provider":
        # so the admin can create the provider's workspace with the same account
        ctx.deliver_provider_credentials(
            ctx.grant(admin, "provider", name), {"provider": dict(res.spec.get("config") or {})})
    return res


def _check_local_execution(ctx: Any, kind: str, name: str, spec: dict[str, Any]) -> None:
    if ctx.hub.allow_local_execution:
        return
    ptype = local_provider_type(ctx, spec) if kind == "provider" else None
    if ptype:
        raise ConfigError(
            f"spec.type: '{spec.get('type')}' ({ptype}) runs users' clusters on the "
            "sidekick's own machine; offer a remote provider (a Slurm over SSH: "
            "config.host), or set c.CloudTikHub.allow_local_execution = True "
            "(docs/security.md#the-sandbox)", field="spec.type", value=spec.get("type"))
    if kind == "hpc":
        btype = local_backend_type(ctx, name)
        if btype:
            raise ConfigError(
                f"name: HPC backend '{name}' ({btype}) runs users' jobs on the sidekick's "
                "own machine or as its account; offer a remote backend (slurm over SSH, "
                "firecrest, arc), or set c.CloudTikHub.allow_local_execution = True "
                "(docs/security.md#the-sandbox)", field="name", value=name)


def local_provider_type(ctx: Any, spec: dict[str, Any]) -> str | None:
    """What a catalogue provider is if it runs users' nodes on this machine (``local``; a
    Slurm of this machine, whose jobs run as the service's account), else None."""
    ptype = spec.get("type")
    config = spec.get("config") or {}
    if ptype == "local":
        return "local"
    if ptype == "slurm" and not config.get("host"):
        backend = config.get("backend")
        if not backend or local_backend_type(ctx, backend):
            return "slurm of this machine"
    return None


def _sync_storage(ctx: Any, admin: Caller, name: str, body: dict[str, Any]) -> None:
    """A catalogue storage is a storage of the sidekick's storage manager, whose
    catalogue checks the options against rclone's schema and keeps the sensitive ones
    in the secret store.  Done first: a storage rclone refuses never reaches the
    catalogue, and a refused change leaves the previous one in place.  Secrets the
    admin did not send again are kept (read against the admin's grant)."""
    spec = body.get("spec") or {}
    validate_spec("storage", name, spec)
    storage = ctx.storage_manager()
    options = dict(spec.get("options") or {})
    if storage.catalog.exists(name):
        try:
            options.update(ctx.secrets.reveal(ctx.grant(admin, "storage", name, "read")))
        except NotFoundError:
            pass
    options.update({k: v for k, v in (body.get("secrets") or {}).items()
                    if v and v != SECRET})
    ro = body.get("read_only_credentials")
    storage.add(
        name, backend=spec["type"], options=options, source=spec.get("source"),
        read_only=bool(spec.get("read_only", True)),
        description=body.get("description") or "", replace=True,
        read_only_credentials=None if ro is None else
        {k: v for k, v in ro.items() if v != SECRET} or None)


# the egress proxy's limits the hub's settings set: (c.CloudTikHub.egress_<name>, the
# proxy's Limits field and --flag)
EGRESS_LIMITS = ("client_connections", "client_lookups", "client_handshakes",
                 "lookup_timeout", "lookup_threads", "min_body_rate", "body_grace",
                 "handshake_timeout", "preauth_connections", "client_loop_share",
                 "client_forget_seconds", "workers")


def egress_limit_args(hub: Any) -> list[str]:
    """The proxy's command-line flags for the hub's ``egress_*`` limits, checked here
    (``Limits`` is the proxy's own check): a bad value is a ConfigError naming the
    setting, the value and what is allowed."""
    # deferred: start-up (hub.egress.proxy ~25 ms, loads cryptography)
    from .egress.proxy import Limits

    values = {name: getattr(hub, f"egress_{name}") for name in EGRESS_LIMITS}
    try:
        Limits(**values)
    except ValueError as e:
        # "egress limit NAME is V; expected ..." -> the setting's name
        msg, field = str(e), "egress"
        for name in EGRESS_LIMITS:
            if f"egress limit {name} " in msg:
                msg = msg.replace(f"egress limit {name} ", f"c.CloudTikHub.egress_{name} ")
                field = f"egress_{name}"
        raise ConfigError(msg, field=field) from None
    args: list[str] = []
    for name, value in values.items():
        args += [f"--{name.replace('_', '-')}", repr(value)]
    return args


def start_services(ctx: Any) -> None:
    """Start the egress proxy and the side-kick supervisor on the server's loop."""
    # deferred: start-up (hub.sidekicks.supervisor ~19 ms, loads psutil)
    from .sidekicks.supervisor import SidekickSupervisor

    # a bad limit is a config error now (one line naming the setting), not a proxy that
    # fails to start in the background
    egress_args = egress_limit_args(ctx.hub) if ctx.hub.egress_enabled else []
    # deferred: start-up (hub.kernels loads the HPC backends)
    from .kernels import HubKernels

    ctx.kernels = HubKernels(ctx)  # a bad kernels_per_user or kernel_lease: said now
    state = Path(ctx.settings.state_dir) / "hub"
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    ctx.sidekicks = SidekickSupervisor(
        state, log=log, sandbox=ctx.sandbox,
        allow_local_execution=ctx.hub.allow_local_execution)
    loop = asyncio.get_event_loop()

    async def start() -> None:
        ctx.sidekicks.start_background()  # stops side-kicks orphaned by a previous run
        # the jobs of kernels a killed sidekick left running
        loop.run_in_executor(None, _end_kernel_orphans, ctx)
        if ctx.hub.egress_enabled:
            # deferred: start-up (hub.egress.supervisor ~52 ms, loads cryptography, psutil)
            from .egress.supervisor import EgressSupervisor

            ctx.egress = EgressSupervisor(
                state, port=ctx.hub.egress_port,
                upstream_ca_bundle=ctx.hub.egress_upstream_ca_bundle or None,
                no_proxy=ctx.hub.egress_no_proxy,
                deny_networks=ctx.hub.egress_deny_networks, engine=ctx.hub.egress_engine,
                extra_args=egress_args)
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


def _end_kernel_orphans(ctx: Any) -> None:
    try:
        ctx.kernels.end_orphans()
    except Exception:  # said; the next sidekick looks again
        log.exception("cannot look for the jobs of HPC kernels of a sidekick that was killed")


async def stop_services(ctx: Any) -> None:
    watch = getattr(ctx, "session_watch", None)
    if watch is not None:
        watch.cancel()
    if getattr(ctx, "kernels", None) is not None:
        await ctx.kernels.close()
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


def sidekick_secrets(ctx: Any, grant: Any) -> Any:
    """The resolver of one start of a side-kick: ``{"secret": "NAME"}`` in its env names a
    secret of its catalogue entry, read against the caller's grant to run it."""

    def resolve(ref: str) -> str:
        _sidekick, _, name = ref.partition("/")
        value = ctx.secrets.reveal(grant, name)
        if value is None:
            raise ConfigError(f"env: side-kick '{grant.name}' has no secret named '{name}'",
                              field="env")
        return value

    return resolve


# egress --------------------------------------------------------------------------------
def rules_for_proxy(ctx: Any) -> list[dict[str, Any]]:
    """Each rule with the users it applies to now (consent resolved: egress_consent.py)."""
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
