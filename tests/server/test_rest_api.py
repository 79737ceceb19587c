"""The REST API against a real JupyterLab: shapes (validated against openapi.yaml), bad
input, live events and their resumption."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from openapi_spec_validator import validate as validate_spec

from jupyter_cloudtik.api import openapi
from jupyter_cloudtik.api.client import parse_sse
from jupyter_cloudtik.api.routes import route_table

from .conftest import checked, unique


def test_openapi_document_is_served_and_valid(lab):
    resp = lab.get("openapi.yaml")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/yaml")
    served = yaml.safe_load(resp.text)
    validate_spec(served)
    assert lab.get("openapi.json").json() == served == openapi.spec()


def test_every_route_is_documented():
    documented = set(openapi.spec()["paths"])
    for path, handler in route_table()[:-1]:  # the last one is the catch-all 404
        template = re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", path).replace(
            r"openapi\.(?P<fmt>yaml|json)", "openapi.yaml")
        assert template in documented, f"{path} ({handler.__name__}) is not in openapi.yaml"


def test_cluster_life_cycle_matches_the_document(lab, spec_checker):
    name = unique("api")
    listing = checked(spec_checker, lab.get("clusters"))
    assert all(c["name"] != name for c in listing.json()["clusters"])

    resp = checked(spec_checker, lab.request("POST", "clusters",
                                             json={"name": name, "workers": 1}))
    assert resp.status_code == 202
    op = resp.json()["operation"]
    assert resp.headers["Location"].endswith(f"/cloudtik/api/operations/{op['id']}")
    assert resp.json()["cluster"] == name and op["kind"] == "cluster.up"
    assert lab.wait_operation(op["id"])["state"] == "succeeded"

    info = checked(spec_checker, lab.get(f"clusters/{name}")).json()
    assert info["state"] == "running" and info["summary"]["workers"] == 1
    live = checked(spec_checker, lab.get(f"clusters/{name}", params={"refresh": "true"}))
    assert live.json()["summary"]["workers"] == 1
    assert [c["name"] for c in checked(spec_checker, lab.get("clusters")).json()["clusters"]
            ].count(name) == 1
    nodes = checked(spec_checker, lab.get(f"clusters/{name}/nodes")).json()["nodes"]
    assert sorted(n["kind"] for n in nodes) == ["head", "worker"]
    logs = checked(spec_checker, lab.get(f"clusters/{name}/logs", params={"tail": 5}))
    assert set(logs.json()["logs"]) >= {n["node_id"] for n in nodes}
    connect = checked(spec_checker, lab.get(f"clusters/{name}/connect")).json()
    assert connect["provider"] == "local"
    assert connect["connect_info"]["scheduler_address"].startswith("tcp://127.0.0.1:")

    events = checked(spec_checker, lab.get(f"operations/{op['id']}/events")).json()
    steps = [e["step"] for e in events["events"]]
    assert steps[0] == "start" and steps[-1] == "succeeded" and "workers" in steps
    ops = checked(spec_checker, lab.get("operations", params={"cluster": name})).json()
    assert [o["id"] for o in ops["operations"]] == [op["id"]]
    assert ops["last_event_id"] >= events["events"][-1]["id"]
    checked(spec_checker, lab.get(f"operations/{op['id']}"))

    scale = checked(spec_checker, lab.request("PATCH", f"clusters/{name}",
                                              json={"workers": 2}))
    assert scale.status_code == 202
    assert lab.wait_operation(scale.json()["operation"]["id"])["state"] == "succeeded"
    assert lab.get(f"clusters/{name}").json()["summary"]["workers"] == 2

    down = checked(spec_checker, lab.request("DELETE", f"clusters/{name}"))
    assert down.status_code == 202
    assert lab.wait_operation(down.json()["operation"]["id"])["state"] == "succeeded"
    stopped = lab.get(f"clusters/{name}").json()
    assert stopped["state"] == "stopped" and stopped["nodes"] == []
    assert all(c["name"] != name for c in lab.get("clusters").json()["clusters"])
    assert name in [c["name"] for c in lab.get("clusters", params={"all": "1"}).json()[
        "clusters"]]


def test_providers_carry_their_config_schema(lab, spec_checker):
    data = checked(spec_checker, lab.get("providers")).json()
    local = next(p for p in data["providers"] if p["name"] == "local")
    assert local["available"] and local["default"]
    assert local["config_schema"]["properties"]["host"]["default"] == "127.0.0.1"
    assert "worker" in local["default_node_types"]
    assert data["default_provider"] == "local"


@pytest.mark.parametrize(("method", "path", "body", "status", "field", "words"), [
    ("POST", "clusters", b'{"name": ', 400, "body", "not valid JSON"),
    ("POST", "clusters", b"[1, 2]", 400, "body", "expected a JSON object"),
    ("POST", "clusters", {"nme": "x"}, 400, "body", "unknown field 'nme'"),
    ("POST", "clusters", {"workers": "two"}, 400, "workers", "'two'"),
    ("POST", "clusters", {"workers": -1}, 400, "workers", "-1"),
    ("POST", "clusters", {"name": "Bad_Name"}, 400, "name", "'Bad_Name' is not allowed"),
    ("POST", "clusters", {"config": {"cluster_name": "Bad_Name"}}, 400, "cluster_name",
     "'Bad_Name' is not allowed"),
    ("POST", "clusters", {"config": {"provider": {"type": "nope"}}}, 400, "provider.type",
     "unknown provider 'nope'"),
    ("POST", "clusters", {"config": {"max_workers": "x"}}, 400, "max_workers", "'x'"),
    ("POST", "clusters", {"workers": 4096}, 409, "workers", "not enough capacity"),
    ("PATCH", "clusters/no-such", {"workers": 1}, 404, "name", "no cluster named 'no-such'"),
    ("PATCH", "clusters/no-such", {"workers": True}, 400, "workers", "True"),
    ("PATCH", "clusters/no-such", {}, 400, "body", "'workers' is a required property"),
    ("DELETE", "clusters/no-such", None, 404, "name", "no-such"),
    ("GET", "clusters/no-such", None, 404, "name", "no-such"),
    ("GET", "clusters/no-such/logs?tail=abc", None, 400, "tail", "'abc'"),
    ("GET", "clusters?all=maybe", None, 400, "all", "'maybe'"),
    ("GET", "operations/no-such", None, 404, "op_id", "no-such"),
    ("DELETE", "operations/no-such", None, 404, "op_id", "no-such"),
    ("GET", "operations?limit=0", None, 400, "limit", "0"),
    ("GET", "nothing/here", None, 404, None, "no API route"),
    ("PUT", "clusters", {}, 405, None, ""),
])
def test_bad_input_is_a_4xx_naming_the_field(lab, spec_checker, method, path, body, status,
                                             field, words):
    kw = {"data": body} if isinstance(body, bytes) else {"json": body}
    resp = lab.request(method, path, **({} if body is None else kw))
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert set(err) == {"message", "reason", "field"}
    assert err["field"] == field
    assert words in err["message"]
    assert "Traceback" not in resp.text
    if not path.startswith("nothing") and method != "PUT":
        checked(spec_checker, resp)


def test_a_config_with_several_faults_names_them_all(lab, spec_checker):
    config = {"idle_timeout_minutes": "soon", "available_node_types": {
        "head": {"resources": {"CPU": 0}},
        "w": {"resources": {"memory": "lots"}, "min_workers": 3, "max_workers": 1}}}
    resp = lab.request("POST", "clusters", json={"name": unique("faults"), "config": config})
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert {p["field"] for p in err["problems"]} == {
        "idle_timeout_minutes", "available_node_types.w.resources.memory",
        "available_node_types.w.min_workers"}
    assert err["field"] == err["problems"][0]["field"]
    assert err["message"].startswith("3 problems in the config: ")
    checked(spec_checker, resp)


def test_oversized_body_is_refused(lab):
    huge = json.dumps({"config": {"setup_commands": ["x" * (2 * 1024 * 1024)]}})
    resp = lab.request("POST", "clusters", data=huge)
    assert resp.status_code == 413
    assert resp.json()["field"] == "body"
    assert "larger than 1048576 bytes" in resp.json()["message"]


def test_event_stream_resumes_without_loss(lab):
    """Read part of a live stream, drop the connection, resume with Last-Event-ID: the
    two parts are exactly the operation's events, each once, in order."""
    name = unique("sse")
    op_id = lab.request("POST", "clusters", json={"name": name, "workers": 1}).json()[
        "operation"]["id"]
    first: list[dict] = []
    with lab.get(f"operations/{op_id}/events", stream=True,
                 headers={"Accept": "text/event-stream"}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for kind, event_id, data in parse_sse(resp.iter_lines(decode_unicode=True)):
            assert kind == "progress" and int(event_id) == json.loads(data)["id"]
            first.append(json.loads(data))
            if len(first) == 2:
                break  # the client goes away mid-operation
    rest: list[dict] = []
    end = None
    with lab.get(f"operations/{op_id}/events", stream=True,
                 headers={"Accept": "text/event-stream",
                          "Last-Event-ID": str(first[-1]["id"])}) as resp:
        for kind, _event_id, data in parse_sse(resp.iter_lines(decode_unicode=True)):
            if kind == "end":
                end = json.loads(data)
                break
            rest.append(json.loads(data))
    assert end is not None and end["state"] == "succeeded"
    everything = lab.get(f"operations/{op_id}/events").json()["events"]
    assert [e["id"] for e in first + rest] == [e["id"] for e in everything]
    # ?after= is the same as Last-Event-ID
    after = lab.get(f"operations/{op_id}/events", params={"after": first[0]["id"]}).json()
    assert [e["id"] for e in after["events"]] == [e["id"] for e in everything[1:]]
    lab.wait_operation(lab.request("DELETE", f"clusters/{name}").json()["operation"]["id"])


def test_all_events_stream_starts_now_and_follows_every_operation(lab):
    start = lab.get("operations").json()["last_event_id"]
    name = unique("all")
    seen: list[dict] = []
    with lab.get("events", stream=True, params={"after": start},
                 headers={"Accept": "text/event-stream"}, timeout=60) as resp:
        op_id = lab.request("POST", "clusters", json={"name": name, "workers": 0}).json()[
            "operation"]["id"]
        for kind, _id, data in parse_sse(resp.iter_lines(decode_unicode=True)):
            event = json.loads(data)
            assert kind == "progress" and event["id"] > start
            seen.append(event)
            if event["op_id"] == op_id and event["step"] == "succeeded":
                break
    mine = [e["id"] for e in seen if e["op_id"] == op_id]
    assert mine == [e["id"] for e in lab.get(f"operations/{op_id}/events").json()["events"]]
    as_json = lab.get("events", params={"after": start}).json()
    assert [e["id"] for e in as_json["events"]][:len(seen)] == [e["id"] for e in seen]
    lab.wait_operation(lab.request("DELETE", f"clusters/{name}").json()["operation"]["id"])


def test_cancel_an_operation(lab, spec_checker):
    name = unique("cancel")
    config = {"setup_commands": ["sleep 30"]}
    op_id = lab.request("POST", "clusters", json={"name": name, "config": config}).json()[
        "operation"]["id"]
    time.sleep(0.5)
    resp = checked(spec_checker, lab.request("POST", f"operations/{op_id}/cancel"))
    assert resp.json()["state"] == "cancelled"
    assert lab.get(f"clusters/{name}").json()["state"] == "failed"
    assert lab.request("DELETE", f"operations/{op_id}").json()["state"] == "cancelled"
    lab.wait_operation(lab.request("DELETE", f"clusters/{name}").json()["operation"]["id"])
