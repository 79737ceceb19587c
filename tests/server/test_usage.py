"""Size and price over a cluster's life, recorded by the server: samples on every size
change, and cost so far integrated from them."""

from __future__ import annotations

import time

from .conftest import checked, unique


def test_usage_records_size_changes_and_cost_so_far(lab, spec_checker):
    name = unique("usage")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 1,
                                              "config": {"max_workers": 2}})
    assert r.status_code == 202, r.text
    try:
        assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
        deadline = time.monotonic() + 20
        u = lab.get(f"clusters/{name}/usage").json()
        while not any(s["workers"] == 1 for s in u["samples"]):
            assert time.monotonic() < deadline, u
            time.sleep(0.5)
            u = lab.get(f"clusters/{name}/usage").json()
        r = lab.request("PATCH", f"clusters/{name}", json={"workers": 2})
        assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
        deadline = time.monotonic() + 20
        while not any(s["workers"] == 2 for s in u["samples"]):
            assert time.monotonic() < deadline, u
            time.sleep(0.5)
            u = lab.get(f"clusters/{name}/usage").json()
        # the workers' load, from the scheduler's metrics (every 10 s), in the schema
        deadline = time.monotonic() + 40
        while not any(s["cpu"] is not None for s in u["samples"]):
            assert time.monotonic() < deadline, u
            time.sleep(0.5)
            u = lab.get(f"clusters/{name}/usage").json()
        u = checked(spec_checker, lab.get(f"clusters/{name}/usage")).json()
        load = [s for s in u["samples"] if s["cpu"] is not None]
        assert all(0 <= s["cpu"] <= 100 and s["memory"] > 0 for s in load), load
        ats = [s["at"] for s in u["samples"]]
        assert ats == sorted(ats)
        info = lab.get(f"clusters/{name}").json()
        assert u["cost_per_hour"] == info["summary"]["cost_per_hour"]
        if u["cost_per_hour"]:
            assert u["cost_so_far"] > 0
        assert u["cost_so_far"] >= 0
        assert lab.get("clusters/nope/usage").status_code == 404
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])
