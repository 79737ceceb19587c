"""The whole life of a workspace and a cluster on the emulated cloud, with the real SDK.

Also the secrets check: the access keys and the cluster's private key appear in no log
line, event, API answer, recorded config, node user data, node metadata or request that
the emulator received (other than the signature header, which it does not record).
"""

from __future__ import annotations

import json
import logging
import socket

import pytest
from hwc_helpers import cluster_config, leftovers, workspace_config

from jupyter_cloudtik.core.grants import policy_for
from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.providers.huaweicloud.bootstrap import PRIVATE_KEY_SECRET


def test_workspace_and_cluster_life_cycle(hwc, core, caplog, capsys, tmp_path):
    caplog.set_level(logging.DEBUG)
    first_request = hwc.ctl.last_request()
    ws = "life"
    info = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    assert info.state == "ready"
    assert {"vpc_id", "public_subnet_id", "private_subnet_id", "security_group_id", "nat_id",
            "nat_eip_id", "head_agency", "worker_agency", "bucket"} <= set(info.resources)
    status = core.run(core.workspaces.status(ws))
    assert status["healthy"], status["integrity"]
    state = hwc.ctl.state()
    # subnets carry the region's private DNS servers (the VPC API would leave them blank)
    mine = [s for s in state["subnets"] if s["name"].startswith(f"cloudtik-{ws}-")]
    assert [s["dns_servers"] for s in mine] == [["100.125.1.250", "100.125.129.250"]] * 2
    # least privilege: nodes hold OBS rights only (nothing on a node calls ECS)
    assert {a["name"]: a["roles"] for a in state["agencies"]
            if a["name"].startswith(f"cloudtik-{ws}-")} == {
        f"cloudtik-{ws}-head": [f"cloudtik-{ws}-obs"],
        f"cloudtik-{ws}-worker": [f"cloudtik-{ws}-obs"]}
    # ...and on the workspace bucket only (a custom policy, not account-wide OperateAccess)
    policy = next(p for p in state["policies"] if p["name"] == f"cloudtik-{ws}-obs")
    bucket = info.resources["bucket"]
    assert [r for st in policy["policy"]["Statement"] for r in st["Resource"]] == [
        f"obs:*:*:bucket:{bucket}", f"obs:*:*:object:{bucket}/*"]

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
    # TLS only: the scheduler is tls:// at the EIP; the dashboard is on the head's loopback,
    # and from outside only behind the mutual-TLS relay (8788; tests/huaweicloud/
    # test_dashboard.py goes through it)
    assert cinfo.dashboard_link == f"https://{head.external_ip}:8788/status"
    assert cinfo.connect_info["extra"]["public_scheduler_address"] == \
        f"tls://{head.external_ip}:8786"
    assert "credentials" not in json.dumps(cinfo.connect_info)

    servers = [s for s in hwc.ctl.state()["servers"] if s["tags"].get("cloudtik-cluster-name")
               == "life1"]
    assert len(servers) == 3
    for s in servers:
        kind = s["tags"]["cloudtik-node-kind"]
        assert s["metadata"]["agency_name"] == f"cloudtik-{ws}-{kind}"
        assert s["key_name"] == f"cloudtik-{ws}-key"
        assert s["tags"]["cloudtik-workspace"] == ws
        assert len(s["tags"]) <= 10
        assert s["dns_servers"], "a node without name servers cannot reach PyPI or OBS"
        assert s["tags"]["cloudtik-node-status"] == "up-to-date"

    # compute, through the provider's client (the head's EIP)
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    _, connect = core.clusters.connect_info("life1")
    client = HuaweiCloudNodeProvider.make_client(connect, timeout=20)
    try:
        assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        assert len(client.scheduler_info()["workers"]) == 2
    finally:
        client.close()
    from cloudtik_emulators.tlsprobe import attempts
    from jupyter_cloudtik.runtime.tls import make_cluster_tls

    other = make_cluster_tls("life1")  # the same name, another CA
    for name, text in (("ca.pem", connect.credentials["ca"]), ("c.pem", other.client_cert),
                       ("k.pem", other.client_key)):
        (tmp_path / name).write_text(text)
    refused = attempts(f"tls://{head.external_ip}:8786", str(tmp_path / "ca.pem"),
                       str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    assert len(refused) == 3
    assert all(v.startswith("refused") for v in refused.values()), refused
    with pytest.raises(OSError):  # nothing listens for the dashboard on the EIP
        socket.create_connection((head.external_ip, 8787), timeout=2).close()
    tls_key_body = connect.credentials["key"].splitlines()[1]
    from jupyter_cloudtik.runtime.tls import load_cluster_tls

    node_key_body = load_cluster_tls(core.clusters.store.state_dir,
                                     "life1").node_key.splitlines()[1]

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
    # the workspace's key pair is kept in the secret store (read with the service's own
    # grant, as the provider reads it: core/grants.py)
    grant = policy_for(store).service("workspace", f"huaweicloud:{ws}", "the test reads it")
    private_key = SecretStore(store).reveal(grant, PRIVATE_KEY_SECRET)
    assert "PRIVATE KEY" in private_key

    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
    assert core.workspaces.get(ws).state == "deleted"

    # --- secrets: nowhere but in the secret store (and now not even there)
    creds = (hwc.dir / "credentials").read_text()
    ak = creds.split("access_key = ")[1].split()[0]
    sk = creds.split("secret_key = ")[1].split()[0]
    key_body = private_key.splitlines()[1]
    secrets = {"AK": ak, "SK": sk, "private key": key_body, "client TLS key": tls_key_body,
               "node TLS key": node_key_body}
    texts = {
        "log": caplog.text,
        "output": "".join(capsys.readouterr()),
        "events": json.dumps([e.to_dict() for e in core.clusters.ops.events(limit=100000)]),
        "cluster": json.dumps(core.clusters.get("life1").to_dict(), default=str),
        "workspace": json.dumps(core.workspaces.get(ws).to_dict(), default=str),
        "tables": json.dumps([dict(r) for t in ("clusters", "workspaces", "operations")
                              for r in store.query(f"SELECT * FROM {t}")], default=str),
        "requests": json.dumps([r for r in hwc.ctl.requests(first_request)
                                if r.get("action") != "obs.put_object"]),
        "user_data": "".join(s["user_data"] for s in servers),
    }
    for where, text in texts.items():
        for what, value in secrets.items():
            assert value not in text, f"the {what} appears in the {where}"
    assert not SecretStore(store).names(f"provider:huaweicloud:{ws}")
