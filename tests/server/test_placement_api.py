"""Placement in the server extension: zones and reservations behind Jupyter's auth,
checked against openapi.yaml, and a standalone parent zone using this server as its child."""

from __future__ import annotations

import json
import socket

import requests

from cloudtik_emulators.zones import start_zone

from .conftest import checked

REQUEST = {"count": 2, "resources": {"CPU": 1}, "user": "ann", "cluster": "zoned",
           "weighers": {"cost": 1.0, "spread": 0.0, "anti_affinity": 0.0}}
NODE = {"runtime": {"role": "head"}}  # each instance: one `dask scheduler` process


def test_select_boot_and_reservation_through_the_extension(lab, spec_checker):
    sel = checked(spec_checker, lab.request("POST", "zones/select", json={"request": REQUEST}))
    assert sel.status_code == 200, sel.text
    [opt] = sel.json()["options"]  # this machine, as one offer
    assert opt["count"] == 2 and opt["price_per_hour"] == 0.0
    boot = checked(spec_checker, lab.request("POST", "zones/boot", json={
        "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}],
        "node_config": NODE}))
    assert boot.status_code == 200, boot.text
    rid = boot.json()["reservation_id"]
    res = checked(spec_checker, lab.get(f"reservations/{rid}"))
    assert res.json()["instances"] == 2 and res.json()["source"] == "zone"
    assert "offer" not in res.json()["claims"][0]
    # boot created the nodes: the server's local provider runs them
    servers = checked(spec_checker, lab.get(f"servers?reservation_id={rid}"))
    assert servers.status_code == 200, servers.text
    assert [s["state"] for s in servers.json()["servers"]] == ["running", "running"]
    assert all(s["node_id"].startswith(f"zone-{rid}-head-") for s in servers.json()["servers"])
    again = checked(spec_checker, lab.request("POST", "zones/boot", json={
        "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}]}))
    assert again.status_code == 400 and again.json()["reason"] == "hint_refused"
    rel = checked(spec_checker, lab.request("POST", "zones/release", json={"reservation_id": rid}))
    assert rel.json()["state"] == "released"
    after = checked(spec_checker, lab.get(f"servers?reservation_id={rid}")).json()["servers"]
    assert [s["state"] for s in after] == ["terminated", "terminated"]

    bad = checked(spec_checker, lab.request("POST", "zones/select", json={"request": {"count": 0}}))
    assert bad.status_code == 400 and bad.json()["field"] == "request.count"
    missing = checked(spec_checker, lab.get("reservations/nope"))
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
            "request": REQUEST, "hints": [{"hint": opt["hint"], "count": 2}],
            "node_config": NODE}, timeout=120)
        assert status == 200, boot
        shown = json.loads(parent.cli("reservations", "show", boot["reservation_id"],
                                      "--json").stdout)
        assert [(s["zone"], s["state"]) for s in shown["servers"]] == [("lab", "running")] * 2
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
        after = lab.get(f"servers?reservation_id={part['remote_id']}").json()["servers"]
        assert [s["state"] for s in after] == ["terminated", "terminated"]
    finally:
        parent.stop()
