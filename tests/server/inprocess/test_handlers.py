"""Validation, auth and error paths of representative handlers, per test, in a
pytest-jupyter server in this process (the end-to-end twins: tests/server/test_rest_api.py,
test_permissions.py, test_storage_api.py).  Every refusal is a JSON body naming the field,
the bad value and what is allowed, never a traceback."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError


async def _refused(jp_fetch, *parts, **kwargs) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("cloudtik", "api", *parts, **kwargs)
    body = json.loads(e.value.response.body)
    assert set(body) == {"message", "reason", "field"}
    assert "Traceback" not in body["message"]
    return e.value.code, body


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"workers": -1}, "workers", "-1 is less than the minimum of 0"),
    ({"name": "Bad Name!"}, "name", "Lower-case letters, digits and '-'"),
    ({"workers": "two"}, "workers", "'two'"),
])
async def test_a_bad_cluster_body_is_a_400_naming_the_field(jp_fetch, cloudtik, body, field,
                                                            says):
    code, answer = await _refused(jp_fetch, "clusters", method="POST", body=json.dumps(body))
    assert (code, answer["reason"], answer["field"]) == (400, "invalid", field)
    assert says in answer["message"]
    assert cloudtik.manager.list(include_stopped=True) == []  # nothing was started


async def test_a_body_that_is_not_json_is_a_400(jp_fetch):
    code, answer = await _refused(jp_fetch, "clusters", method="POST", body="{not json")
    assert (code, answer["field"]) == (400, "body")
    assert answer["message"].startswith("body: not valid JSON")


@pytest.mark.parametrize(("body", "says"), [
    ('{"config":' + "[" * 3000 + "]" * 3000 + "}", "nested more than 64"),  # RecursionError
    ('{"name": "a", "config": {"runtime": {"dask": {"x": NaN}}}}', "NaN"),   # stored as NaN
    ('{"name": "\\ud800"}', "lone surrogate"),
])
async def test_a_body_that_is_not_plain_json_is_a_400(jp_fetch, cloudtik, body, says):
    """Found by fuzz/fuzz_rest_body.py: these were a 500, or accepted."""
    code, answer = await _refused(jp_fetch, "clusters", method="POST", body=body)
    assert (code, answer["field"]) == (400, "body") and says in answer["message"]
    assert cloudtik.manager.list(include_stopped=True) == []


@pytest.mark.parametrize(("value", "says"), [("abc", "'abc' is not a whole number"),
                                             ("0", "0 is outside 1..1000")])
async def test_a_bad_query_argument_is_a_400_naming_it(jp_fetch, value, says):
    code, answer = await _refused(jp_fetch, "operations", params={"limit": value})
    assert (code, answer["field"]) == (400, "limit")
    assert answer["message"] == f"limit: {says}"


async def test_an_unknown_cluster_is_a_404_naming_it(jp_fetch):
    code, answer = await _refused(jp_fetch, "clusters", "nope")
    assert (code, answer["reason"], answer["field"]) == (404, "not_found", "name")
    assert "'nope'" in answer["message"]


async def test_an_unknown_route_is_a_json_404_with_the_path(jp_fetch, jp_base_url):
    code, answer = await _refused(jp_fetch, "no-such-route")
    assert (code, answer["reason"]) == (404, "not_found")
    # the path as sent, '%' not doubled
    assert answer["message"] == f"no API route GET {jp_base_url}cloudtik/api/no-such-route"


async def test_without_a_token_every_route_is_refused(jp_fetch):
    for path in (("clusters",), ("storages",), ("no-such-route",)):
        code, answer = await _refused(jp_fetch, *path, headers={"Authorization": ""})
        assert (code, answer["reason"]) == (403, "forbidden")
        assert answer["message"].startswith("not authenticated")


async def test_the_kernel_token_lists_clusters_but_may_not_add_a_storage(jp_fetch, cloudtik):
    kernel = {"Authorization": f"token {cloudtik.kernel_token}"}
    r = await jp_fetch("cloudtik", "api", "clusters", headers=kernel)
    assert json.loads(r.body) == {"clusters": []}
    code, answer = await _refused(jp_fetch, "storages", method="POST", headers=kernel,
                                  body=json.dumps({"name": "s", "backend": "local"}))
    assert (code, answer["field"]) == (403, "token")
    assert "adding a storage" in answer["message"]
    # the kernel token is accepted by the cloudtik routes only, not by Jupyter's own
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "contents", headers=kernel)
    assert e.value.code == 403


async def test_an_unknown_storage_backend_is_a_400_naming_it(jp_fetch, cloudtik):
    code, answer = await _refused(jp_fetch, "storages", method="POST",
                                  body=json.dumps({"name": "s", "backend": "nope"}))
    assert (code, answer["field"]) == (400, "backend")
    assert answer["message"] == "backend: 'nope' is not an rclone backend"
