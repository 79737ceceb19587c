"""Fault matrix of workspace create and delete: each injected fault at each step either
completes after retries (and makes no duplicates) or fails clearly and leaves nothing."""

from __future__ import annotations

import pytest
from hwc_helpers import leftovers, workspace_config

from jupyter_cloudtik.core.errors import ProviderError

CREATE_STEPS = ["vpc.create_vpc", "vpc.create_subnet", "vpc.create_security_group",
                "vpc.create_security_group_rule", "nat.create_nat_gateway",
                "eip.create_publicip", "nat.create_nat_gateway_snat_rule", "iam.create_agency",
                "iam.associate_agency_with_all_projects_permission", "obs.create_bucket"]
READ_STEPS = ["vpc.list_vpcs", "nat.show_nat_gateway", "iam.keystone_list_permissions"]
DELETE_STEPS = ["nat.delete_nat_gateway_snat_rule", "nat.delete_nat_gateway",
                "eip.delete_publicip", "vpc.delete_security_group", "vpc.delete_subnet",
                "vpc.delete_vpc", "iam.delete_agency", "obs.delete_bucket"]

EXPECTED = {"vpcs": 1, "subnets": 2, "security_groups": 1, "nat_gateways": 1,
            "publicips": 1, "snat_rules": 2, "agencies": 2, "buckets": 1}


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
