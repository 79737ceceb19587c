"""Which fields of a cluster config name something a policy must decide on.

The cluster schema (``core/schemas/cluster.schema.json``) and each provider's
``node_config_schema`` mark such fields with ``"x-cloudtik-names": KIND``:

* ``storage`` — a storage (``storage.remotes``): its credentials go to the nodes;
* ``image`` — a machine image (a Huawei node type's ``image_id``);
* ``package`` — a requirement, or a folder on the machine that builds the wheels
  (``runtime.pip``);
* ``node-path`` — a path on the nodes (Spark's ``storage_root``);
* ``command`` — shell or program options run on the nodes (``setup_commands``, Dask's
  options).

``named_values`` walks a config along the schema and yields every marked value with its
field path, so a policy sees every field that names something — a field added to the
schema without a mark is caught by ``tests/hub/test_generated_attacks.py``, which walks
every string field of the schemas and asks that each is marked or known to name nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MARK = "x-cloudtik-names"


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        return _resolve({**node, **{k: v for k, v in schema.items() if k != "$ref"}}, root)
    return schema


def walk(schema: dict[str, Any], value: Any, path: str = "",
         root: dict[str, Any] | None = None,
         extra: dict[str, dict[str, Any]] | None = None
         ) -> Iterator[tuple[str, str, Any]]:
    """(field path, kind, value) of every marked value in ``value``.  ``extra`` maps a
    field path pattern (``available_node_types.*.node_config``) to the schema that
    replaces the generic one there (a provider's own)."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    pattern = _pattern(path)
    if extra and pattern in extra:
        yield from walk(extra[pattern], value, path, extra[pattern], None)
        return
    kind = schema.get(MARK)
    if kind and not isinstance(value, (dict, list)):
        yield path, kind, value
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            if isinstance(sub, dict):
                yield from walk(sub, item, f"{path}.{key}" if path else str(key), root, extra)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                yield from walk(items, item, f"{path}[{i}]", root, extra)


def _pattern(path: str) -> str:
    """``available_node_types.worker.node_config`` → ``available_node_types.*.node_config``
    (node type names are the user's)."""
    parts = path.split(".")
    if len(parts) >= 2 and parts[0] == "available_node_types":
        parts[1] = "*"
    return ".".join(parts)


def named_values(cfg: dict[str, Any], provider_cls: Any = None
                 ) -> Iterator[tuple[str, str, Any]]:
    """Every value of a cluster config that names something, with its field path."""
    # deferred: start-up (core.config ~42 ms, loads importlib.metadata, yaml)
    from .config import cluster_schema

    extra = {}
    if provider_cls is not None:
        extra["available_node_types.*.node_config"] = provider_cls.node_config_schema
    yield from walk(cluster_schema(), cfg, extra=extra)
