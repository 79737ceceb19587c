"""Ids on a real single-user server (issue 12, item 3): job and operation ids are found by
their text or a unique beginning of it, SQL wildcards are not patterns, and a missing id's
answer lists no other id."""

from __future__ import annotations


def test_ids_are_text_not_patterns(lab):
    r = lab.request("POST", "jobs", json={"command": ["echo", "ids"]})
    assert r.status_code == 202, r.text
    job, op = r.json()["job"], r.json()["operation"]
    known = [j["id"] for j in lab.get("jobs").json()["jobs"]]
    known += [o["id"] for o in lab.get("operations", params={"limit": 1000}).json()[
        "operations"]]
    assert lab.get(f"jobs/{job['id'][:5]}").json()["id"] == job["id"]
    assert lab.get(f"operations/{op['id'][:6]}").json()["id"] == op["id"]
    events = lab.get(f"operations/{op['id'][:6]}/events").json()
    assert events["operation"]["id"] == op["id"] and events["events"]
    for route in ("jobs", "operations"):
        # before: jobs/% matched every job (LIKE '%%'), and the 404 listed recent job ids
        for hostile in ("%25", "_", "%25%25", "_%25", "%5F%5F", "zzzz"):
            r = lab.get(f"{route}/{hostile}")
            assert r.status_code == 404, (route, hostile, r.text)
            assert r.json()["reason"] == "not_found"
            assert not [i for i in known if i in r.text], r.text
