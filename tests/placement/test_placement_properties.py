"""Property tests (hypothesis): what must hold for every set of offers and every request."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from placement_helpers import GIB

from jupyter_cloudtik.core.errors import CapacityError, ConfigError
from jupyter_cloudtik.placement import (
    Engine,
    Offer,
    Pool,
    Request,
    VirtualState,
    naive_place,
)
from jupyter_cloudtik.placement.engine import PlacementError
from jupyter_cloudtik.placement.jsonfilter import compile_query
from jupyter_cloudtik.placement.weighers import normalize

ZONES = ["az1", "az2", "az3"]
WEIGHERS = ["cost", "spread", "pack", "spot", "anti_affinity", "recent_failures"]
QUERIES = [
    [">=", "$free_cpus", 2],
    ["=", "$arch", "x86_64"],
    ["or", ["=", "$spot", True], ["<", "$price_per_hour", 0.5]],
    ["not", ["in", "$availability_zone", "az3"]],
    ["and", [">=", "$free_ram_mb", 1024], ["=", "$capabilities.ssd", True]],
]
ENGINE = Engine()


@st.composite
def cases(draw):
    n = draw(st.integers(1, 7))
    pools = {}
    if draw(st.booleans()):
        pools["q"] = Pool("q", free={"CPU": draw(st.integers(0, 24)),
                                     "instances": draw(st.none() | st.integers(0, 10))})
    offers = []
    for i in range(n):
        total_cpu = draw(st.sampled_from([1, 2, 4, 8, 16]))
        total_mem = draw(st.sampled_from([2, 8, 32])) * GIB
        size = None
        if draw(st.booleans()):
            size = {"CPU": draw(st.sampled_from([1, 2, 4])),
                    "memory": draw(st.sampled_from([1, 4, 8])) * GIB}
        offers.append(Offer(
            key=f"o{i}", provider=draw(st.sampled_from(["p1", "p2"])),
            availability_zone=draw(st.sampled_from(ZONES)),
            arch=draw(st.sampled_from(["x86_64", "aarch64"])),
            spot=draw(st.booleans()),
            price_per_hour=draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0])),
            size=size,
            total={"CPU": total_cpu, "memory": total_mem},
            free={"CPU": draw(st.integers(0, total_cpu)),
                  "memory": draw(st.integers(0, total_mem // GIB)) * GIB,
                  "instances": draw(st.none() | st.integers(0, 6))},
            pool="q" if pools and draw(st.booleans()) else None,
            capabilities={"ssd": draw(st.booleans())},
            instances=[{"owner": "u", "cluster": "c"}] * draw(st.integers(0, 2)),
            recent_failures=draw(st.integers(0, 2)),
        ))
    req = Request(
        count=draw(st.integers(1, 10)),
        resources={"CPU": draw(st.sampled_from([0, 1, 2])),
                   "memory": draw(st.sampled_from([0, 1, 2])) * GIB},
        user="u", cluster="c",
        strategy=draw(st.sampled_from(["spread", "pack"])),
        prefer_spot=draw(st.booleans()),
        max_price=draw(st.none() | st.sampled_from([0.1, 0.5, 1.0])),
        availability_zones=draw(st.none() | st.lists(st.sampled_from(ZONES), min_size=1,
                                                     max_size=2, unique=True)),
        query=draw(st.none() | st.sampled_from(QUERIES)),
        capabilities=draw(st.none() | st.just({"arch": "x86_64"})),
        weighers=draw(st.dictionaries(st.sampled_from(WEIGHERS),
                                      st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]))),
    )
    return offers, pools, req


def _place(offers, pools, req, improve=True):
    try:
        return ENGINE.place(offers, req, pools, improve=improve)
    except PlacementError:
        return None


PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(cases())
def test_a_placement_never_violates_an_active_filter(case):
    offers, pools, req = case
    plan = _place(offers, pools, req)
    assume(plan is not None)
    filters = ENGINE.filters_for(req)
    by_key = {o.key: o for o in offers}
    # static filters: every chosen offer passes each of them
    fresh = VirtualState(req, pools)
    for key in plan.counts():
        for f in filters:
            if not f.dynamic:
                assert f.passes(by_key[key], fresh), (f.name, key)
    # dynamic (capacity) filters: replaying the choices, each one passes before it is made
    state = VirtualState(req, pools)
    for c in plan.choices:
        offer = by_key[c.offer]
        for f in filters:
            assert f.passes(offer, state), (f.name, c.offer, state.placed)
        state.place(offer)


@PROPS
@given(cases())
def test_virtual_depletion_never_overcommits(case):
    offers, pools, req = case
    plan = _place(offers, pools, req)
    assume(plan is not None)
    used: dict[str, dict[str, float]] = {}
    pool_used: dict[str, dict[str, float]] = {}
    by_key = {o.key: o for o in offers}
    for c in plan.choices:
        o = by_key[c.offer]
        for d, v in o.consumption(req).items():
            used.setdefault(o.key, {}).setdefault(d, 0.0)
            used[o.key][d] += v
            if o.pool in pools:
                pool_used.setdefault(o.pool, {}).setdefault(d, 0.0)
                pool_used[o.pool][d] += v
    for key, dims in used.items():
        for d, v in dims.items():
            free = by_key[key].free.get(d)
            assert free is None or v <= free + 1e-9, (key, d, v, free)
    for name, dims in pool_used.items():
        for d, v in dims.items():
            free = pools[name].free.get(d)
            assert free is None or v <= free + 1e-9, (name, d, v, free)


@PROPS
@given(cases())
def test_all_or_nothing(case):
    offers, pools, req = case
    try:
        plan = ENGINE.place(offers, req, pools)
    except CapacityError as e:
        assert e.explanation.placed < req.count
        assert "Nothing was reserved" in e.message
        # and then no smaller slice of the group fits the same room: the room is short
        return
    assert len(plan.choices) == req.count
    assert sum(plan.counts().values()) == req.count


@PROPS
@given(cases())
def test_heap_engine_equals_the_naive_loop_and_search_only_improves(case):
    offers, pools, req = case
    greedy = _place(offers, pools, req, improve=False)
    try:
        naive = naive_place(ENGINE, offers, req, pools)
    except PlacementError:
        naive = None
    if naive is not None:
        assert greedy is not None
        assert [c.offer for c in greedy.choices] == [c.offer for c in naive.choices]
        assert math.isclose(greedy.total_cost, naive.total_cost, abs_tol=1e-9)
    if greedy is not None:
        improved = _place(offers, pools, req)
        assert improved.total_cost <= greedy.total_cost + 1e-9


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_normalisation(values):
    out = normalize(values)
    assert len(out) == len(values)
    assert all(0.0 <= v <= 1.0 for v in out)
    if max(values) == min(values):
        assert out == [0.0] * len(values)
    else:
        assert out[values.index(min(values))] == 0.0
        assert out[values.index(max(values))] == 1.0
        for a, b, na, nb in zip(values, values[1:], out, out[1:], strict=False):
            if a < b:
                assert na <= nb
            if a > b:
                assert na >= nb


# --- the JSON grammar --------------------------------------------------------------------
NUM_VARS = ["$free_cpus", "$free_ram_mb", "$price_per_hour", "$total_cpus",
            "$capabilities.cores"]
TEXT_VARS = ["$arch", "$availability_zone", "$capabilities.model", "$capabilities.missing"]
BOOL_VARS = ["$spot", "$capabilities.ssd"]

leaf = st.one_of(
    st.tuples(st.sampled_from(["=", "<", ">", "<=", ">="]), st.sampled_from(NUM_VARS),
              st.integers(-2, 40) | st.floats(0, 4, allow_nan=False)).map(list),
    st.tuples(st.just("="), st.sampled_from(TEXT_VARS),
              st.sampled_from(["x86_64", "aarch64", "az1", "A100", 3])).map(list),
    st.tuples(st.just("="), st.sampled_from(BOOL_VARS), st.booleans()).map(list),
    st.tuples(st.just("in"), st.sampled_from(TEXT_VARS + NUM_VARS),
              st.lists(st.sampled_from(["az1", "x86_64", 4, 8, None]), min_size=1,
                       max_size=3)).map(lambda t: [t[0], t[1], *t[2]]),
)
queries = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: ["and", *xs]),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: ["or", *xs]),
        inner.map(lambda x: ["not", x]),
    ),
    max_leaves=8,
)


def reference(q, env):
    """An independent reading of the grammar, straight from the documentation."""
    def val(x):
        if isinstance(x, str) and x.startswith("$"):
            return env.get(x[1:])
        if isinstance(x, list):
            return reference(x, env)
        return x

    def cmp(op, a, b):
        if a is None or b is None:
            return op == "=" and a is None and b is None
        if isinstance(a, bool) != isinstance(b, bool):
            return False
        try:
            return {"=": a == b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        except TypeError:
            return False

    op, *args = q
    if op == "and":
        return all(reference(a, env) for a in args)
    if op == "or":
        return any(reference(a, env) for a in args)
    if op == "not":
        return not reference(args[0], env)
    if op == "in":
        v = val(args[0])
        return any(cmp("=", v, val(a)) for a in args[1:])
    return cmp(op, val(args[0]), val(args[1]))


offer_envs = st.fixed_dictionaries({
    "free_cpus": st.integers(0, 32), "free_gib": st.integers(0, 64),
    "price": st.sampled_from([0.0, 0.5, 3.0]), "total": st.integers(32, 64),
    "arch": st.sampled_from(["x86_64", "aarch64"]), "zone": st.sampled_from(["az1", "az2"]),
    "spot": st.booleans(), "ssd": st.booleans(), "model": st.sampled_from(["A100", "T4"]),
    "cores": st.none() | st.integers(1, 16),
})


@settings(max_examples=400, deadline=None)
@given(queries, offer_envs)
def test_json_queries_mean_what_the_grammar_says(q, e):
    caps = {"ssd": e["ssd"], "model": e["model"]}
    if e["cores"] is not None:
        caps["cores"] = e["cores"]
    offer = Offer(key="o", provider="p", arch=e["arch"], availability_zone=e["zone"],
                  spot=e["spot"], price_per_hour=e["price"], capabilities=caps,
                  total={"CPU": e["total"]},
                  free={"CPU": e["free_cpus"], "memory": e["free_gib"] * GIB})
    env = {"free_cpus": e["free_cpus"], "free_ram_mb": e["free_gib"] * 1024,
           "price_per_hour": e["price"], "total_cpus": e["total"], "arch": e["arch"],
           "availability_zone": e["zone"], "spot": e["spot"], **{
               f"capabilities.{k}": v for k, v in caps.items()}}
    got = compile_query(q)(offer, VirtualState(Request(count=1)))
    assert got == reference(q, env)


def _paths(q, path=()):
    """Argument positions of a query (paths into nested lists)."""
    if isinstance(q, list):
        for i, a in enumerate(q[1:], start=1):
            yield (*path, i)
            yield from _paths(a, (*path, i))


BAD = [  # (replacement, extra path suffix of the reported field, words in the message)
    ({"a": 1}, "", "is an object"),
    (["~", 1, 2], "[0]", "not an operator"),
    (["<", "$free_cpus"], "", "exactly 2 arguments"),
    ("$no_such_variable", "", "unknown variable"),
    (["not"], "", "exactly 1 argument"),
]


@settings(max_examples=300, deadline=None)
@given(queries, st.data())
def test_malformed_queries_are_refused_naming_the_bad_part(q, data):
    paths = list(_paths(q))
    path = data.draw(st.sampled_from(paths))
    bad, suffix, words = data.draw(st.sampled_from(BAD))
    broken = _copy(q)
    node = broken
    for i in path[:-1]:
        node = node[i]
    node[path[-1]] = bad
    with pytest.raises(ConfigError) as err:
        compile_query(broken)
    want = "query" + "".join(f"[{i}]" for i in path) + suffix
    assert err.value.field == want
    assert words in err.value.message


def _copy(q):
    return [_copy(x) for x in q] if isinstance(q, list) else q
