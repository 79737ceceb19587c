"""Property-based tests of the REST API from its OpenAPI document (schemathesis).

Every operation is called with generated input; every answer must conform to the
document and none may be a 5xx.  Runs against the ``guarded`` server, whose limits (one
cluster, one worker) keep whatever the generator starts small.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from jupyter_cloudtik.server import openapi

MAX_EXAMPLES = 15
OPERATIONS = [(method.upper(), path) for path, item in openapi.spec()["paths"].items()
              for method in item if method in ("get", "post", "put", "patch", "delete")]


@pytest.fixture(scope="module")
def api_schema(guarded):
    schema = schemathesis.openapi.from_dict(openapi.spec())
    schema.config.update(base_url=guarded.api_url.rstrip("/"), request_timeout=60)
    return schema, guarded.headers()


@pytest.mark.parametrize(("method", "path"), OPERATIONS,
                         ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_api_conforms_and_never_fails(api_schema, method, path):
    schema, auth = api_schema
    operation = schema[path][method]

    @given(case=operation.as_strategy())
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(headers=auth)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}")
        assert "Traceback" not in response.text
        # a schema-valid body may still be refused for what no schema can say (installed
        # providers, capacity, c.CloudTik limits): such 4xx answers are tested by name in
        # test_rest_api, so that heuristic check is left out here
        case.validate_response(response, excluded_checks=[positive_data_acceptance])

    check()
