"""Greedy against an exhaustive search on small cases (<= 6 offers, <= 8 instances).

The total cost of a placement is the sum over its instances of the cost of the slot each
one took; because an offer's cost depends only on how many instances it holds, the
exhaustive search enumerates every count vector (x_1..x_n) with Σ x = N that fits the
offers and the shared pool, and keeps the cheapest.  The figures are printed (run with
``-s``) and recorded in docs/placement.md.
"""

from __future__ import annotations

import random
import statistics

import pytest
from placement_helpers import GIB

from jupyter_cloudtik.placement import Engine, Offer, Pool, Request
from jupyter_cloudtik.placement.engine import PlacementError

CASES = 1500
WEIGHERS = ["cost", "spread", "pack", "anti_affinity", "spot", "recent_failures"]


def random_case(rng: random.Random):
    pools = {}
    if rng.random() < 0.4:
        pools["q"] = Pool("q", free={"CPU": rng.choice([4, 8, 12, 16]),
                                     "instances": rng.choice([None, 4, 6, 8])})
    offers = []
    for i in range(rng.randint(1, 6)):
        fixed = rng.random() < 0.5
        total = rng.choice([2, 4, 8, 16])
        offers.append(Offer(
            key=f"o{i}", provider="p", availability_zone=rng.choice("ab"),
            price_per_hour=round(rng.uniform(0, 2), 2) if rng.random() < 0.8 else 0.0,
            spot=rng.random() < 0.3,
            size={"CPU": rng.choice([1, 2, 4]), "memory": rng.choice([2, 4, 8]) * GIB}
            if fixed else None,
            total={"CPU": total, "memory": 64 * GIB},
            free={"CPU": rng.randint(0, total), "memory": rng.randint(0, 64) * GIB,
                  "instances": rng.choice([None, 2, 4, 8])},
            pool="q" if pools and rng.random() < 0.7 else None,
            instances=[{"owner": "u"}] * rng.randint(0, 2),
            recent_failures=rng.choice([0, 0, 0, 1, 3]),
        ))
    req = Request(count=rng.randint(1, 8),
                  resources={"CPU": rng.choice([1, 2]), "memory": rng.choice([1, 2]) * GIB},
                  user="u", strategy=rng.choice(["spread", "pack"]),
                  prefer_spot=rng.random() < 0.3,
                  weighers={k: round(rng.uniform(0, 2), 2) for k in WEIGHERS})
    return offers, pools, req


def optimum(engine: Engine, offers, pools, req) -> float | None:
    _filters, scorer, _expl, rooms = engine.prepare(offers, req, pools)
    cands, state = scorer.cands, scorer.state
    caps = [int(min(r, req.count)) for r in rooms]
    cons = [state.consumption(o) for o in cands]
    best = None

    def fits(xs) -> bool:
        for name, pool in pools.items():
            for d, free in pool.free.items():
                if free is None:
                    continue
                use = sum(x * c.get(d, 0) for x, c, o in zip(xs, cons, cands, strict=True)
                          if o.pool == name)
                if use > free + 1e-9:
                    return False
        return True

    def walk(i: int, left: int, xs: list[int]) -> None:
        nonlocal best
        if i == len(cands):
            if left == 0 and fits(xs):
                cost = sum(scorer.series_cost(j, x) for j, x in enumerate(xs))
                best = cost if best is None else min(best, cost)
            return
        for x in range(min(caps[i], left) + 1):
            walk(i + 1, left - x, [*xs, x])

    walk(0, req.count, [])
    return best


def gap(got: float, best: float) -> float:
    if got - best <= 1e-9:
        return 0.0
    return (got - best) / max(abs(best), 1e-9)


@pytest.mark.parametrize("mix", ["mixed", "pack-heavy"])
def test_greedy_against_exhaustive_search(mix):
    """mixed: every weigher with random multipliers; pack-heavy: offers get cheaper as
    they fill (concave costs), where greedy alone is weakest."""
    rng = random.Random(20260530)
    engine = Engine()
    feasible = within_greedy = within_final = misses = 0
    gaps = []
    for _ in range(CASES):
        offers, pools, req = random_case(rng)
        if mix == "pack-heavy":
            req.strategy = "pack"
            req.weighers = {"pack": 1.0, "cost": rng.choice([0.0, 0.3, 1.0]), "spread": 0.0,
                            "anti_affinity": 0.0, "recent_failures": 0.0}
        best = optimum(engine, offers, pools, req)
        try:
            plan = engine.place(offers, req, pools)
        except PlacementError:
            plan = None
        if best is None:
            assert plan is None, "placed a group that does not fit"
            continue
        feasible += 1
        if plan is None:
            misses += 1
            continue
        greedy = engine.place(offers, req, pools, improve=False)
        within_greedy += gap(greedy.total_cost, best) <= 0.01
        g = gap(plan.total_cost, best)
        within_final += g <= 0.01
        gaps.append(g)
    share = within_final / feasible
    print(f"\noracle ({mix}): {CASES} random cases, {feasible} feasible; within 1% of the optimum: "
          f"greedy alone {within_greedy / feasible:.1%}, with local search {share:.1%}; "
          f"mean gap {statistics.mean(gaps):.3%}, worst {max(gaps):.1%}; "
          f"feasible groups refused: {misses}")
    assert feasible > CASES // 3
    assert share > 0.5, "not within 1% on a majority of cases"
    assert share > 0.98  # it measures 99.6-99.9% today; a drop means a regression
    assert misses <= feasible * 0.01
