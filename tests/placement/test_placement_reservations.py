"""Reservations: claims written with the placement, in one transaction, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from placement_helpers import GIB, flavor, host
from test_placement_properties import cases

from jupyter_cloudtik.core.errors import CapacityError, NotFoundError
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.placement import Pool, Request
from jupyter_cloudtik.placement.reservations import Reservations
from jupyter_cloudtik.placement.settings import Placement

ONLY_COST = {"cost": 1.0, "spread": 0.0, "pack": 0.0, "anti_affinity": 0.0,
             "recent_failures": 0.0, "spot": 0.0}


def claims(store) -> int:
    return store.query_one("SELECT COUNT(*) FROM placement_claims")[0]


def test_claims_hold_capacity_until_released(store):
    res = Reservations(store)
    offers = [host("a", 4, 16), host("b", 4, 16)]
    req = Request(count=3, resources={"CPU": 2, "memory": GIB}, node_type="worker")
    r1 = res.reserve(offers, [req], cluster="one", user="ann")
    assert r1.state == "active" and r1.instances == 3
    assert sorted(c.offer for c in r1.claims).count("a") in (1, 2)
    # the same offers as the provider sees them: only one more 2-CPU instance fits
    with pytest.raises(CapacityError) as e:
        res.reserve(offers, [req.with_count(2)], cluster="two")
    assert "only 1 of 2" in e.value.message
    assert claims(store) == 3  # the refused request wrote nothing
    r2 = res.reserve(offers, [req.with_count(1)], cluster="two")
    assert r2.instances == 1
    res.release(r1.id)
    r3 = res.reserve(offers, [req.with_count(3)], cluster="three")
    assert r3.instances == 3
    with pytest.raises(NotFoundError):
        res.get("nope")


def test_bound_claims_count_only_until_the_provider_sees_the_node(store):
    res = Reservations(store)
    offers = [host("a", 4, 16)]
    req = Request(count=2, resources={"CPU": 2})
    before = time.time()
    r = res.reserve(offers, [req], cluster="c", snapshot_at=before)
    res.bind(r.id, [(0, "node-0"), (1, "node-1")])
    # a placement that read the offers before the nodes existed must still see the claims
    with pytest.raises(CapacityError):
        res.reserve(offers, [req.with_count(1)], snapshot_at=before)
    # a provider snapshot taken after the nodes exist already counts them itself
    after = [host("a", 4, 16, free_cpus=0)]
    with pytest.raises(CapacityError):
        res.reserve(after, [req.with_count(1)], snapshot_at=time.time())
    freed = [host("a", 4, 16, free_cpus=4)]  # e.g. the nodes stopped
    assert res.reserve(freed, [req.with_count(2)], snapshot_at=time.time()).instances == 2
    assert res.node_placement("c", "node-1")["reservation_id"] == r.id


def test_reservations_expire(store):
    res = Reservations(store, Placement(reservation_ttl=0.3))
    offers = [host("a", 2, 16)]
    req = Request(count=2, resources={"CPU": 1})
    r = res.reserve(offers, [req], cluster="c")
    with pytest.raises(CapacityError):
        res.reserve(offers, [req.with_count(1)])
    time.sleep(0.4)
    assert res.get(r.id).state == "expired"
    assert all(c.state == "released" for c in res.get(r.id).claims)
    assert res.reserve(offers, [req]).instances == 2


def test_finish_keeps_bound_and_releases_the_rest(store):
    res = Reservations(store)
    r = res.reserve([host("a", 8, 16)], [Request(count=3, resources={"CPU": 1})], cluster="c")
    res.bind(r.id, [(0, "n0")])
    done = res.finish(r.id)
    assert done.state == "fulfilled"
    assert [c.state for c in done.claims] == ["bound", "released", "released"]
    res.release_nodes("c", ["n0"])
    assert res.get(r.id).claims[0].state == "released"


def test_failures_rank_an_offer_lower_and_can_be_excluded(store):
    res = Reservations(store)
    offers = [flavor("az1.m", 2, 4, availability_zone="az1", price_per_hour=0.10),
              flavor("az2.m", 2, 4, availability_zone="az2", price_per_hour=0.11)]
    req = Request(count=1, resources={"CPU": 1},
                  weighers={**ONLY_COST, "recent_failures": 5.0})
    r = res.reserve(offers, [req], cluster="c")
    assert r.claims[0].offer == "az1.m"
    assert r.claims[0].alternates == ["az2.m"]
    res.fail(r.id, [0], "Ecs.0000", "capacity not enough in az1")
    assert res.recent_failures() == {"az1.m": 1}
    r2 = res.reserve(offers, [req], cluster="c")
    assert r2.claims[0].offer == "az2.m"  # the cheaper offer just refused a node
    r3 = res.reserve(offers, [req.with_count(1, exclude=["az2.m"])], cluster="c")
    assert r3.claims[0].offer == "az1.m"


def test_pools_and_several_requests_are_one_reservation(store):
    res = Reservations(store)
    pools = {"proj": Pool("proj", free={"CPU": 10})}
    offers = [flavor("m", 2, 4, pool="proj"), flavor("l", 4, 8, pool="proj")]
    head = Request(count=1, resources={"CPU": 4}, node_type="head")
    workers = Request(count=3, resources={"CPU": 2}, node_type="worker")
    r = res.reserve(offers, [head, workers], pools, cluster="c")
    assert [c.node_type for c in r.claims] == ["head", "worker", "worker", "worker"]
    with pytest.raises(CapacityError):  # 10 CPU of quota: 4 + 3 x 2 taken
        res.reserve(offers, [workers.with_count(1)], pools)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_refused_reservation_claims_nothing(case):
    offers, pools, req = case
    with tempfile.TemporaryDirectory() as d:
        store = Store(d)
        res = Reservations(store)
        try:
            r = res.reserve(offers, [req], pools)
        except CapacityError:
            assert claims(store) == 0
        else:
            assert claims(store) == req.count == r.instances
        store.close()


WORKER = textwrap.dedent('''
    import json, os, sys, time
    from jupyter_cloudtik.core.errors import CapacityError
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.placement import Offer, Request
    from jupyter_cloudtik.placement.reservations import Reservations

    state, go, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    res = Reservations(Store(state))
    offers = [Offer(key="rack", provider="static", free={"CPU": 10.0}, total={"CPU": 10.0})]
    req = Request(count=count, resources={"CPU": 1})
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        r = res.reserve(offers, [req], cluster=f"p{os.getpid()}")
        print(json.dumps({"ok": r.instances}))
    except CapacityError as e:
        print(json.dumps({"refused": e.message}))
''')


@pytest.mark.parametrize("procs, each, winners", [(2, 6, 1), (6, 3, 3)])
def test_concurrent_placements_in_several_processes_never_overcommit(
        state_dir, tmp_path, procs, each, winners):
    """Processes placing on the same 10-CPU offer at the same moment: the claims of the
    first are seen by the next, so exactly as many as fit succeed."""
    Reservations(Store(state_dir))  # schema in place before the race
    go = tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ps = [subprocess.Popen([sys.executable, str(script), str(state_dir), str(go), str(each)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ})
          for _ in range(procs)]
    time.sleep(1.0)  # all of them imported and waiting
    go.write_text("go")
    results = []
    for p in ps:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    ok = [r for r in results if "ok" in r]
    assert len(ok) == winners, results
    store = Store(state_dir)
    taken = store.query_one("SELECT COUNT(*) FROM placement_claims WHERE state = 'claimed'")[0]
    assert taken == winners * each <= 10
    refused = [r["refused"] for r in results if "refused" in r]
    assert all("Nothing was reserved" in m for m in refused)
