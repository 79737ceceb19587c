"""The engine: filters are absolute, weighers relative, all N at once, all or nothing."""

from __future__ import annotations

import math
import textwrap

import pytest
from placement_helpers import GIB, flavor, host

from jupyter_cloudtik.core import plugins
from jupyter_cloudtik.core.errors import CapacityError, ConfigError
from jupyter_cloudtik.placement import Engine, Pool, Request, naive_place
from jupyter_cloudtik.placement.settings import Placement
from jupyter_cloudtik.placement.weighers import normalize

ONLY_COST = {"cost": 1.0, "spread": 0.0, "pack": 0.0, "anti_affinity": 0.0,
             "recent_failures": 0.0, "spot": 0.0}


def engine(**kw) -> Engine:
    return Engine(Placement(**kw))


def test_places_all_instances_against_virtual_depletion():
    offers = [host("a", 4, 16), host("b", 4, 16)]
    plan = engine().place(offers, Request(count=4, resources={"CPU": 2, "memory": GIB}))
    # 2 fit per host: the first two do not both land on one host and then overflow
    assert plan.counts() == {"a": 2, "b": 2}
    assert [c.index for c in plan.choices] == [0, 1, 2, 3]


def test_spread_and_pack():
    offers = [host("a", 8, 32), host("b", 8, 32), host("c", 8, 32, free_cpus=4)]
    req = dict(count=3, resources={"CPU": 1, "memory": GIB})
    spread = engine().place(offers, Request(**req, strategy="spread"))
    assert spread.counts() == {"a": 1, "b": 1, "c": 1} or sorted(spread.counts()) == ["a", "b"]
    assert max(spread.counts().values()) <= 2
    pack = engine().place(offers, Request(**req, strategy="pack"))
    assert pack.counts() == {"c": 3}  # the fullest host first, then keep filling it


def test_cheapest_wins_and_max_price_is_absolute():
    offers = [flavor("small", 2, 4, price_per_hour=0.10),
              flavor("big", 8, 32, price_per_hour=0.40),
              flavor("mid", 4, 8, price_per_hour=0.20)]
    req = Request(count=2, resources={"CPU": 2, "memory": 4 * GIB}, weighers=ONLY_COST)
    assert engine().place(offers, req).counts() == {"small": 2}
    # a flavor too small for the request is filtered, however cheap
    req = Request(count=1, resources={"CPU": 3, "memory": 4 * GIB}, weighers=ONLY_COST)
    plan = engine().place(offers, req)
    assert plan.counts() == {"mid": 1}
    elim = {e.filter: e for e in plan.explanation.eliminations}
    assert elim["resources"].eliminated == 1
    assert "too small" in elim["resources"].examples[0]
    with pytest.raises(CapacityError) as e:
        engine().place(offers, Request(count=1, resources={"CPU": 3}, max_price=0.15))
    assert "max_price" in e.value.message and "resources" in e.value.message


def test_all_or_nothing_names_the_filters():
    offers = [host("a", 4, 16, availability_zone="az1"),
              host("b", 4, 16, availability_zone="az2"),
              host("c", 2, 16, availability_zone="az1", free_cpus=0)]
    req = Request(count=3, resources={"CPU": 2, "memory": GIB}, availability_zones=["az1"],
                  node_type="worker")
    with pytest.raises(CapacityError) as e:
        engine().place(offers, req)
    err = e.value
    # no plan comes back: only the explanation of how far it got
    assert err.explanation.placed == 2 and err.explanation.wanted == 3
    text = err.message
    assert "only 2 of 3 could be placed" in text and "Nothing was reserved" in text
    assert "cannot place 3 x worker (2 CPU, 1.0 GiB)" in text
    assert "filter 'availability_zone' eliminated 1 (e.g. b: zone az2 not in az1)" in text
    assert "filter 'resources' eliminated 1 (e.g. c: CPU 0 free, 2 needed)" in text
    assert "1 candidate(s) left with room for 2 instance(s)" in text
    assert err.to_dict()["explanation"]["candidates"] == 1


def test_shared_quota_pool_is_depleted_across_offers():
    pools = {"proj": Pool("proj", free={"CPU": 8, "instances": 10})}
    offers = [flavor("az1.m", 4, 8, count=5, availability_zone="az1", pool="proj"),
              flavor("az2.m", 4, 8, count=5, availability_zone="az2", pool="proj")]
    req = Request(count=2, resources={"CPU": 4})
    assert sum(engine().place(offers, req, pools).counts().values()) == 2
    with pytest.raises(CapacityError) as e:
        engine().place(offers, req.with_count(3), pools)
    assert "only 2 of 3" in e.value.message


def test_pool_friendly_second_chance():
    # greedy takes the cheap big flavor first and runs the 8-core quota dry; the small
    # flavor fits all four instances
    pools = {"proj": Pool("proj", free={"CPU": 8})}
    offers = [flavor("big", 8, 8, pool="proj", price_per_hour=0.1),
              flavor("small", 2, 8, pool="proj", price_per_hour=0.3)]
    req = Request(count=4, resources={"CPU": 2}, weighers=ONLY_COST)
    assert engine().place(offers, req, pools).counts() == {"small": 4}


def test_anti_affinity_prefers_hosts_without_the_users_instances():
    offers = [host("a", 8, 32, instances=[{"owner": "ann", "cluster": "x"}]),
              host("b", 8, 32, instances=[{"owner": "bob", "cluster": "y"}])]
    req = Request(count=1, resources={"CPU": 1}, user="ann",
                  weighers={**ONLY_COST, "anti_affinity": 1.0})
    assert engine().place(offers, req).counts() == {"b": 1}


def test_recent_failures_and_spot():
    offers = [flavor("f1", 2, 4, recent_failures=2), flavor("f2", 2, 4),
              flavor("f3", 2, 4, spot=True)]
    req = Request(count=1, resources={"CPU": 1}, weighers={**ONLY_COST,
                                                            "recent_failures": 1.0})
    assert engine().place(offers, req).counts() in ({"f2": 1}, {"f3": 1})
    assert engine().place(offers, Request(count=1, resources={"CPU": 1}, prefer_spot=True,
                                          weighers={**ONLY_COST, "spot": 1.0})
                          ).counts() == {"f3": 1}


def test_excluded_offers_are_never_used():
    offers = [flavor("f1", 2, 4, price_per_hour=0.1), flavor("f2", 2, 4, price_per_hour=0.2)]
    req = Request(count=2, resources={"CPU": 1}, exclude=["f1"], weighers=ONLY_COST)
    assert engine().place(offers, req).counts() == {"f2": 2}


def test_alternates_prefer_another_zone():
    offers = [flavor("az1.a", 2, 4, availability_zone="az1", price_per_hour=0.1),
              flavor("az1.b", 2, 4, availability_zone="az1", price_per_hour=0.2),
              flavor("az2.a", 2, 4, availability_zone="az2", price_per_hour=0.3)]
    plan = Engine(Placement(alternates=2)).place(
        offers, Request(count=1, resources={"CPU": 1}, weighers=ONLY_COST))
    assert plan.choices[0].offer == "az1.a"
    assert plan.choices[0].alternates == ["az2.a", "az1.b"]


def test_normalisation():
    assert normalize([3, 3, 3]) == [0.0, 0.0, 0.0]
    assert normalize([1, 3, 2]) == [0.0, 1.0, 0.5]
    assert normalize([]) == []
    assert normalize([5], lo=0, hi=10) == [0.5]


def test_a_weigher_that_cannot_tell_offers_apart_does_not_count():
    offers = [flavor("f1", 2, 4, price_per_hour=1.0), flavor("f2", 2, 4, price_per_hour=1.0)]
    plan = engine().place(offers, Request(count=1, resources={"CPU": 1},
                                          weighers=ONLY_COST))
    assert plan.choices[0].cost == 0.0


def test_request_validation_names_the_field():
    with pytest.raises(ConfigError) as e:
        Request(count=0)
    assert e.value.field == "count"
    with pytest.raises(ConfigError) as e:
        Request.from_dict({"count": 1, "resources": {"cpu": 1}})
    assert e.value.field == "resources.cpu"
    with pytest.raises(ConfigError) as e:
        Request.from_dict({"count": 1, "colour": "red"})
    assert "unknown field" in e.value.message and e.value.field == "colour"
    with pytest.raises(ConfigError) as e:
        Request(count=1, strategy="random")
    assert e.value.field == "strategy"
    with pytest.raises(ConfigError) as e:
        engine().place([host("a")], Request(count=1, filters=["nope"]))
    assert "unknown placement filter 'nope'" in e.value.message


def test_engine_matches_the_naive_loop():
    offers = [host(f"h{i}", 4 + i % 3 * 4, 16 + i % 5 * 8, free_cpus=(i * 7) % 9,
                   price_per_hour=round(0.1 * (i % 4), 2), availability_zone=f"az{i % 3}",
                   instances=[{"owner": "u"}] * (i % 2))
              for i in range(40)]
    req = Request(count=25, resources={"CPU": 1, "memory": 2 * GIB}, user="u")
    e = engine()
    fast = e.place(offers, req, improve=False)
    slow = naive_place(e, offers, req)
    assert [c.offer for c in fast.choices] == [c.offer for c in slow.choices]
    assert math.isclose(fast.total_cost, slow.total_cost)


def test_plugins_come_from_entry_points(tmp_path, monkeypatch):
    """A third-party package declares a filter and a weigher; the engine finds them by name."""
    pkg = tmp_path / "site"
    (pkg / "armonly").mkdir(parents=True)
    (pkg / "armonly" / "__init__.py").write_text(textwrap.dedent('''
        from jupyter_cloudtik.placement import Filter, Weigher

        class ArmOnly(Filter):
            name = "arm_only"

            def passes(self, offer, state):
                return offer.arch == "aarch64"

        class PreferEurope(Weigher):
            name = "prefer_europe"

            def weigh(self, offer, placed, state):
                return 0.0 if offer.region.startswith("eu-") else 1.0
    '''))
    dist = pkg / "armonly-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: armonly\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[jupyter_cloudtik.placement_filters]\narm_only = armonly:ArmOnly\n\n"
        "[jupyter_cloudtik.placement_weighers]\nprefer_europe = armonly:PreferEurope\n")
    monkeypatch.syspath_prepend(str(pkg))
    plugins._entry_points.cache_clear()
    try:
        offers = [host("x86", arch="x86_64", region="eu-west"),
                  host("arm-us", arch="aarch64", region="us-east"),
                  host("arm-eu", arch="aarch64", region="eu-west")]
        req = Request(count=1, resources={"CPU": 1}, filters=["arm_only"],
                      weighers={**ONLY_COST, "prefer_europe": 1.0})
        plan = engine().place(offers, req)
        assert plan.counts() == {"arm-eu": 1}
        elim = {e.filter: e.eliminated for e in plan.explanation.eliminations}
        assert elim["arm_only"] == 1
        assert "arm_only" in plugins.installed("jupyter_cloudtik.placement_filters")
    finally:
        plugins._entry_points.cache_clear()


def test_a_machine_shared_without_limits_still_refuses_a_node_bigger_than_itself():
    """The local provider's offer: cores and memory free without limit (oversubscription
    is allowed), but no single node bigger than the machine's memory (``node_max``)."""
    from jupyter_cloudtik.placement import Offer

    machine = Offer(key="local/box", provider="local", total={"CPU": 2, "memory": 8 * GIB},
                    free={"CPU": None, "memory": None, "GPU": 0, "instances": 64},
                    node_max={"memory": 8 * GIB})
    plan = engine().place([machine], Request(count=40, resources={"CPU": 1, "memory": GIB}))
    assert plan.counts() == {"local/box": 40}  # 40 cores' worth on 2: allowed
    with pytest.raises(CapacityError) as e:
        engine().place([machine], Request(count=1, resources={"CPU": 1, "memory": 9 * GIB}))
    assert "one node cannot have more than the machine (memory 9.0 GiB asked, 8.0 GiB there)" \
        in e.value.message
    with pytest.raises(CapacityError, match="room for 64 instance"):  # processes it holds
        engine().place([machine], Request(count=65, resources={"CPU": 1}))
