"""Faults while bringing clusters up and down on the emulated cloud.

Each case either completes (retries, replacing what the cloud could not make) or fails
with the cloud's code and message; after `down` no server of the cluster is left.
"""

from __future__ import annotations

import json
import sys

import pytest
from hwc_helpers import cluster_config, workspace_config

from jupyter_cloudtik.core.errors import CapacityError, ConfigError, NodeLaunchError

WS = "nodefaults"


@pytest.fixture
def ws(hwc, core, faults):
    core.run(core.workspaces.create(WS, workspace_config(hwc)))
    yield WS
    for c in core.clusters.list():
        core.run(core.clusters.down(c.name))
    assert _servers(hwc, WS) == []
    core.run(core.workspaces.delete(WS))


def _servers(hwc, ws: str, cluster: str | None = None) -> list[dict]:
    return [s for s in hwc.ctl.state()["servers"]
            if s["tags"].get("cloudtik-workspace") == ws
            and (cluster is None or s["tags"].get("cloudtik-cluster-name") == cluster)]


def _creates(hwc, after: int) -> list[dict]:
    return [r for r in hwc.ctl.requests(after) if r["action"] == "ecs.create_post_paid_servers"]


@pytest.mark.parametrize("action,kind,times", [
    ("ecs.create_post_paid_servers", "throttle", 2),
    ("ecs.create_post_paid_servers", "lost_response", 1),
    ("ecs.show_job", "error", 2),
    ("ecs.list_servers_details", "error", 1),
    ("ecs.batch_create_server_tags", "throttle", 1),
])
def test_up_completes_after_transient_faults(hwc, core, ws, faults, action, kind, times):
    mark = hwc.ctl.last_request()
    faults.inject(action, kind, times=times)
    info = core.run(core.clusters.up(cluster_config("nf", ws, workers=1)))
    assert info.running_workers == 1
    assert len(_servers(hwc, ws, "nf")) == 2  # a lost create answer made no duplicates
    if kind == "lost_response":
        tokens = [r["client_token"] for r in _creates(hwc, mark)]
        assert len(tokens) == 3 and tokens[0] == tokens[1]  # the retry reused the token


def test_half_failed_batch_is_completed(hwc, core, ws, faults):
    mark = hwc.ctl.last_request()
    faults.inject("ecs.create_post_paid_servers", "half_fail", after=1)  # the workers' batch
    info = core.run(core.clusters.up(cluster_config("half", ws, workers=2)))
    assert info.running_workers == 2
    counts = [json.loads(r["body"])["server"]["count"] for r in _creates(hwc, mark)]
    assert counts == [1, 2, 1]  # head, the batch (one failed), the missing one again


def test_servers_landing_in_error_are_replaced(hwc, core, ws, faults):
    faults.inject("ecs.create_post_paid_servers", "server_error", after=1)
    info = core.run(core.clusters.up(cluster_config("err", ws, workers=2)))
    assert info.running_workers == 2
    assert all(s["status"] == "ACTIVE" for s in _servers(hwc, ws, "err"))


def test_quota_refusal_is_a_node_launch_error(hwc, core, ws, faults):
    # every offer (flavor x zone) refuses: placement fails over, then gives up
    faults.inject("ecs.create_post_paid_servers", "quota", after=1, times=100)
    with pytest.raises(NodeLaunchError) as e:
        core.run(core.clusters.up(cluster_config("quota", ws, workers=2)))
    assert "Ecs.0001" in e.value.message and "Quota exceeded" in e.value.message
    assert core.clusters.get("quota").state == "failed"
    core.run(core.clusters.down("quota"))
    assert _servers(hwc, ws, "quota") == []


def test_quota_is_checked_before_anything_starts(hwc, core, ws, faults):
    faults.set_options(quotas={"instances": 2})
    with pytest.raises(CapacityError, match="quota"):
        core.run(core.clusters.up(cluster_config("small", ws, workers=3)))
    assert _servers(hwc, ws, "small") == []


def test_broken_servers_are_replaced_by_up_and_deleted_by_down(hwc, core, ws, faults):
    info = core.run(core.clusters.up(cluster_config("brk", ws, workers=2)))
    worker = next(n.node_id for n in info.nodes if n.kind == "worker")
    faults.crash(worker, "ERROR")
    status = core.run(core.clusters.status("brk"))
    assert status.state == "degraded"
    assert any(n.node_id == worker and n.status == "broken" for n in status.nodes)
    info = core.run(core.clusters.up(cluster_config("brk", ws, workers=2)))
    assert info.running_workers == 2
    assert worker not in {s["id"] for s in _servers(hwc, ws, "brk")}
    # a server that is SHUTOFF is still deleted by down
    faults.crash(next(n.node_id for n in info.nodes if n.kind == "worker"), "SHUTOFF")
    faults.inject("ecs.delete_servers", "error", times=1)
    core.run(core.clusters.down("brk"))
    assert _servers(hwc, ws, "brk") == []


@pytest.mark.parametrize("option, code", [
    ("full_hosts", "Ecs.0319"),             # capacity: every zone is full (though listed)
    ("image_flavor_refusals", "Ecs.0007"),  # the image cannot boot on the flavor
])
def test_refusals_everywhere_reach_the_user_as_one_line(hwc, core, ws, faults, option,
                                                          code):
    """Placement tries every zone; when all refuse, the user reads one line naming what was
    asked (role, flavor, zone) and the cloud's code and message; nothing is left."""
    flavor = "s6.medium.2"
    zones = [f"{hwc.info['region']}{z}" for z in "abc"]
    py = "{}.{}".format(*sys.version_info[:2])  # the default image: the client's Python
    default = next(i["name"] for i in hwc.ctl.state()["images"] if i["python"] == py
                   and i["arch"] == "x86" and i["env"] == "FusionCompute")
    value = ([[flavor, z] for z in zones] if option == "full_hosts" else [[default, "s6"]])
    faults.set_options(**{option: value})
    mark = hwc.ctl.last_request()
    try:
        with pytest.raises(NodeLaunchError) as e:
            core.run(core.clusters.up(cluster_config("refused", ws, workers=1)))
    finally:
        faults.set_options(**{option: []})
    msg = e.value.message
    assert "\n" not in msg and code in msg and flavor in msg, msg
    assert "HTTP 400" in msg, msg
    tried = {json.loads(r["body"])["server"].get("availability_zone")
             for r in hwc.ctl.requests(mark) if r["action"] == "ecs.create_post_paid_servers"}
    assert len(tried) == 3, tried  # failed over through every zone before giving up
    core.run(core.clusters.down("refused"))
    assert _servers(hwc, ws, "refused") == []


@pytest.mark.parametrize("sale, said", [
    ({"status": "normal", "charge": "period"}, "sold only monthly/yearly"),
    ({"status": "sellout", "az": {}}, "is not sold now (sellout in"),
])
def test_a_configured_flavor_not_sold_is_refused_before_any_server(hwc, core, ws, faults,
                                                                    sale, said):
    """A flavor the config names that the region sells only monthly, or has sold out
    everywhere (the region-level status: no zone is named), is refused in one line naming
    the field before anything is created (it used to be offered and its create failed)."""
    faults.set_options(flavor_sale={"s6.medium.2": sale})
    mark = hwc.ctl.last_request()
    try:
        with pytest.raises(ConfigError) as e:
            core.run(core.clusters.up(cluster_config("unsold", ws, workers=1)))
    finally:
        faults.set_options(flavor_sale={})
    assert said in e.value.message and "\n" not in e.value.message, e.value.message
    assert e.value.field.endswith(".node_config.flavor"), e.value.field
    assert _creates(hwc, mark) == []
    assert _servers(hwc, ws, "unsold") == []


def test_an_image_without_the_clients_python_is_refused_before_any_server(hwc, core, ws):
    """A node type naming an image whose python3 is not the client's major.minor (Ubuntu
    22.04: 3.10) is refused in one line naming its image_id, before any server is made
    (the nodes used to refuse it at boot, after the servers were made and billed); the
    default image of the same cluster is the one with the client's Python."""
    jammy = next(i["id"] for i in hwc.ctl.state()["images"]
                 if i["name"] == "Ubuntu 22.04 server 64bit")
    cfg = cluster_config("oldpy", ws, workers=1)
    cfg["available_node_types"]["worker"]["node_config"]["image_id"] = jammy
    mark = hwc.ctl.last_request()
    with pytest.raises(ConfigError) as e:
        core.run(core.clusters.up(cfg))
    msg = e.value.message
    assert e.value.field == "available_node_types.worker.node_config.image_id", e.value.field
    assert "has Python 3.10 and the client has Python 3." in msg and "\n" not in msg, msg
    assert _creates(hwc, mark) == [] and _servers(hwc, ws, "oldpy") == []


def test_wheels_of_another_platform_are_refused_before_any_server(hwc, core, ws, env):
    """The client stages the wheels pip made on its own platform: a macOS client's
    msgpack wheel (the same file, as a macOS pip would name it in the wheel cache) would
    be refused by every Linux node at boot; ``up`` refuses it before the head is made."""
    from jupyter_cloudtik.runtime import environment

    cache = env / "wheels"
    wheels = environment.wheels_for(environment.closure(list(environment.CHECKED)), cache)
    linux = next(w for w in wheels if w.name.startswith("msgpack-"))
    name, version = linux.name.split("-")[:2]
    mac = cache / f"{name}-{version}-cp311-cp311-macosx_11_0_arm64.whl"
    linux.rename(mac)
    mark = hwc.ctl.last_request()
    with pytest.raises(ConfigError) as e:
        core.run(core.clusters.up(cluster_config("macwheels", ws, workers=1)))
    msg = e.value.message
    assert e.value.field == "runtime" and "\n" not in msg, msg
    assert f"the wheel {mac.name} is for macosx_11_0_arm64, the nodes are Linux x86_64" \
        in msg, msg
    assert _creates(hwc, mark) == [] and _servers(hwc, ws, "macwheels") == []


def test_eips_are_of_a_type_the_region_has(hwc, core):
    """A region without 5_bgp (here only 5_sbgp): the workspace's NAT EIP and the head's
    EIP are 5_sbgp, as EIP v3 ListCommonPools says (5_bgp was hard-coded: the workspace
    create failed at the NAT EIP there)."""
    hwc.ctl.set_options(eip_pools=["5_sbgp"])
    try:
        core.run(core.workspaces.create("eiptype", workspace_config(hwc)))
        try:
            core.run(core.clusters.up(cluster_config("eipt", "eiptype", workers=0)))
            state = hwc.ctl.state()
            ours = {s["id"] for s in state["servers"]
                    if s["tags"].get("cloudtik-workspace") == "eiptype"}
            eips = [e for e in state["publicips"] if e["server_id"] in ours
                    or (e["alias"] or "").startswith("cloudtik-eiptype")]
            assert len(eips) == 2 and {e["type"] for e in eips} == {"5_sbgp"}, eips
            core.run(core.clusters.down("eipt"))
        finally:
            core.run(core.workspaces.delete("eiptype"))
    finally:
        hwc.ctl.set_options(eip_pools=["5_bgp", "5_sbgp"])


def test_the_workspace_key_pair_serves_every_iam_user_of_the_account(hwc, core):
    """The workspace's key pair is made by the first ``up`` with the user's credentials.
    It was user-scope: another IAM user of the same account (the emulator's
    ``colleague`` profile) could not see it, and making it again was refused (its name is
    taken), so their ``up`` in the shared workspace failed.  It is domain-scope now."""
    core.run(core.workspaces.create("keyscope", workspace_config(hwc)))
    try:
        core.run(core.clusters.up(cluster_config("mine", "keyscope", workers=0)))
        (kp,) = [k for k in hwc.ctl.state()["keypairs"] if "keyscope" in k["name"]]
        assert kp["scope"] == "domain", kp
        theirs = cluster_config("theirs", "keyscope", workers=0, profile="colleague")
        core.run(core.clusters.up(theirs))
        servers = [s for s in hwc.ctl.state()["servers"]
                   if s["tags"].get("cloudtik-workspace") == "keyscope"]
        assert {s["key_name"] for s in servers} == {kp["name"]} and len(servers) == 2
        for name in ("mine", "theirs"):
            core.run(core.clusters.down(name))
    finally:
        core.run(core.workspaces.delete("keyscope"))
