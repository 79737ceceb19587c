"""Placement inside `up`: every node placed, reserved, shown; refusals explained; failover."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import pytest

from jupyter_cloudtik import Cluster
from jupyter_cloudtik.clusters.placing import ClusterPlacement
from jupyter_cloudtik.core.errors import CapacityError, ConfigError, NodeLaunchError
from jupyter_cloudtik.offers import OfferSet
from jupyter_cloudtik.placement import Offer
from jupyter_cloudtik.providers.base import NodeProvider, ProviderContext


def cli(venv_bin, *args):
    return subprocess.run([str(venv_bin / "jupyter-cloudtik"), *args], capture_output=True,
                          text=True, timeout=180)


def test_up_places_every_node_and_shows_where(backend, venv_bin, state_dir):
    c = Cluster.up(workers=2, name="placed", progress=False, backend=backend)
    info = c.refresh()
    host = socket.gethostname()
    assert info.placement["reservation_id"]
    assert info.placement["cost_per_hour"] == 0.0  # this machine is free
    assert info.to_dict()["summary"]["cost_per_hour"] == 0.0
    rid = info.placement["reservation_id"]
    for n in info.nodes:
        p = n.info["placement"]
        assert p == {"reservation_id": rid, "provider": "local", "availability_zone": host,
                     "flavor": "", "price_per_hour": 0.0, "currency": "",
                     "offer": f"local/{host}"}

    # the estimate was shown before any node started
    [op] = [o for o in backend.operations("placed") if o.kind == "cluster.up"]
    steps = [e.step for e in backend.events(op.id)]
    assert steps.index("placement") < steps.index("head")
    [ev] = [e for e in backend.events(op.id) if e.step == "placement"]
    assert ev.message.startswith("placed 3 node(s) at once (1 x head on local/")
    assert f"reservation {rid}; estimated cost 0.000 per hour" in ev.message

    # the reservation lists its instances, bound to the nodes that exist
    out = cli(venv_bin, "reservations", "show", rid, "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["state"] == "fulfilled" and res["cluster"] == "placed"
    assert sorted(x["node_id"] for x in res["claims"]) == sorted(n.node_id for n in info.nodes)
    assert {x["state"] for x in res["claims"]} == {"bound"}
    status = cli(venv_bin, "status", "placed")
    assert f"cost       0.000 per hour (estimated; reservation {rid})" in status.stdout
    assert f"local/{host} 0.000/h" in status.stdout

    # scaling places the new worker in a reservation of its own; status keeps every node's
    c.scale(3, progress=False)
    info = c.refresh()
    assert all("placement" in n.info for n in info.nodes)
    assert info.placement["reservation_id"] != rid
    assert len({n.info["placement"]["reservation_id"] for n in info.nodes}) == 2

    c.down(progress=False)
    out = json.loads(cli(venv_bin, "reservations", "show", rid, "--json").stdout)
    assert {x["state"] for x in out["claims"]} == {"released"}


def test_refusal_names_the_filter_and_starts_nothing(backend):
    cfg = {"placement": {"availability_zones": ["nowhere"]}}
    with pytest.raises(CapacityError) as e:
        Cluster.up(config=cfg, workers=1, name="lost", progress=False, backend=backend)
    msg = e.value.message
    assert msg.startswith("not enough capacity for cluster 'lost': cannot place 1 x head")
    assert "filter 'availability_zone' eliminated 1" in msg
    assert msg.endswith("nothing was started.")
    assert backend.list(include_stopped=True) == []


def test_a_bad_query_is_a_config_error(backend):
    cfg = {"placement": {"query": ["and", [">=", "$free_ram", 1]]}}
    with pytest.raises(ConfigError) as e:
        Cluster.up(config=cfg, workers=1, name="q", progress=False, backend=backend)
    assert e.value.field == "placement.query[1][1]"
    assert "unknown variable '$free_ram'" in e.value.message
    with pytest.raises(ConfigError) as e:
        Cluster.up(config={"placement": {"strategy": "random"}}, workers=1, name="q",
                   progress=False, backend=backend)
    assert "placement.strategy" in e.value.message


class TwoZoneCloud(NodeProvider):
    """A provider with one flavor in two availability zones whose first zone has run out
    of capacity: create_node there fails the way a cloud does (a stand-in until the
    huaweicloud emulator can play this part)."""

    provider_type = "twozone"
    refuse = {"az-a"}

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.nodes: dict[str, dict] = {}
        self.calls: list[tuple[str, int]] = []

    def offers(self, query=None) -> OfferSet:
        return OfferSet([
            Offer(key=f"twozone/{az}/m2", provider="twozone", availability_zone=az,
                  flavor="m2", size={"CPU": 2, "memory": 4 * 2**30}, price_per_hour=price,
                  currency="EUR", free={"instances": 10}, total={"instances": 10},
                  node_config={"availability_zone": az, "flavor": "m2"})
            for az, price in (("az-a", 0.10), ("az-b", 0.12), ("az-c", 0.14))])

    def create_node(self, node_config, tags, count):
        az = node_config["availability_zone"]
        self.calls.append((az, count))
        if az in self.refuse:
            raise NodeLaunchError(f"Ecs.0000: insufficient capacity in {az}", code="Ecs.0000")
        made = {f"n-{uuid.uuid4().hex[:6]}": {"az": az} for _ in range(count)}
        self.nodes.update(made)
        return made


CFG = {"cluster_name": "fo", "head_node_type": "head",
       "available_node_types": {"worker": {"resources": {"CPU": 2, "memory": 2**30},
                                           "node_config": {"image": "x"}},
                                "head": {"resources": {"CPU": 1}}},
       "placement": {"weighers": {"cost": 1.0, "spread": 0.0, "anti_affinity": 0.0}}}


def test_failover_to_the_alternate_zone(store, settings):
    prov = TwoZoneCloud({"type": "twozone"}, "fo", ProviderContext(store.state_dir, store,
                                                                    settings))
    placement = ClusterPlacement(store, settings)
    res = placement.reserve(prov, CFG, {"worker": 3}, "ann")
    assert {c.availability_zone for c in res.claims} == {"az-a"}  # cheapest first
    assert res.claims[0].alternates[0] == "twozone/az-b/m2"
    notes = []
    ids, rid = placement.create_nodes(prov, CFG, res.id, "worker", {"image": "x"},
                                      {"t": "1"}, 3, "ann", notes.append)
    assert rid == res.id and len(ids) == 3
    assert prov.calls == [("az-a", 3), ("az-b", 3)]
    assert {prov.nodes[i]["az"] for i in ids} == {"az-b"}
    assert "twozone/az-a/m2 refused 3 node(s) (Ecs.0000: insufficient capacity in az-a)" in notes[0]
    after = placement.reservations.get(rid)
    assert [c.state for c in after.claims] == ["failed"] * 3 + ["bound"] * 3
    assert after.price_per_hour == pytest.approx(3 * 0.12)
    assert placement.node_placement("fo", ids[0])["availability_zone"] == "az-b"
    assert placement.reservations.recent_failures() == {"twozone/az-a/m2": 1}
    # the next cluster's placement already ranks the refusing zone lower
    nxt = placement.reserve(prov, {**CFG, "cluster_name": "fo2",
                                   "placement": {"weighers": {"cost": 1.0, "spread": 0.0,
                                                              "recent_failures": 5.0}}},
                            {"worker": 1}, "ann")
    assert nxt.claims[0].availability_zone == "az-b"


def test_failover_gives_up_after_max_failover(store, settings):
    prov = TwoZoneCloud({"type": "twozone"}, "fo", ProviderContext(store.state_dir, store,
                                                                    settings))
    prov.refuse = {"az-a", "az-b", "az-c"}
    placement = ClusterPlacement(store, settings)
    with pytest.raises(NodeLaunchError) as e:
        placement.create_nodes(prov, CFG, None, "worker", {}, {}, 2, "ann")
    assert "no capacity left for 2 x worker" in e.value.message
    assert "refused before: twozone/az-a/m2: Ecs.0000" in e.value.message
    assert [az for az, _n in prov.calls] == ["az-a", "az-b", "az-c"]


def test_two_ups_at_once_never_overcommit_this_machine(venv_bin, state_dir, tmp_path):
    """Two `jupyter cloudtik up` processes race for all of this machine's cores: claims make
    one of them lose cleanly, whichever check catches it."""
    from jupyter_cloudtik.providers.local.capacity import machine_cpus

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "jupyter_cloudtik_config.py").write_text(
        "c.LocalProvider.cpu_overcommit = 1.0\nc.LocalProvider.memory_overcommit = 4.0\n")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(conf)}
    n = machine_cpus()
    procs = [subprocess.Popen([str(venv_bin / "jupyter-cloudtik"), "up", "--name", name,
                               "--workers", str(n)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for name in ("race-a", "race-b")]
    results = [(p.wait(180), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "not enough capacity" in loser and "nothing was started" in loser
    # what runs fits the machine
    out = subprocess.run([str(venv_bin / "jupyter-cloudtik"), "list", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    running = json.loads(out.stdout)
    assert len(running) == 1 and running[0]["summary"]["cores"] == n
