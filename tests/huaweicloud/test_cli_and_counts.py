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
        assert [p["name"] for p in state["peerings"]] == ["cloudtik-peer-peering"]
        st = core.run(core.workspaces.status("peer"))
        assert st["integrity"]["peering"] == "ok"
        core.run(core.workspaces.delete("peer"))
        assert hwc.ctl.state()["peerings"] == []
        assert leftovers(hwc, "peer") == {}
    finally:
        clients.call("vpc", "delete_vpc", DeleteVpcRequest(vpc_id=mine.id), missing_ok=True)


def test_creation_calls_do_not_grow_with_the_number_of_nodes(hwc, core, faults):
    """Provider level, emulator not booting: 1, 10 and 100 workers cost the same creation
    calls (one create, a few job polls); only tagging grows (ECS tags one server a call)."""
    from hwc_helpers import cluster_config, workspace_config

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.base import TAG_CLUSTER_NAME, TAG_NODE_KIND
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    core.run(core.workspaces.create("counts", workspace_config(hwc)))
    faults.set_options(boot=False)
    try:
        per_n = {}
        for n in (1, 10, 100):
            cfg = cfgmod.build_config(cluster_config(f"count{n}", "counts", workers=n))
            prov = HuaweiCloudNodeProvider(cfg["provider"], f"count{n}", core.clusters.context)
            cfg = prov.bootstrap_config(cfg)
            before = dict(prov.clients.counts)
            nc = {**cfg["available_node_types"]["worker"]["node_config"],
                  "runtime": {"role": "worker", "scheduler_address": "tcp://10.0.0.1:8786",
                              "cluster_name": f"count{n}", "nthreads": 1}}
            made = prov.create_node(nc, {TAG_NODE_KIND: "worker"}, n)
            assert len(made) == n
            assert len(prov.non_terminated_nodes({TAG_CLUSTER_NAME: f"count{n}"})) == n
            calls = {k: v - before.get(k, 0) for k, v in prov.clients.counts.items()
                     if v - before.get(k, 0)}
            per_n[n] = calls
            print(f"create_node({n}) API calls: {sum(calls.values())} {calls}")
            prov.terminate_nodes(list(made))
            assert prov.non_terminated_nodes({}) == []
        for n, calls in per_n.items():
            assert calls["ecs.create_post_paid_servers"] == 1, (n, calls)
            assert calls["ecs.show_job"] <= 6, (n, calls)
            assert calls["ecs.list_servers_details"] == (1 if n <= 100 else 2)
    finally:
        faults.set_options(boot=True)
        core.run(core.workspaces.delete("counts"))
    assert leftovers(hwc, "counts") == {}



def test_python_api_of_workspaces(hwc, env):
    from jupyter_cloudtik import Workspace
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.session import CoreBackend

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
