"""Workspace routes of the REST API against a real JupyterLab and the Huawei Cloud
emulator: create with credentials in the body, follow the operation, read, delete."""

from __future__ import annotations

import json

import pytest

from cloudtik_emulators.huaweicloud import Emulator, Options

from .conftest import unique


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    e = Emulator(tmp_path_factory.mktemp("emu"), Options(boot=False)).start()
    e.cloud.set_options({"bucket_release_seconds": 0})  # names are made again
    yield e
    e.stop()


def test_workspace_life_cycle_over_rest(lab, emu):
    name = unique("ws").replace("_", "-")[:20]
    o = emu.options
    body = {"name": name, "provider": "huaweicloud",
            "config": {"provider": {"region": o.region, "endpoint": emu.endpoint,
                                    "allowed_ssh_sources": ["127.0.0.1/32"],
                                    "credentials": {"access_key": o.access_key,
                                                    "secret_key": o.secret_key,
                                                    "project_id": o.project_id}}}}
    resp = lab.request("POST", "workspaces", json=body)
    assert resp.status_code == 202, resp.text
    assert resp.headers["Location"].endswith(resp.json()["operation"]["id"])
    op = lab.wait_operation(resp.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    events = lab.get(f"operations/{op['id']}/events").json()["events"]
    # the bucket first: its global name is the step most likely refused (docs/huaweicloud.md)
    assert [e["step"] for e in events if e["step"] in ("vpc", "nat", "storage")] == [
        "storage", "vpc", "nat"]

    info = lab.get(f"workspaces/{name}").json()
    assert info["state"] == "ready" and info["resources"]["vpc_id"]
    status = lab.get(f"workspaces/{name}", params={"refresh": "true"}).json()
    assert status["healthy"] is True
    assert name in [w["name"] for w in lab.get("workspaces").json()["workspaces"]]
    answers = json.dumps([info, status, events, lab.get("workspaces").json()])
    assert o.secret_key not in answers and o.access_key not in answers

    # a second create with another config is a conflict, named
    body2 = {**body, "config": {"provider": {**body["config"]["provider"],
                                             "vpc_cidr": "10.1.0.0/16"}}}
    r = lab.request("POST", "workspaces", json=body2)
    assert r.status_code == 409 and r.json()["reason"] == "conflict"

    resp = lab.request("DELETE", f"workspaces/{name}")
    assert resp.status_code == 202
    assert lab.wait_operation(resp.json()["operation"]["id"])["state"] == "succeeded"
    assert lab.get(f"workspaces/{name}").json()["state"] == "deleted"
    assert emu.cloud.summary()["vpcs"] == []


@pytest.mark.parametrize("body,field", [
    ({"name": "Bad Name"}, "name"),
    ({"name": "ok", "provider": "nocloud"}, "provider.type"),
    ({"name": "ok", "provider": "huaweicloud", "config": {"provider": {"region": "x"}}},
     "provider.region"),
    ({"name": "ok", "extra": 1}, "body"),
])
def test_bad_workspace_requests_name_the_field(lab, body, field):
    r = lab.request("POST", "workspaces", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field or field in r.json()["message"]


def test_unknown_workspace_is_404(lab):
    r = lab.get("workspaces/nope-nothing")
    assert r.status_code == 404 and r.json()["reason"] == "not_found"
