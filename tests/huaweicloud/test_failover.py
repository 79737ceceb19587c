"""Failover: a zone whose hosts are full (while the cloud still lists the flavor there)
refuses the nodes at create time; they land in another zone, and the refused offer ranks
lower for the next placement."""

from __future__ import annotations

import json

from hwc_helpers import cluster_config, leftovers, workspace_config

FLAVOR = "s6.medium.2"


def test_nodes_fail_over_to_a_zone_with_capacity(hwc, core, faults):
    ws = "failover"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    zones = [f"{hwc.info['region']}{z}" for z in "abc"]
    full = zones[:2]  # only the third zone has room, though all three are listed
    faults.set_options(full_hosts=[[FLAVOR, z] for z in full])
    try:
        first = hwc.ctl.last_request()
        info = core.run(core.clusters.up(cluster_config("fo1", ws, workers=2)))
        assert info.state == "running" and info.running_workers == 2

        servers = [s for s in hwc.ctl.state()["servers"]
                   if s["tags"].get("cloudtik-cluster-name") == "fo1"]
        assert len(servers) == 3
        assert {s["zone"] for s in servers} == {zones[2]}

        # the cloud really refused creates in the full zones first
        refused = [r for r in hwc.ctl.requests(first)
                   if r["action"] == "ecs.create_post_paid_servers" and r["status"] == 400]
        assert refused, "no create was refused: the test did not exercise failover"
        assert {r["error"] for r in refused} == {"Ecs.0319"}
        assert {json.loads(r["body"])["server"]["availability_zone"] for r in refused} <= set(
            full)

        # the placement shows where each node went; refused offers are remembered
        for node in info.nodes:
            place = node.info.get("placement") or {}
            assert place.get("availability_zone") == zones[2], node
        failures = core.clusters.placement.reservations.recent_failures()
        assert any(zones[0] in k or zones[1] in k for k in failures), failures
        events = [e.message for op in core.clusters.ops.list(target="cluster:fo1")
                  for e in core.clusters.ops.events(op.id)]
        assert any("refused" in m and "placing them elsewhere" in m for m in events), events

        # scaling up goes straight to the zone that worked: no new refusal
        mark = hwc.ctl.last_request()
        core.run(core.clusters.scale("fo1", 3))
        again = [r for r in hwc.ctl.requests(mark)
                 if r["action"] == "ecs.create_post_paid_servers"]
        assert again and all(r["status"] == 200 for r in again), again
    finally:
        faults.set_options(full_hosts=[])
        core.run(core.clusters.down("fo1"))
        core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
