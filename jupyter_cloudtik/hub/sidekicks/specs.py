"""Side-kick specs: the admin-defined services a user may start next to their session.

A spec is data only (no secret values: an ``env`` value may be ``{"secret": "NAME"}``, a
reference the supervisor resolves when it starts the process), so specs can be listed,
shown to users and kept in YAML next to the hub config::

    sidekicks:
      job-gateway:
        description: Submit HPC jobs over HTTP
        entry_point: jupyter_cloudtik.hub.job_gateway
        env:
          CLOUDTIK_JOB_GATEWAY_BACKEND: arc
          ARC_TOKEN: {secret: arc-token}
        allowed_groups: [hpc]
        idle_timeout_minutes: 60

Validation names the bad field, the bad value and what is allowed, because admins read
these errors when the hub refuses their config.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import env as envnames
from ...core.errors import ConfigError, NotFoundError, PermissionDeniedError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
ENTRY_POINT_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# set by the supervisor for every process; a spec may not override them
RESERVED_ENV = ("PORT", envnames.SIDEKICK_PORT, envnames.SIDEKICK_PREFIX,
                envnames.SIDEKICK_USER, envnames.SIDEKICK_NAME, envnames.SIDEKICK_TOKEN)

FIELDS = ("name", "description", "command", "entry_point", "env", "health_path",
          "health_interval", "health_timeout", "unhealthy_after", "startup_timeout",
          "stop_timeout", "idle_timeout_minutes", "max_restarts", "restart_window",
          "allowed_users", "allowed_groups")


@dataclass(frozen=True)
class SecretRef:
    """An env value to take from the secret store when the process starts."""

    secret: str

    def __repr__(self) -> str:
        return f"SecretRef({self.secret!r})"


@dataclass
class SidekickSpec:
    name: str
    command: list[str] | None = None
    entry_point: str | None = None
    env: dict[str, str | SecretRef] = field(default_factory=dict)
    health_path: str = "/health"
    health_interval: float = 5.0
    health_timeout: float = 2.0
    unhealthy_after: int = 3
    startup_timeout: float = 30.0
    stop_timeout: float = 5.0
    idle_timeout_minutes: float = 0.0
    max_restarts: int = 5
    restart_window: float = 600.0
    allowed_users: list[str] = field(default_factory=list)
    allowed_groups: list[str] = field(default_factory=list)
    description: str = ""

    # --- parsing ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "") -> SidekickSpec:
        """A checked spec; ``where`` prefixes field names in errors (``sidekicks.x.``)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where or 'sidekick'}: expected a mapping of fields, got "
                              f"{type(d).__name__}", field=where.rstrip(".") or None)
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise ConfigError(f"{where}{unknown[0]}: unknown field; allowed: "
                              f"{', '.join(FIELDS)}", field=f"{where}{unknown[0]}")

        def bad(key: str, value: Any, allowed: str) -> ConfigError:
            return ConfigError(f"{where}{key}: {value!r} is not allowed; expected {allowed}",
                               field=f"{where}{key}")

        name = d.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise bad("name", name, "a slug of 1-40 characters: a lowercase letter, then "
                      "lowercase letters, digits or '-'")
        command, entry_point = d.get("command"), d.get("entry_point")
        if (command is None) == (entry_point is None):
            raise ConfigError(f"{where}command: give exactly one of 'command' (an argv list) "
                              "or 'entry_point' ('module' or 'module:function')",
                              field=f"{where}command")
        if command is not None:
            if isinstance(command, str):
                raise bad("command", command, "a list of arguments (argv), not a shell "
                          "string, e.g. [\"my-service\", \"--verbose\"]")
            if (not isinstance(command, list) or not command
                    or not all(isinstance(a, str) and a for a in command)):
                raise bad("command", command, "a non-empty list of non-empty strings")
            command = list(command)
        if entry_point is not None and (not isinstance(entry_point, str)
                                        or not ENTRY_POINT_RE.match(entry_point)):
            raise bad("entry_point", entry_point, "'package.module' (run as python -m) or "
                      "'package.module:function'")
        env = _parse_env(d.get("env") or {}, where)
        health_path = d.get("health_path", "/health")
        if (not isinstance(health_path, str) or not health_path.startswith("/")
                or any(c.isspace() for c in health_path) or "?" in health_path):
            raise bad("health_path", health_path, "a path starting with '/', e.g. /health")

        def number(key: str, default: float, minimum: float, *, integer: bool = False,
                   strict: bool = True) -> Any:
            value = d.get(key, default)
            ok = isinstance(value, int if integer else (int, float)) \
                and not isinstance(value, bool)
            if ok:
                ok = value > minimum if strict else value >= minimum
            if not ok:
                kind = "a whole number" if integer else "a number"
                rel = ">" if strict else ">="
                raise bad(key, value, f"{kind} {rel} {minimum:g}")
            return int(value) if integer else float(value)

        return cls(
            name=name, command=command, entry_point=entry_point, env=env,
            health_path=health_path,
            health_interval=number("health_interval", 5.0, 0),
            health_timeout=number("health_timeout", 2.0, 0),
            unhealthy_after=number("unhealthy_after", 3, 1, integer=True, strict=False),
            startup_timeout=number("startup_timeout", 30.0, 0),
            stop_timeout=number("stop_timeout", 5.0, 0, strict=False),
            idle_timeout_minutes=number("idle_timeout_minutes", 0.0, 0, strict=False),
            max_restarts=number("max_restarts", 5, 0, integer=True, strict=False),
            restart_window=number("restart_window", 600.0, 0),
            allowed_users=_str_list(d.get("allowed_users"), f"{where}allowed_users"),
            allowed_groups=_str_list(d.get("allowed_groups"), f"{where}allowed_groups"),
            description=_text(d.get("description", ""), f"{where}description"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec as configured: secret references stay references (``{"secret": N}``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in FIELDS}
        out["env"] = {k: ({"secret": v.secret} if isinstance(v, SecretRef) else v)
                      for k, v in self.env.items()}
        out["command"] = list(self.command) if self.command else None
        out["allowed_users"] = list(self.allowed_users)
        out["allowed_groups"] = list(self.allowed_groups)
        return out

    def public(self) -> dict[str, Any]:
        """What a user picking a side-kick needs to see (no command, no env)."""
        return {"name": self.name, "description": self.description,
                "idle_timeout_minutes": self.idle_timeout_minutes}

    # --- use ---------------------------------------------------------------------------------
    def allows(self, user: str, groups: Iterable[str] = ()) -> bool:
        """No allow-list at all means every user; '*' in allowed_users too."""
        if not self.allowed_users and not self.allowed_groups:
            return True
        if "*" in self.allowed_users or user in self.allowed_users:
            return True
        return bool(set(groups or ()) & set(self.allowed_groups))

    def argv(self, python: str) -> list[str]:
        if self.command:
            return list(self.command)
        assert self.entry_point
        module, _, func = self.entry_point.partition(":")
        if not func:
            return [python, "-m", module]
        # both parts matched ENTRY_POINT_RE: plain identifiers, safe to put in code
        return [python, "-c", f"import sys, {module} as m; sys.exit(m.{func}())"]

    def secret_names(self) -> list[str]:
        return sorted({v.secret for v in self.env.values() if isinstance(v, SecretRef)})


def _parse_env(env: Any, where: str) -> dict[str, str | SecretRef]:
    if not isinstance(env, Mapping):
        raise ConfigError(f"{where}env: expected a mapping NAME: value, got "
                          f"{type(env).__name__}", field=f"{where}env")
    out: dict[str, str | SecretRef] = {}
    for key, value in env.items():
        f = f"{where}env.{key}"
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise ConfigError(f"{where}env: {key!r} is not a valid variable name "
                              "(letters, digits, '_'; not starting with a digit)", field=f)
        if key in RESERVED_ENV:
            raise ConfigError(f"{f}: set by the supervisor itself; reserved names: "
                              f"{', '.join(RESERVED_ENV)}", field=f)
        if isinstance(value, Mapping):
            name = value.get("secret")
            if set(value) != {"secret"} or not isinstance(name, str) or not name:
                raise ConfigError(f"{f}: a secret reference is {{secret: NAME}} and nothing "
                                  f"else; got keys {sorted(map(str, value))}", field=f)
            out[key] = SecretRef(name)
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
            # do not echo the value: an admin may have pasted a secret here by mistake
            raise ConfigError(f"{f}: expected a string or {{secret: NAME}}, got "
                              f"{type(value).__name__}", field=f)
        else:
            out[key] = str(value)
    return out


def _str_list(value: Any, f: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list) \
            or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{f}: {value!r} is not allowed; expected a list of names",
                          field=f)
    return list(value)


def _text(value: Any, f: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{f}: {value!r} is not allowed; expected text", field=f)
    return value


def load_specs(data: Any, where: str = "sidekicks") -> dict[str, SidekickSpec]:
    """Specs from ``{name: {fields}}`` (name may be omitted inside) or a list of specs."""
    if isinstance(data, Mapping) and "sidekicks" in data and where == "sidekicks":
        data = data["sidekicks"]
    items: list[tuple[str, Any]]
    if isinstance(data, Mapping):
        items = []
        for key, body in data.items():
            if isinstance(body, Mapping) and "name" not in body:
                body = {**body, "name": key}
            elif isinstance(body, Mapping) and body.get("name") != key:
                raise ConfigError(f"{where}.{key}.name: {body.get('name')!r} differs from "
                                  f"its key {key!r}", field=f"{where}.{key}.name")
            items.append((str(key), body))
    elif isinstance(data, list):
        items = [(str(i), body) for i, body in enumerate(data)]
    elif data is None:
        return {}
    else:
        raise ConfigError(f"{where}: expected a mapping name: spec or a list of specs",
                          field=where)
    specs: dict[str, SidekickSpec] = {}
    for key, body in items:
        spec = SidekickSpec.from_dict(body, where=f"{where}.{key}.")
        if spec.name in specs:
            raise ConfigError(f"{where}.{key}.name: {spec.name!r} is defined twice",
                              field=f"{where}.{key}.name")
        specs[spec.name] = spec
    return specs


class SidekickCatalog:
    """The admin's side-kicks, and who may use which (the hub's routes ask this)."""

    def __init__(self, specs: Mapping[str, SidekickSpec] | Iterable[SidekickSpec] = ()) -> None:
        items = specs.values() if isinstance(specs, Mapping) else specs
        self.specs: dict[str, SidekickSpec] = {s.name: s for s in items}

    @classmethod
    def from_file(cls, path: str | Path) -> SidekickCatalog:
        import yaml

        # deferred: start-up (core.config ~56 ms, loads importlib.metadata, yaml)
        from ...core.config import load_yaml

        path = Path(path).expanduser()
        try:
            data = load_yaml(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"sidekicks file {path} does not exist",
                              field="sidekicks_file") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"sidekicks file {path}: {e}", field="sidekicks_file") from None
        return cls(load_specs(data))

    def for_user(self, user: str, groups: Iterable[str] = ()) -> list[SidekickSpec]:
        groups = list(groups or ())
        return [s for _, s in sorted(self.specs.items()) if s.allows(user, groups)]

    def get(self, name: str, user: str, groups: Iterable[str] = ()) -> SidekickSpec:
        """The spec, if this user may use it; the errors do not reveal hidden side-kicks'
        settings, only that the name is not available."""
        spec = self.specs.get(name)
        if spec is None:
            names = ", ".join(s.name for s in self.for_user(user, groups)) or "none"
            raise NotFoundError(f"sidekick: no side-kick '{name}'; available to you: {names}",
                                field="sidekick", value=name)
        if not spec.allows(user, groups):
            raise PermissionDeniedError(
                f"sidekick: '{name}' is not enabled for user '{user}'; ask an admin to add "
                "you to its allowed_users or allowed_groups", field="sidekick", value=name)
        return spec


__all__ = ["RESERVED_ENV", "SecretRef", "SidekickCatalog", "SidekickSpec", "load_specs"]
