"""The whole life of a workspace and a cluster on the emulated cloud, with the real SDK.

Also the secrets check: the access keys and the cluster's private key appear in no log
line, event, API answer, recorded config, node user data, node metadata or request that
the emulator received (other than the signature header, which it does not record).
"""

from __future__ import annotations

import json
import logging

from hwc_helpers import cluster_config, leftovers, workspace_config

from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.providers.huaweicloud.bootstrap import PRIVATE_KEY_SECRET


def test_workspace_and_cluster_life_cycle(hwc, core, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    first_request = hwc.ctl.last_request()
    ws = "life"
    info = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    assert info.state == "ready"
    assert {"vpc_id", "public_subnet_id", "private_subnet_id", "security_group_id", "nat_id",
            "nat_eip_id", "head_agency", "worker_agency", "bucket"} <= set(info.resources)
    status = core.run(core.workspaces.status(ws))
    assert status["healthy"], status["integrity"]

    # creating again is a no-op that finds everything by name
    before = hwc.ctl.state()
    core.run(core.workspaces.create(ws, workspace_config(hwc)))
    after = hwc.ctl.state()
    for kind in ("vpcs", "subnets", "security_groups", "nat_gateways", "publicips",
                 "agencies", "buckets"):
        assert len(after[kind]) == len(before[kind]), kind

    cinfo = core.run(core.clusters.up(cluster_config("life1", ws, workers=2)))
    assert cinfo.state == "running"
    assert cinfo.running_workers == 2
    # the head is reached through its EIP (a forwarded address, not the private one)
    head = next(n for n in cinfo.nodes if n.kind == "head")
    assert head.external_ip and head.external_ip != head.internal_ip
    assert head.external_ip in cinfo.dashboard_link

    servers = [s for s in hwc.ctl.state()["servers"] if s["tags"].get("cloudtik-cluster-name")
               == "life1"]
    assert len(servers) == 3
    for s in servers:
        kind = s["tags"]["cloudtik-node-kind"]
        assert s["metadata"]["agency_name"] == f"cloudtik-{ws}-{kind}"
        assert s["key_name"] == f"cloudtik-{ws}-key"
        assert s["tags"]["cloudtik-workspace"] == ws
        assert len(s["tags"]) <= 10

    # compute, through the provider's client (the head's EIP)
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    _, connect = core.clusters.connect_info("life1")
    client = HuaweiCloudNodeProvider.make_client(connect, timeout=20)
    try:
        assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        assert len(client.scheduler_info()["workers"]) == 2
    finally:
        client.close()

    # one create call per batch: the two workers came from one call
    creates = [r for r in hwc.ctl.requests(first_request)
               if r["action"] == "ecs.create_post_paid_servers"]
    counts = sorted(json.loads(r["body"])["server"]["count"] for r in creates
                    if r["status"] == 200)
    assert counts == [1, 2]

    core.run(core.clusters.scale("life1", 1))
    assert core.clusters.get("life1").running_workers == 1
    core.run(core.clusters.down("life1"))
    assert core.clusters.get("life1").state == "stopped"
    assert "servers" not in leftovers(hwc, ws)

    store = core.clusters.store
    private_key = SecretStore(store).get(f"provider:huaweicloud:{ws}", PRIVATE_KEY_SECRET)
    assert "PRIVATE KEY" in private_key

    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
    assert core.workspaces.get(ws).state == "deleted"

    # --- secrets: nowhere but in the secret store (and now not even there)
    creds = (hwc.dir / "credentials").read_text()
    ak = creds.split("access_key = ")[1].split()[0]
    sk = creds.split("secret_key = ")[1].split()[0]
    key_body = private_key.splitlines()[1]
    secrets = {"AK": ak, "SK": sk, "private key": key_body}
    texts = {
        "log": caplog.text,
        "output": "".join(capsys.readouterr()),
        "events": json.dumps([e.to_dict() for e in core.clusters.ops.events(limit=100000)]),
        "cluster": json.dumps(core.clusters.get("life1").to_dict(), default=str),
        "workspace": json.dumps(core.workspaces.get(ws).to_dict(), default=str),
        "tables": json.dumps([dict(r) for t in ("clusters", "workspaces", "operations")
                              for r in store.query(f"SELECT * FROM {t}")], default=str),
        "requests": json.dumps(hwc.ctl.requests(first_request)),
        "user_data": "".join(s["user_data"] for s in servers),
    }
    for where, text in texts.items():
        for what, value in secrets.items():
            assert value not in text, f"the {what} appears in the {where}"
    assert not SecretStore(store).names(f"provider:huaweicloud:{ws}")
