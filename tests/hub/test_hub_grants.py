"""Issue 26, through a real hub: a cluster config reaches only what the caller is granted.

The finding: ``POST clusters {"config": {"storage": {"remotes": ["physics-data"]},
"setup_commands": [...]}}`` by bob (chemistry) put physics-data's credentials into his
cluster's rclone config; alice wrote into a read-only storage that way; an unknown name
answered with every storage's name.  Here, against real WebDAV servers (rclone serve, one
of them ``--read-only`` with a credential of its own), real local clusters whose nodes run
in the sandbox: another group's storage is the answer of an unknown one and lists nothing;
a read-only grant gives the node the read-only credential only (its writes are refused by
the server), or, without one, the ``up`` is refused naming the field and the admin's fix.
"""

from __future__ import annotations

import uuid

import pytest

from cloudtik_emulators.hub import start_hub, wait_operation
from jupyter_cloudtik.storage.servers import start_server

pytestmark = pytest.mark.slow

ADMIN_PW = f"admin-pw-{uuid.uuid4().hex}"    # may write physics-data
RO_PW = f"read-only-pw-{uuid.uuid4().hex}"   # may only read it
CHEM_PW = f"chem-pw-{uuid.uuid4().hex}"
SCRATCH_PW = f"scratch-pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("grant-servers")
    data = base / "physics"
    (data / "in").mkdir(parents=True)
    (data / "in" / "a.csv").write_text("x\n1\n")
    out = {"rw": start_server("webdav", data, workdir=base / "w1", password=ADMIN_PW),
           "ro": start_server("webdav", data, workdir=base / "w2", password=RO_PW,
                              read_only=True),
           "chem": start_server("webdav", base / "chem", workdir=base / "w3",
                                password=CHEM_PW),
           "scratch": start_server("webdav", base / "scratch", workdir=base / "w4",
                                   password=SCRATCH_PW)}
    yield out
    for srv in out.values():
        srv.stop()


def _storage(srv, **extra):
    options = srv.storage_options()
    password = options.pop("pass")
    return {"spec": {"type": "webdav", "options": options, **extra},
            "secrets": {"pass": password}}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, servers):
    h = start_hub(tmp_path_factory.mktemp("hub-grants"))
    try:
        admin = h.browser("admin")
        api = h.sidekick_api
        ro = servers["ro"].storage_options()
        resources = {
            "provider/pool": {"spec": {"type": "local"}, "groups": ["physics", "chemistry"]},
            "storage/physics-data": {**_storage(servers["rw"], read_only=True),
                                     "read_only_credentials": {"url": ro["url"], "user": ro["user"],
                                                               "pass": RO_PW},
                                     "groups": ["physics"]},
            "storage/physics-nocred": {**_storage(servers["rw"], read_only=True),
                                       "groups": ["physics"]},
            "storage/physics-scratch": {**_storage(servers["scratch"], read_only=False),
                                        "groups": ["physics"]},
            "storage/chem-data": {**_storage(servers["chem"], read_only=False),
                                  "groups": ["chemistry"]},
        }
        for path, body in resources.items():
            r = admin.put(api + f"hub/catalog/{path}", json=body)
            assert r.status_code == 200, (path, r.text)
            assert RO_PW not in r.text and ADMIN_PW not in r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop()
    log = (h.base / "hub.log").read_text(errors="replace")
    assert not [s for s in (ADMIN_PW, RO_PW, CHEM_PW, SCRATCH_PW) if s in log]


def _up(session, api, name, config):
    return session.post(api + "clusters", json={"name": name, "provider": "pool",
                                                 "workers": 0, "config": config})


def _down(session, api, name):
    r = session.delete(api + f"clusters/{name}")
    if r.status_code == 202:
        wait_operation(session, api, r.json()["operation"]["id"])


def test_another_groups_storage_in_a_cluster_config_is_an_unknown_one(hub):
    api = hub.sidekick_api
    bob = hub.session("bob")
    steal = ["cat \"$RCLONE_CONFIG\""]
    theirs = _up(bob, api, "bob-steal", {"storage": {"remotes": ["physics-data"]},
                                         "setup_commands": steal})
    unknown = _up(bob, api, "bob-steal", {"storage": {"remotes": ["no-such-data"]},
                                          "setup_commands": steal})
    assert theirs.status_code == unknown.status_code == 404, (theirs.text, unknown.text)
    assert theirs.json()["field"] == unknown.json()["field"] == "storage.remotes[0]"
    assert theirs.text.replace("physics-data", "X") == unknown.text.replace("no-such-data",
                                                                            "X")
    for name in ("physics-scratch", "physics-nocred", "chem-data"):  # no listing
        assert name not in theirs.text and name not in unknown.text
    assert bob.get(api + "clusters/bob-steal").status_code == 404  # nothing was started
    # his own group's storage is his to give his nodes
    r = _up(bob, api, "bob-ok", {"storage": {"remotes": ["chem-data"]}})
    assert r.status_code == 202, r.text
    try:
        assert wait_operation(bob, api, r.json()["operation"]["id"])["state"] == "succeeded"
    finally:
        _down(bob, api, "bob-ok")


def test_a_read_only_grant_gives_nodes_the_read_only_credential_or_nothing(hub, servers):
    api = hub.sidekick_api
    alice = hub.session("alice")
    # read-only for her, and no read-only credential: refused at `up`, saying the fix
    r = _up(alice, api, "alice-nocred", {"storage": {"remotes": ["physics-nocred"]}})
    assert r.status_code == 403, r.text
    err = r.json()
    assert err["field"] == "storage.remotes[0]" and "read_only_credentials" in \
        err["message"], err
    assert alice.get(api + "clusters/alice-nocred").status_code == 404

    # with one: her node holds it, and only it; its writes are refused by the storage
    marker = f"pwned-{uuid.uuid4().hex[:8]}"
    write = (f'echo {marker} > probe.txt && "$CLOUDTIK_RCLONE" --config "$RCLONE_CONFIG" '
             f'copyto probe.txt physics-data:{marker}.txt && echo W""ROTE-RO || echo R""EFUSED-RO')
    scratch = (f'"$CLOUDTIK_RCLONE" --config "$RCLONE_CONFIG" copyto probe.txt '
               f'physics-scratch:{marker}.txt && echo W""ROTE-SCRATCH')
    # (the log echoes each command: the words it looks for are split by "" there)
    read = ('"$CLOUDTIK_RCLONE" --config "$RCLONE_CONFIG" cat physics-data:in/a.csv '
            '&& echo R""EAD-RO')
    r = _up(alice, api, "alice-ro", {"storage": {"remotes": ["physics-data",
                                                             "physics-scratch"]},
                                     "setup_commands": [write, scratch, read]})
    assert r.status_code == 202, r.text
    try:
        op = wait_operation(alice, api, r.json()["operation"]["id"])
        assert op["state"] == "succeeded", op
        logs = "\n".join(alice.get(api + "clusters/alice-ro/logs").json()["logs"].values())
        assert "REFUSED-RO" in logs and "WROTE-RO" not in logs, logs[-3000:]
        assert "WROTE-SCRATCH" in logs and "READ-RO" in logs, logs[-3000:]
        assert not (servers["rw"].root / f"{marker}.txt").exists()
        assert (servers["scratch"].root / f"{marker}.txt").exists()
        # what the node was given: the read-only server's address, not the writable one
        confs = list((hub.state_dir / "local" / "nodes").glob("alice-ro-*/rclone.conf"))
        assert confs
        for conf in confs:
            text = conf.read_text()
            assert servers["ro"].url in text and servers["rw"].url not in text.split(
                "[physics-scratch]")[0]
        for value in (ADMIN_PW, RO_PW, SCRATCH_PW):
            assert value not in logs
    finally:
        _down(alice, api, "alice-ro")


def test_quotas_count_the_cores_a_node_gets_not_the_ones_it_declares(hub):
    """Issue 26, medium: with ``max_cores: 2`` three workers were refused, but the same
    request with ``resources: {CPU: 0}`` started them, and usage showed cost 0."""
    api = hub.sidekick_api
    alice, admin = hub.session("alice"), hub.browser("admin")
    assert admin.put(api + "hub/quotas/user:alice", json={"max_cores": 2}).status_code == 200
    try:
        for resources in ({}, {"CPU": 0}, {"CPU": 0, "memory": 0}):
            r = alice.post(api + "clusters", json={
                "name": "alice-free", "provider": "pool", "workers": 3,
                "config": {"available_node_types": {"worker": {"resources": resources}}}})
            assert r.status_code == 403 and r.json()["field"] == "quota", (resources, r.text)
            assert "cores" in r.json()["message"]
        assert alice.get(api + "clusters/alice-free").status_code == 404
        # one worker and the head: two cores, as a local worker gets at least one thread
        r = alice.post(api + "clusters", json={
            "name": "alice-free", "provider": "pool", "workers": 1,
            "config": {"available_node_types": {"worker": {"resources": {"CPU": 0}}}}})
        assert r.status_code == 202, r.text
        assert wait_operation(alice, api, r.json()["operation"]["id"])["state"] == \
            "succeeded"
        r = alice.patch(api + "clusters/alice-free", json={"workers": 2})
        assert r.status_code == 403 and "quota" in r.json()["message"], r.text
    finally:
        admin.put(api + "hub/quotas/user:alice", json={"max_cores": None})
        _down(alice, api, "alice-free")
