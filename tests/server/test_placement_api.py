"""Placement in the server extension: zones and reservations behind Jupyter's auth,
checked against openapi.yaml, and a standalone parent zone using this server as its child."""

from __future__ import annotations

import json
import socket

import pytest
import requests
import yaml
from openapi_core import OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse

from jupyter_cloudtik.testing.zones import start_zone

REQUEST = {"count": 2, "resources": {"CPU": 1}, "user": "ann", "cluster": "zoned",
           "weighers": {"cost": 1.0, "spread": 0.0, "anti_affinity": 0.0}}


@pytest.fixture(scope="module")
def spec(lab):
    served = yaml.safe_load(lab.get("openapi.yaml").text)
    served["servers"] = [{"url": lab.api_url.rstrip("/")}]
    return OpenAPI.from_dict(served)


def checked(spec, resp: requests.Response) -> requests.Response:
    spec.validate_response(RequestsOpenAPIRequest(resp.request), RequestsOpenAPIResponse(resp))
    return resp


def test_select_boot_and_reservation_through_the_extension(lab, spec):
    sel = checked(spec, lab.request("POST", "zones/select", json={"request": REQUEST}))
    assert sel.status_code == 200, sel.text
    [opt] = sel.json()["options"]  # this machine, as one offer
    assert opt["count"] == 2 and opt["price_per_hour"] == 0.0
    boot = checked(spec, lab.request("POST", "zones/boot", json={
        "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}]}))
    assert boot.status_code == 200, boot.text
    rid = boot.json()["reservation_id"]
    res = checked(spec, lab.get(f"reservations/{rid}"))
    assert res.json()["instances"] == 2 and res.json()["source"] == "zone"
    assert "offer" not in res.json()["claims"][0]
    again = checked(spec, lab.request("POST", "zones/boot", json={
        "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}]}))
    assert again.status_code == 400 and again.json()["reason"] == "hint_refused"
    rel = checked(spec, lab.request("POST", "zones/release", json={"reservation_id": rid}))
    assert rel.json()["state"] == "released"

    bad = checked(spec, lab.request("POST", "zones/select", json={"request": {"count": 0}}))
    assert bad.status_code == 400 and bad.json()["field"] == "request.count"
    missing = checked(spec, lab.get("reservations/nope"))
    assert missing.status_code == 404
    anonymous = requests.post(lab.api_url + "zones/select", json={"request": REQUEST},
                              timeout=30)
    assert anonymous.status_code == 403


def test_a_parent_zone_places_into_this_server(lab, tmp_path):
    parent = start_zone(tmp_path, "parent", [], "tok-parent")
    try:
        out = parent.cli("zone", "add", "lab", lab.url, "--token-env", "LAB_TOKEN",
                         env={"LAB_TOKEN": lab.token})
        assert out.returncode == 0, out.stderr
        status, sel = parent.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST})
        assert status == 200 and sel["skipped"] == [], sel
        [opt] = sel["options"]
        status, boot = parent.call("POST", "/cloudtik/api/zones/boot", {
            "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}]})
        assert status == 200, boot
        [part] = json.loads(parent.cli("reservations", "show", boot["reservation_id"],
                                       "--json").stdout)["remote"]
        assert part["zone"] == "lab" and part["count"] == 2
        child = lab.get(f"reservations/{part['remote_id']}").json()
        assert child["instances"] == 2 and child["state"] == "active"
        # the parent knows counts and prices, not the child's offers
        db = b"".join(f.read_bytes() for f in parent.state_dir.glob("state.db*"))
        assert f"local/{socket.gethostname()}".encode() not in db
        status, _ = parent.call("POST", "/cloudtik/api/zones/release",
                                {"reservation_id": boot["reservation_id"]})
        assert status == 200
        assert lab.get(f"reservations/{part['remote_id']}").json()["state"] == "released"
    finally:
        parent.stop()
