"""Cluster configs: read, check against the shipped JSON Schema, complete with defaults.

The user's own words are checked first (so an error names the field as they wrote it),
then defaults are filled in and cross-field rules are checked.  The normalised config is
what is stored and compared: two configs are "the same cluster" when their normalised
forms are equal.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import jsontext, plugins
from .errors import ConfigError, ConfigProblems
from .lazy_jsonschema import jsonschema
from .units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

    from ..providers.base import NodeProvider
    from .settings import CloudTik

DEFAULT_CLUSTER_NAME = "default"


@lru_cache(maxsize=1)
def cluster_schema() -> dict[str, Any]:
    text = resources.files("jupyter_cloudtik.core").joinpath("schemas/cluster.schema.json")
    return json.loads(text.read_text())


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML (or JSON) cluster config file; syntax errors give the line."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist", field="config") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}", field="config") from e
    return parse_config_text(text, source=str(p))


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, every failure a ``yaml.YAMLError``: PyYAML lets a ``ValueError``
    out for a date that does not exist (``2020-02-31``) and a ``RecursionError`` for deep
    nesting."""
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except (ValueError, OverflowError) as e:
        raise yaml.YAMLError(f"{e}") from None


def parse_config_text(text: str, source: str = "<config>") -> dict[str, Any]:
    try:
        data = load_yaml(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        raise ConfigError(
            f"{source}: YAML syntax error at {where}: {e.problem}", field="config"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: YAML error: {e}", field="config") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a cluster config must be a mapping, not {type(data).__name__}",
            field="config",
        )
    problem = jsontext.check(data)  # before anything walks it recursively
    if problem:
        raise ConfigError(f"{source}: {problem}", field="config")
    _check_json(data, source, "")
    return data


def _check_json(value: Any, source: str, path: str) -> None:
    """A config is stored and compared as JSON: YAML's other kinds (keys that are not
    text, dates, binary, sets) are refused where they are, not later as a crash."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                where = path or "(top level)"
                raise ConfigError(
                    f"{source}: {where}: the key {k!r} is a {type(k).__name__}; keys are "
                    "text (quote it)", field=path or "config")
            _check_json(v, source, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, source, f"{path}.{i}" if path else str(i))
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise ConfigError(
            f"{source}: {path}: {value!r} is a {type(value).__name__}, which a config "
            "cannot hold (quote it to make it text)", field=path or "config")


def _field_path(error: ValidationError, prefix: str = "") -> str:
    parts = [str(p) for p in error.absolute_path]
    path = ".".join(parts)
    if prefix:
        return f"{prefix}.{path}" if path else prefix
    return path or "(top level)"


def _describe(error: ValidationError, schema_root: dict[str, Any]) -> str:
    """A message in the project's style: what is wrong, and what would be right."""
    if error.validator == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        inst = error.instance
        extra = sorted(set(inst) - set(allowed), key=str) if isinstance(inst, dict) else []
        names = ", ".join(repr(e) for e in extra)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"unknown field {names}{hint}"
    if error.validator == "oneOf" and "description" in error.schema:
        return f"{error.instance!r} is not valid: {error.schema['description']}"
    if error.validator == "pattern" and "description" in error.schema:
        return f"{error.instance!r} is not allowed: {error.schema['description']}"
    if error.validator == "enum":
        return f"{error.instance!r} is not one of {error.validator_value}"
    return error.message


def validate_against(
    instance: Any, schema: dict[str, Any], prefix: str = ""
) -> None:
    """Raise one ConfigError naming every schema violation (the most precise one first)."""
    validator = jsonschema().Draft202012Validator(schema)
    errors = list(validator.iter_errors(instance))
    if not errors:
        return
    problems = []
    for error in errors:
        if error.validator == "oneOf" and error.context and "description" not in error.schema:
            error = sorted(error.context, key=lambda e: -len(list(e.absolute_path)))[0]
        path = _field_path(error, prefix)
        problems.append(ConfigError(f"{path}: {_describe(error, schema)}", field=path,
                                    value=error.instance))
    # deepest first, then in document order: the precise field leads
    problems.sort(key=lambda e: (-e.field.count("."), e.field))
    seen: set[str] = set()
    unique = [p for p in problems if not (p.message in seen or seen.add(p.message))]
    raise ConfigError.combine(unique[:MAX_PROBLEMS])


MAX_PROBLEMS = 20  # beyond that, a listing helps nobody


def provider_class(provider_type: str, settings: CloudTik | None = None) -> type[NodeProvider]:
    if settings is not None and settings.allowed_providers and (
        provider_type not in settings.allowed_providers
    ):
        raise ConfigError(
            f"provider.type: '{provider_type}' is not allowed here; allowed: "
            f"{', '.join(settings.allowed_providers)}",
            field="provider.type",
        )
    return plugins.load(plugins.PROVIDERS, provider_type, field="provider.type",
                        what="provider")


def build_config(
    source: str | os.PathLike[str] | dict[str, Any] | None = None,
    *,
    name: str | None = None,
    workers: int | None = None,
    provider: str | None = None,
    settings: CloudTik | None = None,
) -> dict[str, Any]:
    """The normalised cluster config from a file path, a dict or nothing plus short forms."""
    if source is None:
        raw: dict[str, Any] = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(source)
    else:
        raw = read_config_file(source)

    try:
        validate_against(raw, cluster_schema())
    except ConfigError as shape:
        raise _with_later_faults(shape, raw, workers, settings) from None

    if name is not None:
        raw["cluster_name"] = name
    if provider is not None:
        declared = (raw.get("provider") or {}).get("type")
        if declared and declared != provider:
            raise ConfigError(
                f"provider: the config file says '{declared}' but '{provider}' was asked for",
                field="provider.type",
            )
        raw.setdefault("provider", {})["type"] = provider
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        raise ConfigError(
                f"workers: {workers!r} is not a whole number of workers (0 or more)",
                field="workers",
            )
    try:
        validate_against(raw, cluster_schema())
    except ConfigError as shape:
        raise _with_later_faults(shape, raw, workers, settings) from None
    return normalize(raw, workers=workers, settings=settings)


def _drop(tree: Any, parts: list[str]) -> None:
    """Remove the value at a dotted path (a schema fault's field), if it is there."""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(tree, dict) and part in tree:
            if last:
                del tree[part]
                return
            tree = tree[part]
        elif isinstance(tree, list) and part.isdigit() and int(part) < len(tree):
            if last:
                del tree[int(part)]
                return
            tree = tree[int(part)]
        else:
            return


def _with_later_faults(shape: ConfigError, raw: dict[str, Any], workers: int | None,
                       settings: CloudTik | None) -> ConfigError:
    """The schema's faults plus those the later checks (provider options, node types,
    min/max) find in the same file, so one round shows everything wrong."""
    faults = shape.details.get("problems") or [{"field": shape.field}]
    known = {p["field"] for p in faults}
    rest = copy.deepcopy(raw)  # without the faulty values: no fault is reported twice
    for field in known:
        _drop(rest, (field or "").split("."))
    try:
        normalize(rest, workers=workers, settings=settings)
    except ConfigError as later:
        extra = [p for p in later.details.get("problems") or [
            {"field": later.field, "message": later.message}] if p["field"] not in known]
        if extra:
            more = [ConfigError(p["message"], field=p["field"], value=p.get("value"))
                    for p in extra]
            return ConfigError.combine([shape, *more])
    except Exception:  # a malformed file may trip a later stage; the schema said why
        pass
    return shape


def normalize(
    raw: dict[str, Any], *, workers: int | None = None, settings: CloudTik | None = None
) -> dict[str, Any]:
    cfg = copy.deepcopy(raw)
    cfg.setdefault("cluster_name", DEFAULT_CLUSTER_NAME)
    prov = cfg.setdefault("provider", {})
    prov.setdefault("type", settings.default_provider if settings else "local")
    cls = provider_class(prov["type"], settings)
    problems = ConfigProblems()  # independent faults are reported together
    with problems.check():
        validate_against(
            {k: v for k, v in prov.items() if k != "type"},
            _without_type(cls.config_schema), prefix="provider",
        )

    types = cfg.get("available_node_types")
    if not types:
        types = cfg["available_node_types"] = cls.default_node_types(prov)
        cfg.setdefault("head_node_type", "head")
    head = cfg.get("head_node_type")
    if head is None:
        # only worker types declared: the provider's default head serves them
        if "head" not in types:
            types["head"] = cls.default_node_types(prov)["head"]
        head = cfg["head_node_type"] = "head"
    if head not in types:
        problems.raise_any()
        raise ConfigError(
            f"head_node_type: '{head}' is not one of the available_node_types "
            f"({', '.join(types)})",
            field="head_node_type",
            value=head,
        )
    worker_types = [t for t in types if t != head]

    if workers is not None:
        if len(worker_types) != 1:
            raise ConfigError(
                f"workers: the config has {len(worker_types)} worker node types "
                f"({', '.join(worker_types) or 'none'}); set min_workers per type instead",
                field="workers",
            )
        wt = types[worker_types[0]]
        wt["min_workers"] = workers
        wt["max_workers"] = max(int(wt.get("max_workers", workers)), workers)

    for tname, t in types.items():
        path = f"available_node_types.{tname}"
        t.setdefault("node_config", {})
        with problems.check():
            validate_against(t["node_config"], cls.node_config_schema,
                             prefix=f"{path}.node_config")
        res = cls.fill_resources(prov, t)
        for key in ("memory", "disk"):
            if key in res:
                with problems.check():
                    res[key] = parse_bytes(res[key], field=f"{path}.resources.{key}")
        res.setdefault("CPU", 1)
        res.setdefault("GPU", 0)
        t["resources"] = res
        if tname == head:
            t.pop("min_workers", None)
            t.pop("max_workers", None)
            continue
        t.setdefault("min_workers", 0)
        t.setdefault("max_workers", max(t["min_workers"], 1))
        if t["min_workers"] > t["max_workers"]:
            problems.errors.append(ConfigError(
                f"{path}.min_workers: {t['min_workers']} is more than max_workers "
                f"({t['max_workers']})",
                field=f"{path}.min_workers",
                value=t["min_workers"],
            ))
    problems.raise_any()

    total_min = sum(types[t]["min_workers"] for t in worker_types)
    total_max = sum(types[t]["max_workers"] for t in worker_types)
    if "max_workers" not in cfg:
        cfg["max_workers"] = total_max
    if total_min > cfg["max_workers"]:
        raise ConfigError(
            f"max_workers: {cfg['max_workers']} is less than the sum of min_workers "
            f"({total_min})",
            field="max_workers",
            value=cfg["max_workers"],
        )
    limit = settings.max_workers_per_cluster if settings else 0
    if limit and total_min > limit:
        raise ConfigError(
            f"max_workers: {total_min} workers asked for; this installation allows at most "
            f"{limit} per cluster (c.CloudTik.max_workers_per_cluster)",
            field="max_workers",
            value=total_min,
        )
    if limit:
        cfg["max_workers"] = min(cfg["max_workers"], limit)

    cfg.setdefault("idle_timeout_minutes", 0)
    if cfg["idle_timeout_minutes"] is None:
        cfg["idle_timeout_minutes"] = 0
    rt = cfg.setdefault("runtime", {})
    rt.setdefault("types", ["dask"])
    rt.setdefault("dask", {})
    check_runtime_types(rt["types"])  # names the installed runtimes when one is not
    cfg.setdefault("setup_commands", [])
    return cfg


def _without_type(schema: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(schema)
    props = s.get("properties")
    if isinstance(props, dict):
        props.pop("type", None)
    if isinstance(s.get("required"), list):
        s["required"] = [r for r in s["required"] if r != "type"]
    return s


def config_hash(cfg: dict[str, Any]) -> str:
    canonical = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def provisioned_cores(cfg: dict[str, Any], type_name: str,
                      settings: CloudTik | None = None) -> float:
    """Cores a node of ``type_name`` really gets from its provider (a flavor's vCPUs,
    a local worker's threads), not what its ``resources`` declare: what quotas and costs
    count (``NodeProvider.provisioned``)."""
    types = cfg.get("available_node_types") or {}
    cls = provider_class(cfg["provider"]["type"], settings)
    role = "head" if type_name == cfg.get("head_node_type") else "worker"
    return float(cls.provisioned(cfg["provider"], types.get(type_name) or {}, role)["CPU"])


def cluster_cores(cfg: dict[str, Any], workers: dict[str, int],
                  settings: CloudTik | None = None) -> float:
    """Cores of the head and ``workers`` (type -> count), as provisioned."""
    total = provisioned_cores(cfg, cfg["head_node_type"], settings)
    for type_name, count in workers.items():
        total += provisioned_cores(cfg, type_name, settings) * int(count)
    return total


def worker_types(cfg: dict[str, Any]) -> list[str]:
    return [t for t in cfg["available_node_types"] if t != cfg["head_node_type"]]


def config_diff(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> list[str]:
    """Readable differences between two normalised configs: ``path: old -> new``."""
    a, b = _flatten(old), _flatten(new)

    def shown(key: str, value: Any) -> str:
        if key.endswith(".memory") and isinstance(value, int) and not isinstance(value, bool):
            return format_bytes(value)  # 12637995008 says nothing to a person
        return repr(value)

    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            out.append(f"{key}: {shown(key, a.get(key, '<unset>'))} -> "
                       f"{shown(key, b.get(key, '<unset>'))}")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


RUNTIMES_GROUP = "jupyter_cloudtik.runtimes"


def check_runtime_types(types: list[str]) -> None:
    """Every named runtime is installed (an entry point of ``jupyter_cloudtik.runtimes``);
    the error lists the installed ones.  Here in the core, by name only: checking a
    config needs no runtime imported."""
    names = plugins.installed(RUNTIMES_GROUP)
    for i, t in enumerate(types):
        if t not in names:
            raise ConfigError(
                f"runtime.types.{i}: '{t}' is not an installed runtime; installed: "
                f"{', '.join(names) or 'none'}", field=f"runtime.types.{i}", value=t)


def with_worker_size(config: dict[str, Any] | None, default_types: dict[str, Any], *,
                     cores: int | None = None,
                     memory: str | None = None) -> dict[str, Any] | None:
    """``config`` with its worker node type's ``resources`` set from ``--cores`` /
    ``--memory`` (the magics, the CLI, ``Cluster.up(cores=, memory=)``), as the panel's
    New form does: a config without node types gets the provider's defaults
    (``default_types``, from ``GET providers``) with the worker's size changed, so the
    cluster's config is the same whichever face started it."""
    if cores is None and memory is None:
        return config

    field = "cores" if cores is not None else "memory"
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int)
                              or cores < 1):
        raise ConfigError(f"cores: {cores!r} is not a whole number of cores of 1 or more",
                          field="cores", value=cores)
    if memory is not None:
        parse_bytes(memory, field="memory")
    out = copy.deepcopy(config or {})
    types = out.get("available_node_types") or copy.deepcopy(default_types)
    head = out.get("head_node_type", "head")
    workers = [t for t in types if t != head]
    if len(workers) != 1:
        raise ConfigError(
            f"{field}: the config has {len(workers)} worker node types "
            f"({', '.join(workers) or 'none'}); set the size of each in "
            "available_node_types.<type>.resources instead", field=field)
    resources = dict((types[workers[0]] or {}).get("resources") or {})
    if cores is not None:
        resources["CPU"] = cores
    if memory is not None:
        resources["memory"] = memory
    types[workers[0]] = {**(types[workers[0]] or {}), "resources": resources}
    out["available_node_types"] = types
    out.setdefault("head_node_type", head)
    return out
