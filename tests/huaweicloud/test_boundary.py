"""A cluster's boundary is its exact tag: `down` of cluster ``ana`` never touches a server
of cluster ``analysis``, though the cloud's tag filter matches by "contains" (the emulator
takes that, the stricter reading of ListServersDetails' ``tags`` docstring)."""

from __future__ import annotations

import json

from hwc_helpers import cluster_config, leftovers, workspace_config


def test_down_of_ana_never_touches_analysis(hwc, core):
    ws = "boundary"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    try:
        core.run(core.clusters.up(cluster_config("analysis", ws, workers=1)))
        core.run(core.clusters.up(cluster_config("ana", ws, workers=1)))

        def servers(cluster):
            return {s["id"] for s in hwc.ctl.state()["servers"]
                    if s["tags"].get("cloudtik-cluster-name") == cluster}

        theirs = servers("analysis")
        assert len(theirs) == 2 and len(servers("ana")) == 2
        # the cloud's own filter would hand us both clusters
        mark = hwc.ctl.last_request()
        assert core.clusters.get("ana").running_workers == 1
        core.run(core.clusters.down("ana"))
        assert servers("ana") == set()
        assert servers("analysis") == theirs
        deleted = {s["id"] for r in hwc.ctl.requests(mark)
                   if r["action"] == "ecs.delete_servers"
                   for s in json.loads(r["body"])["servers"]}
        assert deleted and not deleted & theirs
        tagged = {x["resource_id"] for r in hwc.ctl.requests(mark)
                  if r["action"] == "tms.create_resource_tag"
                  for x in json.loads(r["body"])["resources"]}
        assert not tagged & theirs
        assert core.clusters.get("analysis").running_workers == 1
    finally:
        core.run(core.clusters.down("ana"))
        core.run(core.clusters.down("analysis"))
        core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
