"""REST request bodies (api/base.py ``parse_json_body``): every POST/PUT/PATCH of the
cloudtik API — clusters, jobs, storages, workspaces, hub resources, zones — is parsed here
and checked against its schema in openapi.yaml before any handler sees it.

Properties: any bytes give a dict that fits the schema or a ``ConfigError`` naming the field
(a 400), never another exception (a 500): no ``RecursionError`` for deeply nested JSON, no
crash on NaN/Infinity, lone surrogates or odd keys; what is accepted is plain JSON again
(``json.dumps`` with ``allow_nan=False`` works, so answers echoing it are JSON too).
"""

from __future__ import annotations

import json

from _harness import choose, instrumented, main

with instrumented():
    from jupyter_cloudtik.api.base import parse_json_body
    from jupyter_cloudtik.core.errors import ConfigError

SCHEMAS = ["ClusterAdapt", "ClusterCreate", "ClusterScale", "HubEgressRule", "HubQuota",
           "HubResource", "JobFetch", "JobSubmit", "StorageCreate", "StorageMount",
           "StorageTransfer", "WorkspaceCreate", "ZoneBoot", "ZoneRelease", "ZoneSelect"]


def one(data: bytes) -> None:
    which, raw = choose(data, len(SCHEMAS))
    try:
        body = parse_json_body(raw, SCHEMAS[which])
    except ConfigError as e:
        assert e.field, e
        return
    assert isinstance(body, dict)
    json.dumps(body, allow_nan=False)


if __name__ == "__main__":
    main(one)
