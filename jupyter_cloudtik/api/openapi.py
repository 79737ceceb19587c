"""The shipped OpenAPI document: served to clients, and the source of the body schemas.

Request bodies are checked against ``components/schemas`` of ``openapi.yaml`` with the
same checker as cluster configs, so the document and the server cannot disagree about what
is accepted, and an error names the field as the client wrote it.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..core.config import validate_against
from ..core.errors import ConfigError


@cache
def spec_text() -> str:
    return resources.files("jupyter_cloudtik.server").joinpath("openapi.yaml").read_text()


@cache
def spec() -> dict[str, Any]:
    return yaml.safe_load(spec_text())


@cache
def spec_json() -> str:
    return json.dumps(spec())


@cache
def _body_schema(name: str) -> dict[str, Any]:
    components = spec()["components"]
    if name not in components["schemas"]:
        raise KeyError(f"openapi.yaml has no schema {name!r}")
    schema = copy.deepcopy(components["schemas"][name])
    # refs point at #/components/...: give them a root to resolve against
    schema["components"] = components
    return schema


def validate_body(data: Any, schema_name: str) -> None:
    """Raise ``ConfigError`` naming the field when ``data`` does not fit the schema."""
    try:
        validate_against(data, _body_schema(schema_name))
    except ConfigError as e:
        if e.field == "(top level)":  # name the body, as the client sees it
            raise ConfigError(e.message.replace("(top level)", "body", 1),
                              field="body") from None
        raise
