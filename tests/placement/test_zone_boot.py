"""Zones boot nodes: a parent's ``boot`` makes each child create the instances it chose,
through its own core and local provider, under the reservation id; ``reservations show``
lists the nodes and their states across zones (the seed's ``GET /servers?reservation_id=``).

    p (no offers of its own) ── a  (local provider: this machine, 1 CPU)
                             └── b  (no offers) ── b1 (local provider, 1 CPU)

Each zone is its own server process with its own state folder; the nodes are real
``dask scheduler`` processes started by the children's providers.
"""

from __future__ import annotations

import json

import pytest

from cloudtik_emulators.zones import start_zone, wait_until
from jupyter_cloudtik.providers.local.processes import find_marked_processes

pytestmark = pytest.mark.slow

# one CPU per local zone, whatever the machine has: capacity is what the test reasons on
ONE_CPU = {"LocalProvider": {"cpu_overcommit": 0.5}}
REQUEST = {"count": 2, "resources": {"CPU": 1}, "node_type": "head", "cluster": "big",
           "user": "ann"}
NODE = {"runtime": {"role": "head"}}  # a head node: one `dask scheduler` process


def nodes_of(zone) -> dict[int, str]:
    return find_marked_processes(zone.state_dir)


@pytest.fixture(scope="module")
def zones(tmp_path_factory):
    root = tmp_path_factory.mktemp("zone-boot")
    started = []
    try:
        slow = {"zone_timeout": 20.0, "boot_timeout": 120.0}
        b1 = start_zone(root, "b1", [], "tok-b1", slow, providers="local", config=ONE_CPU)
        started.append(b1)
        b = start_zone(root, "b", [], "tok-b", slow)
        started.append(b)
        a = start_zone(root, "a", [], "tok-a", slow, providers="local", config=ONE_CPU)
        started.append(a)
        p = start_zone(root, "p", [], "tok-p", slow)
        started.append(p)
        for parent, child, extra in ((p, a, []), (p, b, ["--offset", "0.5"]),
                                     (b, b1, [])):
            out = parent.cli("zone", "add", child.name, child.url, *extra,
                             "--token-env", "CHILD_TOKEN", env={"CHILD_TOKEN": child.token})
            assert out.returncode == 0, out.stderr
        yield {z.name: z for z in started}
    finally:
        for z in started:
            z.stop()
        for z in started:  # nothing a test booted outlives the module
            for pid in nodes_of(z):
                import os
                import signal

                os.kill(pid, signal.SIGKILL)


def select_and_boot(p, node_config=NODE):
    status, sel = p.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST},
                         timeout=60)
    assert status == 200, sel
    assert [o["count"] for o in sel["options"]] == [1, 1], sel
    hints = [{"hint": o["hint"], "count": 1} for o in sel["options"]]
    return p.call("POST", "/cloudtik/api/zones/boot",
                  {"request": REQUEST, "hints": hints, "node_config": node_config},
                  timeout=150)


def test_boot_creates_nodes_in_the_children_and_release_ends_them(zones):
    p, a, b, b1 = zones["p"], zones["a"], zones["b"], zones["b1"]
    assert nodes_of(a) == {} and nodes_of(b1) == {}
    status, boot = select_and_boot(p)
    assert status == 200, boot
    assert boot["instances"] == 2
    rid = boot["reservation_id"]

    # the children's providers started one real process each (a forked process marks
    # itself as its node a moment after the launcher answered)
    assert wait_until(lambda: len(nodes_of(a)) == 1 and len(nodes_of(b1)) == 1, 20)
    [a_node] = nodes_of(a).values()
    [b1_node] = nodes_of(b1).values()
    assert nodes_of(b) == {} and nodes_of(p) == {}  # b only forwarded to b1

    # the parent's admin sees every node and its state, across zones
    out = p.cli("reservations", "show", rid, "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    got = sorted((s["zone"], s["node_id"], s["state"]) for s in shown["servers"])
    # b1's node is listed under b: the parent never learns the layout below its child
    assert got == [("a", a_node, "running"), ("b", b1_node, "running")]
    assert shown["unreachable"] == []
    text = p.cli("reservations", "show", rid).stdout
    assert f"a                running     {a_node}" in text
    assert f"b                running     {b1_node}" in text

    # the same list over HTTP, as the seed's GET /servers?reservation_id= gives it
    remote = {r["zone"]: r["remote_id"] for r in shown["remote"]}
    status, srv = a.call("GET", f"/cloudtik/api/servers?reservation_id={remote['a']}")
    assert status == 200, srv
    assert [(s["node_id"], s["state"]) for s in srv["servers"]] == [(a_node, "running")]
    # the child's node runs under its own reservation id, tagged with it
    assert a_node.startswith(f"zone-{remote['a']}-head-")
    status, err = a.call("GET", "/cloudtik/api/servers?reservation_id=")
    assert status == 400 and err["field"] == "reservation_id"
    status, err = a.call("GET", "/cloudtik/api/servers?reservation_id=nope")
    assert status == 404
    status, _ = a.call("GET", f"/cloudtik/api/servers?reservation_id={remote['a']}",
                       token="wrong")
    assert status == 401

    # capacity holds: both local zones are full, so nothing more can be placed
    status, sel = p.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST},
                         timeout=60)
    assert status == 200 and sel["options"] == []

    # the parent's admin releases it: every node down the tree ends
    out = p.cli("reservations", "release", rid)
    assert out.returncode == 0, out.stderr
    assert wait_until(lambda: not nodes_of(a) and not nodes_of(b1), 30)
    shown = json.loads(p.cli("reservations", "show", rid, "--json").stdout)
    assert shown["state"] == "released" and shown["servers"] == []
    status, srv = a.call("GET", f"/cloudtik/api/servers?reservation_id={remote['a']}")
    assert status == 200 and srv["state"] == "released"
    assert [(s["node_id"], s["state"]) for s in srv["servers"]] == [(a_node, "terminated")]


def test_a_failed_part_ends_the_nodes_of_the_others(zones):
    p, a, b1 = zones["p"], zones["a"], zones["b1"]
    # a node_config the child's provider cannot use: a worker with no scheduler to join
    status, err = select_and_boot(p, {"runtime": {"role": "worker"}})
    assert status == 400 or status >= 500, err
    assert "node_config" in err["message"]
    assert nodes_of(a) == {} and nodes_of(b1) == {}
    status, err = p.call("POST", "/cloudtik/api/zones/boot",
                         {"request": REQUEST, "hints": [{"hint": "x"}], "node_config": 3})
    assert status == 400 and err["field"] == "node_config"

    # b1 dies after select: a has already booted its node when b's part fails, and the
    # parent's rollback ends a's node too (all parts or none)
    status, sel = p.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST},
                         timeout=60)
    assert status == 200 and len(sel["options"]) == 2
    b1.stop()
    hints = [{"hint": o["hint"], "count": 1} for o in sel["options"]]
    status, err = p.call("POST", "/cloudtik/api/zones/boot",
                         {"request": REQUEST, "hints": hints, "node_config": NODE},
                         timeout=150)
    assert status == 502 and "zone 'b'" in err["message"], err
    assert wait_until(lambda: not nodes_of(a), 30)
    out = a.cli("reservations", "list", "--json")
    assert all(r["state"] == "released" for r in json.loads(out.stdout))
