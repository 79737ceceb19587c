"""A Huawei Cloud account held by the hub's admins, used by a hub user who never sees it.

A real JupyterHub with the sidekick, and the Huawei Cloud emulator (its own process; the
official huaweicloudsdk* clients talk to it).  The admin puts the account's keys in the
catalogue and creates the workspace through the sidekick; alice starts a cluster from a
template through her own server; the keys are nowhere she can see, nor on the nodes.
"""

from __future__ import annotations

import psutil
import pytest

from cloudtik_emulators.huaweicloud.process import start_emulator
from cloudtik_emulators.hub import start_hub, wait_operation

pytestmark = pytest.mark.slow
RETRY = {"base_delay": 0.01, "attempts": 6, "budget": 5}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    emu = start_emulator(tmp_path_factory.mktemp("hwc-emulator"), bucket_release_seconds=0)
    yield emu
    left = emu.stop()
    assert not left, f"emulated server processes left behind: {left}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, emulator):
    h = start_hub(tmp_path_factory.mktemp("hub"), sidekick_config=(
        "c.CloudTik.operation_timeout = 180\n"))
    yield h
    h.stop()


def test_users_start_clusters_with_an_account_they_never_see(hub, emulator):
    api = hub.sidekick_api
    admin, alice, bob = hub.browser("admin"), hub.session("alice"), hub.session("bob")
    keys = emulator.credentials()
    secret_values = [keys["access_key"], keys["secret_key"]]
    region, endpoint = emulator.info["region"], emulator.info["endpoint"]

    r = admin.put(api + "hub/catalog/provider/hwc-research", json={
        "spec": {"type": "huaweicloud",
                 "config": {"region": region, "endpoint": endpoint,
                            "workspace_name": "research", "retry": RETRY}},
        "secrets": {"access_key": keys["access_key"], "secret_key": keys["secret_key"],
                    "project_id": keys["project_id"]},
        "groups": ["physics"]})
    assert r.status_code == 200, r.text
    r = admin.put(api + "hub/catalog/template/hwc-small", json={
        "spec": {"provider": "hwc-research",
                 "config": {"available_node_types": {
                     "head": {"node_config": {"flavor": "s6.medium.2"}},
                     "worker": {"node_config": {"flavor": "s6.medium.2"}, "max_workers": 4}},
                     "head_node_type": "head"},
                 "limits": {"max_workers": 2, "idle_timeout_minutes": 30}},
        "groups": ["physics"], "description": "up to 2 workers on Huawei Cloud"})
    assert r.status_code == 200, r.text

    # users may not create workspaces; the admin does, with the catalogue's account
    r = alice.post(api + "workspaces", json={"name": "research"})
    assert r.status_code == 403
    r = admin.post(api + "workspaces", json={"name": "research", "config": {"provider": {
        "type": "huaweicloud", "region": region, "endpoint": endpoint,
        "allowed_ssh_sources": ["127.0.0.1/32"], "retry": RETRY}}})
    assert r.status_code == 202, r.text
    op = wait_operation(admin, api, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op

    server = hub.start_server("alice")
    local = server + "cloudtik/api/"
    r = alice.post(local + "clusters", json={"name": "hwc1", "template": "hwc-small",
                                             "workers": 3})
    assert r.status_code == 403 and r.json()["field"] == "workers", r.text
    r = alice.post(local + "clusters", json={"name": "hwc1", "template": "hwc-small",
                                             "workers": 1})
    assert r.status_code == 202, r.text
    op = wait_operation(alice, local, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    info = alice.get(local + "clusters/hwc1").json()
    assert info["owner"] == "alice" and info["state"] == "running"
    assert info["config"]["idle_timeout_minutes"] == 30
    assert info["config"]["provider"]["type"] == "huaweicloud"
    assert bob.get(api + "clusters/hwc1").status_code == 404

    # the keys: not in any answer alice gets, not in her server's processes, not on the nodes
    seen = [alice.get(local + "clusters").text, alice.get(local + "clusters/hwc1").text,
            alice.get(local + "providers").text, alice.get(api + "hub/catalog").text,
            alice.get(local + "operations").text]
    for text in seen:
        for value in secret_values:
            assert value not in text
    for proc in psutil.process_iter(["cmdline", "environ"]):  # skips processes that end
        cmd = " ".join(proc.info["cmdline"] or [])
        if "jupyterhub.singleuser" in cmd or "ipykernel" in cmd:
            env = "\n".join(f"{k}={v}" for k, v in (proc.info["environ"] or {}).items())
            for value in secret_values:
                assert value not in env
    state = emulator.ctl.state()
    servers = [s for s in state["servers"] if s["tags"].get("cloudtik-cluster-name") == "hwc1"]
    assert len(servers) == 2
    for s in servers:
        for value in secret_values:
            assert value not in str(s.get("user_data", "")) and value not in str(s)

    # a sidekick cluster is TLS only: alice's connect answer carries her client
    # certificate, which works; bob gets nothing; the certificate is in no status answer
    r = alice.get(local + "clusters/hwc1/connect")
    assert r.status_code == 200, r.text
    from jupyter_cloudtik.core.models import ConnectInfo
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    cinfo = ConnectInfo.from_dict(r.json()["connect_info"])
    assert cinfo.extra.get("tls") and cinfo.credentials
    assert cinfo.extra["public_scheduler_address"].startswith("tls://")
    with HuaweiCloudNodeProvider.make_client(cinfo, timeout=30) as dask_client:
        assert dask_client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    assert bob.get(api + "clusters/hwc1/connect").status_code == 404
    key_line = cinfo.credentials["key"].splitlines()[1]
    assert key_line not in alice.get(local + "clusters/hwc1").text

    r = alice.delete(local + "clusters/hwc1")
    assert wait_operation(alice, local, r.json()["operation"]["id"])["state"] == "succeeded"
    r = admin.delete(api + "workspaces/research")
    assert r.status_code == 202, r.text
    assert wait_operation(admin, api, r.json()["operation"]["id"])["state"] == "succeeded"
    hub.stop_server("alice")
