"""Fault matrix of workspace create and delete: each injected fault at each step either
completes after retries (and makes no duplicates) or fails clearly and leaves nothing."""

from __future__ import annotations

import pytest
from hwc_helpers import leftovers, workspace_config

from jupyter_cloudtik.core.errors import ProviderError

CREATE_STEPS = ["vpc.create_vpc", "vpc.create_subnet", "vpc.create_security_group",
                "vpc.create_security_group_rule", "nat.create_nat_gateway",
                "eip.create_publicip", "nat.create_nat_gateway_snat_rule", "iam.create_agency",
                "iam.create_cloud_service_custom_policy",
                "iam.associate_agency_with_all_projects_permission", "obs.create_bucket"]
READ_STEPS = ["vpc.list_vpcs", "nat.show_nat_gateway", "iam.list_custom_policies"]
DELETE_STEPS = ["nat.delete_nat_gateway_snat_rule", "nat.delete_nat_gateway",
                "eip.delete_publicip", "vpc.delete_security_group", "vpc.delete_subnet",
                "vpc.delete_vpc", "iam.delete_agency", "iam.delete_custom_policy",
                "obs.delete_bucket"]

EXPECTED = {"vpcs": 1, "subnets": 2, "security_groups": 1, "nat_gateways": 1,
            "publicips": 1, "snat_rules": 2, "agencies": 2, "buckets": 1, "policies": 1}


def _count(hwc, ws: str) -> dict[str, int]:
    state = hwc.ctl.state()
    out = {k: len([r for r in state[k] if f"cloudtik-{ws}" in (r.get("name") or
                   r.get("alias") or "")]) for k in EXPECTED if k != "snat_rules"}
    nat_ids = {n["id"] for n in state["nat_gateways"] if n["name"] == f"cloudtik-{ws}-nat"}
    out["snat_rules"] = len([r for r in state["snat_rules"] if r["nat_gateway_id"] in nat_ids])
    return out


def _name(action: str, kind: str) -> str:
    return ("w" + action.split(".")[1].replace("_", "")[:10] + kind[:3]).lower()


TRANSIENT = [(a, k, t) for a in CREATE_STEPS + READ_STEPS
             for k, t in (("throttle", 2), ("error", 1), ("lost_response", 1))
             if not (k == "lost_response" and a in READ_STEPS)]  # a lost read = an error


@pytest.mark.parametrize("action,kind,times", TRANSIENT)
def test_create_completes_after_transient_faults(hwc, core, faults, action, kind, times):
    ws = _name(action, kind)
    faults.inject(action, kind, times=times)
    info = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    assert info.state == "ready"
    assert all(f["fired"] == f["times"] for f in faults.faults()), faults.faults()
    assert _count(hwc, ws) == EXPECTED  # no duplicates, nothing missing
    events = core.workspaces.ops.events(limit=10000)
    assert any(e.step == "retry" and e.level == "warning" for e in events)
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


@pytest.mark.parametrize("action", ["vpc.create_subnet", "nat.create_nat_gateway",
                                    "iam.create_agency", "obs.create_bucket"])
def test_create_fails_clearly_and_rolls_back(hwc, core, faults, action):
    ws = _name(action, "persistent")
    faults.inject(action, "error", times=1000)
    with pytest.raises(ProviderError) as e:
        core.run(core.workspaces.create(ws, workspace_config(hwc)))
    msg = e.value.message
    assert "failed after 6 attempt(s)" in msg and "HTTP 500" in msg
    assert "rollback" in msg
    assert core.workspaces.get(ws).state == "failed"
    assert leftovers(hwc, ws) == {}
    # the cloud recovers: creating again works
    faults.clear_faults()
    assert core.run(core.workspaces.create(ws, workspace_config(hwc))).state == "ready"
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_quota_error_is_reported_with_the_clouds_code(hwc, core, faults):
    faults.inject("vpc.create_vpc", "quota")
    with pytest.raises(ProviderError) as e:
        core.run(core.workspaces.create("wquota", workspace_config(hwc)))
    assert "VPC.0106" in e.value.message and "Quota exceeded" in e.value.message
    assert leftovers(hwc, "wquota") == {}


@pytest.mark.parametrize("kind", ["throttle", "error"])
@pytest.mark.parametrize("action", DELETE_STEPS)
def test_delete_completes_after_transient_faults(hwc, core, faults, action, kind):
    ws = _name(action, "d" + kind)
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    faults.inject(action, kind, times=1)
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_failed_delete_can_be_run_again(hwc, core, faults):
    ws = "wdelagain"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    faults.inject("vpc.delete_vpc", "error", times=1000)
    with pytest.raises(ProviderError, match="delete the VPC"):
        core.run(core.workspaces.delete(ws))
    assert core.workspaces.get(ws).state == "failed"
    faults.clear_faults()
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
    # deleting what is gone is fine
    core.run(core.workspaces.delete(ws))


def test_delete_waits_out_409_while_servers_drain(hwc, core, faults):
    """Servers whose delete job is still running keep their ports: the subnet and the
    security group answer 409 "in use" until then. `workspace delete` waits that out and
    leaves nothing, NAT gateway and EIPs included (a billed leftover otherwise)."""
    import json

    from hwc_helpers import cluster_config

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.base import TAG_NODE_KIND
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    ws = "wdrain"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    faults.set_options(boot=False)
    try:
        cfg = cfgmod.build_config(cluster_config("drain", ws, workers=3))
        prov = HuaweiCloudNodeProvider(cfg["provider"], "drain", core.clusters.context)
        cfg = prov.bootstrap_config(cfg)
        nc = {**cfg["available_node_types"]["worker"]["node_config"],
              "runtime": {"role": "worker", "cluster_name": "drain",
                          "scheduler_address": "tcp://10.0.0.1:8786"}}
        made = list(prov.create_node(nc, {TAG_NODE_KIND: "worker"}, 3))
        faults.set_options(server_delete_seconds=6.0)
        from huaweicloudsdkecs.v2 import (
            DeleteServersRequest,
            DeleteServersRequestBody,
            ServerId,
        )

        # a `down` that was killed after asking: the servers are being deleted, not gone
        prov.clients.call("ecs", "delete_servers", DeleteServersRequest(
            body=DeleteServersRequestBody(servers=[ServerId(id=i) for i in made],
                                          delete_publicip=True)))
        # its objects in the bucket (TLS certificate): what `down` removes after the last
        # node; `workspace delete` itself refuses a bucket that still holds objects
        prov.cleanup()
        mark = hwc.ctl.last_request()
        core.run(core.workspaces.delete(ws))
    finally:
        faults.set_options(boot=True, server_delete_seconds=None)
    refused = [(r["action"], r["status"]) for r in hwc.ctl.requests(mark)
               if r["status"] == 409]
    assert ("vpc.delete_security_group", 409) in refused, refused
    assert all(a in ("vpc.delete_security_group", "vpc.delete_subnet") for a, _ in refused)
    assert leftovers(hwc, ws) == {}
    state = hwc.ctl.state()
    assert not [s for s in state["servers"] if s["id"] in made]
    assert not [n for n in state["nat_gateways"] if n["name"].startswith(f"cloudtik-{ws}")]
    assert json.dumps(state["publicips"]).count(f"cloudtik-{ws}") == 0


def _put(prov, bucket: str, key: str, data: bytes = b"x") -> None:
    from huaweicloudsdkobs.v1 import PutObjectRequest

    from jupyter_cloudtik.providers.huaweicloud.nodes import _MemoryFile

    prov.clients.call("obs", "put_object", PutObjectRequest(
        bucket_name=bucket, object_key=key, stream=_MemoryFile(data)))


def _left_cluster_objects(hwc, core, ws: str, cluster: str):
    """What a cluster whose `down` never finished leaves in the workspace bucket: its TLS
    object, and staged wheels with their manifest (the real keys the provider writes)."""
    from hwc_helpers import cluster_config

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider
    from jupyter_cloudtik.providers.huaweicloud.userdata import manifest_key

    cfg = cfgmod.build_config(cluster_config(cluster, ws))
    prov = HuaweiCloudNodeProvider(cfg["provider"], cluster, core.clusters.context)
    bucket = prov.workspace()["resources"]["bucket"]
    prov._publish_node_tls(bucket)
    for name in ("dask-2024.1.0-py3-none-any.whl", "msgpack-1.0.7-cp311.whl"):
        _put(prov, bucket, f"cloudtik/clusters/{cluster}/wheels/{name}", b"PK")
    _put(prov, bucket, manifest_key(cluster), b"{}")
    return prov, bucket


def _objects(hwc, bucket: str) -> int:
    return next(b["objects"] for b in hwc.ctl.state()["buckets"] if b["name"] == bucket)


OBJECT_FAULTS = [(a, k) for a in ("obs.list_objects", "obs.delete_object")
                 for k in ("throttle", "error", "lost_response")]


@pytest.mark.parametrize("action,kind", OBJECT_FAULTS)
def test_delete_removes_our_objects_a_cluster_left(hwc, core, faults, action, kind):
    """A cluster's `down` never finished: its TLS material and wheels are still under
    `cloudtik/clusters/...` in the bucket. `workspace delete` deletes our own prefix
    itself (through transient faults) and leaves nothing."""
    ws = _name(action, "obj" + kind)
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    _, bucket = _left_cluster_objects(hwc, core, ws, "gone")
    assert _objects(hwc, bucket) == 4
    faults.inject(action, kind, times=2 if kind == "throttle" else 1)
    core.run(core.workspaces.delete(ws))
    assert all(f["fired"] == f["times"] for f in faults.faults()), faults.faults()
    assert leftovers(hwc, ws) == {}
    assert bucket not in {b["name"] for b in hwc.ctl.state()["buckets"]}


def test_delete_refuses_a_bucket_with_objects_not_ours(hwc, core, faults):
    """Objects outside `cloudtik/` are the user's: the delete is refused before anything
    is torn down, with the bucket, how many and which; ours are not touched either. Once
    the user's objects are gone, the delete finishes and leaves nothing."""
    ws = "wforeign"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    prov, bucket = _left_cluster_objects(hwc, core, ws, "gone")
    for i in range(5):
        _put(prov, bucket, f"results/run{i}.parquet")
    before = hwc.ctl.state()
    with pytest.raises(ProviderError) as e:
        core.run(core.workspaces.delete(ws))
    msg = e.value.message
    assert bucket in msg and "5 object(s)" in msg and "results/run0.parquet" in msg, msg
    assert "--keep-storage" in msg
    assert _objects(hwc, bucket) == 9  # nothing deleted, ours included
    after = hwc.ctl.state()
    for kind in ("vpcs", "subnets", "nat_gateways", "agencies"):  # nothing torn down
        assert len(after[kind]) == len(before[kind]), kind

    from huaweicloudsdkobs.v1 import DeleteObjectRequest

    for i in range(5):
        prov.clients.call("obs", "delete_object", DeleteObjectRequest(
            bucket_name=bucket, object_key=f"results/run{i}.parquet"))
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_delete_finds_a_foreign_object_past_the_first_listing_page(hwc, core):
    """The bucket is listed page by page (at most 1,000 keys an answer): a user's object
    that sorts after 1,000 of ours is still found, and the delete refused."""
    from concurrent.futures import ThreadPoolExecutor

    ws = "wpages"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    prov, bucket = _left_cluster_objects(hwc, core, ws, "gone")
    have = _objects(hwc, bucket)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _put(prov, bucket, f"cloudtik/clusters/gone/pad/{i:04d}"),
                      range(1001 - have)))
    _put(prov, bucket, "zz-results.parquet")  # sorts last: on the second page
    with pytest.raises(ProviderError) as e:
        core.run(core.workspaces.delete(ws))
    assert "1 object(s)" in e.value.message and "zz-results.parquet" in e.value.message
    assert _objects(hwc, bucket) == 1002
    core.run(core.workspaces.delete(ws, delete_storage=False))  # (1,000 deletes: slow)
    assert set(leftovers(hwc, ws)) <= {"buckets"}


def test_create_again_repairs_subnets_without_dns(hwc, core, faults):
    """A workspace whose subnets were made without DNS servers (as jupyter_cloudtik did
    before, or by hand): nothing on them resolves names. `workspace create` again sets the
    region's DNS servers on them (VPC "Updating Subnet Information") instead of only
    reporting; servers made afterwards get them."""
    from huaweicloudsdkvpc.v2 import (
        CreateSubnetOption,
        CreateSubnetRequest,
        CreateSubnetRequestBody,
        CreateVpcOption,
        CreateVpcRequest,
        CreateVpcRequestBody,
    )

    from jupyter_cloudtik.providers.huaweicloud.account import make_clients, names
    from jupyter_cloudtik.providers.huaweicloud.limits import REGION_DNS

    ws = "wnodns"
    n = names(ws)
    clients = make_clients(workspace_config(hwc)["provider"], core.clusters.context, ws)
    vpc = clients.call("vpc", "create_vpc", CreateVpcRequest(CreateVpcRequestBody(
        vpc=CreateVpcOption(name=n["vpc"], cidr="192.168.0.0/16")))).vpc
    for kind, cidr in (("public_subnet", "192.168.0.0/24"),
                       ("private_subnet", "192.168.16.0/20")):
        clients.call("vpc", "create_subnet", CreateSubnetRequest(CreateSubnetRequestBody(
            subnet=CreateSubnetOption(name=n[kind], cidr=cidr, vpc_id=vpc.id,
                                      gateway_ip=cidr.rsplit(".", 1)[0] + ".1"))))

    def dns():
        return {s["name"]: s["dns_servers"] for s in hwc.ctl.state()["subnets"]
                if s["vpc_id"] == vpc.id}

    assert dns() == {n["public_subnet"]: [], n["private_subnet"]: []}
    mark = hwc.ctl.last_request()
    info = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    assert info.state == "ready"
    want = REGION_DNS[hwc.info["region"]]
    assert dns() == {n["public_subnet"]: want, n["private_subnet"]: want}
    updates = [r for r in hwc.ctl.requests(mark) if r.get("action") == "vpc.update_subnet"]
    assert len(updates) == 2 and all(r["status"] == 200 for r in updates)
    # a second create finds nothing to repair
    mark = hwc.ctl.last_request()
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    assert not [r for r in hwc.ctl.requests(mark) if r.get("action") == "vpc.update_subnet"]
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_a_bucket_name_held_or_taken_is_refused_first_with_the_cause(hwc, core, faults):
    """OBS holds a deleted bucket's name for about 30 minutes and names are global across
    accounts. `workspace delete` then `create` within the window, or a name another account
    owns, is refused at the first step (the bucket is made before the VPC), in one line
    saying why, with nothing to roll back: it used to fail last, after the VPC, NAT gateway
    and agencies were built, which the rollback then tore down, with a raw 403."""
    from jupyter_cloudtik.core.errors import ConfigError

    ws = "wbucket"
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    core.run(core.workspaces.delete(ws))
    faults.set_options(bucket_release_seconds=1800)
    try:
        mark = hwc.ctl.last_request()
        with pytest.raises(ConfigError) as held:
            core.run(core.workspaces.create(ws, workspace_config(hwc)))
        made = [r["action"] for r in hwc.ctl.requests(mark)
                if r["method"] not in ("GET", "HEAD")]
        assert made == ["obs.create_bucket"], made  # the first thing tried, and the last
        assert leftovers(hwc, ws) == {}
        said = held.value.message
        assert "held for about 30 minutes" in said and "(409" in said, said
        assert "\n" not in said and "rollback" not in said, said
        # a name another account owns
        bucket = said.split("bucket name ", 1)[1].split(" ", 1)[0]
        faults.set_options(bucket_release_seconds=0, foreign_buckets=[bucket])
        with pytest.raises(ConfigError) as taken:
            core.run(core.workspaces.create(ws, workspace_config(hwc)))
        assert "(403" in taken.value.message and "another workspace name" in \
            taken.value.message, taken.value.message
        assert leftovers(hwc, ws) == {}
    finally:
        faults.set_options(bucket_release_seconds=0, foreign_buckets=[])
    core.run(core.workspaces.create(ws, workspace_config(hwc)))  # released: made again
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
