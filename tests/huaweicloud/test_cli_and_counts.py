"""The CLI faces of workspaces and the emulator; API call counts of node creation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hwc_helpers import leftovers


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "jupyter_cloudtik", *args],
                          capture_output=True, text=True, env=env or dict(os.environ),
                          timeout=120)


def test_workspace_cli_round_trip(hwc, env):
    ep = hwc.info["endpoint"]
    r = cli("workspace", "create", "clidemo", "--provider", "huaweicloud", "--region",
            hwc.info["region"], "--endpoint", ep, "--allowed-ssh-source", "127.0.0.1/32",
            "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["state"] == "ready" and info["resources"]["vpc_id"]
    assert "vpc: VPC cloudtik-clidemo-vpc" in r.stderr  # progress on stderr
    r = cli("workspace", "status", "clidemo")
    assert r.returncode == 0 and "healthy" in r.stdout, r.stdout + r.stderr
    r = cli("workspace", "list")
    assert "clidemo" in r.stdout
    r = cli("emulator", "huaweicloud", "status", "--dir", str(hwc.dir), "--json")
    assert "cloudtik-clidemo-vpc" in json.loads(r.stdout)["resources"]["vpcs"]
    r = cli("workspace", "delete", "clidemo")
    assert r.returncode == 0, r.stderr
    assert leftovers(hwc, "clidemo") == {}
    r = cli("workspace", "info", "clidemo", "--json")
    assert json.loads(r.stdout)["state"] == "deleted"


@pytest.mark.parametrize("args,field,words", [
    (["Bad_Name", "--provider", "huaweicloud", "--region", "cn-north-4"], "name",
     "not a valid workspace name"),
    (["ok", "--provider", "huaweicloud"], "provider", "region"),
    (["ok", "--provider", "huaweicloud", "--region", "cn-north-4",
      "--allowed-ssh-source", "not-a-cidr"], "allowed_ssh_sources", "not-a-cidr"),
    (["ok", "--provider", "nocloud", "--region", "x"], "provider.type", "nocloud"),
])
def test_bad_workspace_input_exits_2_naming_the_field(env, args, field, words):
    r = cli("workspace", "create", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert field.split(".")[-1] in r.stderr and words in r.stderr
    assert "Traceback" not in r.stderr


def test_cross_region_peering_is_refused_and_explained(env, hwc, tmp_path):
    cfg = tmp_path / "ws.yaml"
    cfg.write_text(f"provider:\n  type: huaweicloud\n  region: cn-north-4\n"
                   f"  endpoint: {hwc.info['endpoint']}\n  peer_vpc_id: abc\n"
                   "  peer_region: ap-southeast-1\n")
    r = cli("workspace", "create", "peerx", str(cfg))
    assert r.returncode == 2
    assert "Cloud Connect" in r.stderr and "peer_region" in r.stderr


def test_peering_with_a_vpc_of_the_same_region(hwc, core):
    from huaweicloudsdkvpc.v2 import (
        CreateVpcOption,
        CreateVpcRequest,
        CreateVpcRequestBody,
        DeleteVpcRequest,
    )
    from hwc_helpers import workspace_config

    from jupyter_cloudtik.providers.huaweicloud.account import make_clients

    clients = make_clients({"region": hwc.info["region"], "endpoint": hwc.info["endpoint"]},
                           core.workspaces.context, None)
    mine = clients.call("vpc", "create_vpc", CreateVpcRequest(CreateVpcRequestBody(
        vpc=CreateVpcOption(name="working-vpc", cidr="10.10.0.0/16")))).vpc
    try:
        core.run(core.workspaces.create("peer", workspace_config(hwc, peer_vpc_id=mine.id)))
        state = hwc.ctl.state()
        assert [(p["name"], p["routes"]) for p in state["peerings"]] == [
            ("cloudtik-peer-peering", True)]
        st = core.run(core.workspaces.status("peer"))
        assert st["integrity"]["peering"] == "ok"
        core.run(core.workspaces.delete("peer"))
        assert hwc.ctl.state()["peerings"] == []
        assert leftovers(hwc, "peer") == {}
    finally:
        clients.call("vpc", "delete_vpc", DeleteVpcRequest(vpc_id=mine.id), missing_ok=True)


def test_a_peer_vpc_whose_cidr_overlaps_is_refused_before_anything_is_made(hwc, core):
    """Huawei Cloud peers overlapping VPCs (ACTIVE) and the peering silently does not
    route; the emulator does the same (it accepts and marks it), and the provider refuses
    the overlap itself, in one line naming provider.vpc_cidr, before any resource."""
    from huaweicloudsdkvpc.v2 import (
        CreateVpcOption,
        CreateVpcPeeringOption,
        CreateVpcPeeringRequest,
        CreateVpcPeeringRequestBody,
        CreateVpcRequest,
        CreateVpcRequestBody,
        DeleteVpcPeeringRequest,
        DeleteVpcRequest,
        VpcInfo,
    )
    from hwc_helpers import workspace_config

    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.providers.huaweicloud.account import make_clients

    clients = make_clients({"region": hwc.info["region"], "endpoint": hwc.info["endpoint"]},
                           core.workspaces.context, None)
    # the console's default VPC CIDR, which is also our default vpc_cidr
    console = clients.call("vpc", "create_vpc", CreateVpcRequest(CreateVpcRequestBody(
        vpc=CreateVpcOption(name="console-default", cidr="192.168.0.0/16")))).vpc
    other = clients.call("vpc", "create_vpc", CreateVpcRequest(CreateVpcRequestBody(
        vpc=CreateVpcOption(name="other", cidr="192.168.0.0/20")))).vpc
    try:
        mark = hwc.ctl.last_request()
        with pytest.raises(ConfigError) as e:
            core.run(core.workspaces.create("overlap", workspace_config(
                hwc, peer_vpc_id=console.id)))
        assert e.value.field == "provider.vpc_cidr" and "would not route" in e.value.message
        assert "\n" not in e.value.message and "10.0.0.0/16" in e.value.message
        made = [r for r in hwc.ctl.requests(mark) if r["method"] not in ("GET", "HEAD")]
        assert made == [], made  # refused before anything was made
        assert leftovers(hwc, "overlap") == {}
        # the emulator itself, like the cloud, accepts the overlapping peering
        got = clients.call("vpc", "create_vpc_peering", CreateVpcPeeringRequest(
            CreateVpcPeeringRequestBody(peering=CreateVpcPeeringOption(
                name="overlapping", request_vpc_info=VpcInfo(vpc_id=console.id),
                accept_vpc_info=VpcInfo(vpc_id=other.id))))).peering
        assert got.status == "ACTIVE"
        listed = {p["name"]: p for p in hwc.ctl.state()["peerings"]}
        assert listed["overlapping"]["routes"] is False
        clients.call("vpc", "delete_vpc_peering", DeleteVpcPeeringRequest(peering_id=got.id))
    finally:
        for v in (console, other):
            clients.call("vpc", "delete_vpc", DeleteVpcRequest(vpc_id=v.id), missing_ok=True)


def test_creation_calls_do_not_grow_with_the_number_of_nodes(hwc, core, faults):
    """Provider level, emulator not booting: N workers cost ceil(N/100) creates (ECS takes
    at most 100 a call), one listing per poll for all of them, and ceil(N/50) TMS calls to
    tag them (TMS takes at most 50 servers a call), never one call per server."""
    import math

    from hwc_helpers import cluster_config, workspace_config

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.base import TAG_CLUSTER_NAME, TAG_NODE_KIND
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    core.run(core.workspaces.create("counts", workspace_config(hwc)))
    faults.set_options(boot=False)
    try:
        per_n = {}
        for n in (1, 10, 150):
            cfg = cfgmod.build_config(cluster_config(f"count{n}", "counts", workers=n))
            prov = HuaweiCloudNodeProvider(cfg["provider"], f"count{n}", core.clusters.context)
            cfg = prov.bootstrap_config(cfg)
            before = dict(prov.clients.counts)
            nc = {**cfg["available_node_types"]["worker"]["node_config"],
                  "runtime": {"role": "worker", "scheduler_address": "tcp://10.0.0.1:8786",
                              "cluster_name": f"count{n}", "nthreads": 1}}
            mark = hwc.ctl.last_request()
            made = prov.create_node(nc, {TAG_NODE_KIND: "worker"}, n)
            assert len(made) == n
            prov.set_nodes_tags(list(made), {"cloudtik-node-status": "up-to-date"})
            assert len(prov.non_terminated_nodes({TAG_CLUSTER_NAME: f"count{n}"})) == n
            calls = {k: v - before.get(k, 0) for k, v in prov.clients.counts.items()
                     if v - before.get(k, 0)}
            per_n[n] = calls
            print(f"create_node({n}) API calls: {sum(calls.values())} {calls}")
            counts = {r["action"] for r in hwc.ctl.requests(mark)
                      if r["action"] == "ecs.create_post_paid_servers"
                      and json.loads(r["body"])["server"]["count"] > 100}
            assert not counts, "a create asked for more than 100 servers"
            state = {s["id"]: s for s in hwc.ctl.state()["servers"]}
            assert all(state[i]["tags"]["cloudtik-node-status"] == "up-to-date" for i in made)
            prov.terminate_nodes(list(made))
            assert prov.non_terminated_nodes({}) == []
            prov.cleanup()  # as `down` does: the nodes' TLS object leaves the bucket
            assert calls["obs.put_object"] == 1, calls  # one TLS bundle per create call
        for n, calls in per_n.items():
            assert calls["ecs.create_post_paid_servers"] == math.ceil(n / 100), (n, calls)
            assert calls.get("ecs.show_job", 0) == 0, (n, calls)  # all came up: no job asked
            assert calls["ecs.list_servers_details"] <= 8, (n, calls)
            assert calls["tms.create_resource_tag"] == math.ceil(n / 50), (n, calls)
            assert "ecs.batch_create_server_tags" not in calls, (n, calls)
    finally:
        faults.set_options(boot=True)
        core.run(core.workspaces.delete("counts"))
    assert leftovers(hwc, "counts") == {}


def test_python_api_of_workspaces(hwc, env):
    from jupyter_cloudtik import Workspace
    from jupyter_cloudtik.clusters.client import CoreBackend
    from jupyter_cloudtik.core.settings import CloudTik

    backend = CoreBackend(settings=CloudTik(state_dir=str(env), start_reaper=False))
    try:
        ws = Workspace.create("pyws", provider="huaweicloud", region=hwc.info["region"],
                              endpoint=hwc.info["endpoint"], progress=False, backend=backend)
        assert ws.state == "ready"
        assert ws.status()["healthy"] is True
        assert [w.name for w in Workspace.list(backend=backend)] == ["pyws"]
        assert "vpc_id" in ws._repr_html_()
        ws.delete(progress=False)
        assert ws.state == "deleted"
    finally:
        backend.runner.stop()
    assert leftovers(hwc, "pyws") == {}


def test_benchmark_up_and_down_of_1000_workers_meets_its_targets(capsys, monkeypatch,
                                                                  tmp_path):
    """benchmarks/huaweicloud_up.py in --no-boot mode: ceil(N/100) create calls, `up` of
    1,000 costs at most 3x the calls of 100, within 2 minutes; `down` likewise bounded."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "huaweicloud_up.py"
    spec = importlib.util.spec_from_file_location("huaweicloud_up", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for k in ("CLOUDTIK_STATE_DIR", "HOME", "HUAWEICLOUD_CREDENTIALS_FILE"):
        monkeypatch.setenv(k, str(tmp_path))  # the benchmark sets them: restored after
    got = bench.main([100, 1000])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["N=100", "N=1000"]
    assert got[100]["creates"] == 1 and got[1000]["creates"] == 10
    assert got[1000]["up_calls"] <= 3 * got[100]["up_calls"], got
    assert got[1000]["down_calls"] <= 3 * got[100]["down_calls"], got
    assert got[1000]["up_s"] < 120, got
