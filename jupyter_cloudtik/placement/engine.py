"""The placement engine: all N instances of a request at once, against virtual depletion.

1. **Filter** (absolute).  Every active filter runs once over the offers, in order; what
   each one eliminated is recorded for the explanation.  Capacity filters (``resources``,
   ``quota``, ``excluded``) always run.
2. **Weigh** (relative).  Each active weigher is normalised over the candidate set (for
   weighers that depend on fullness: over every slot the request could use), so the cost
   of the k-th instance on offer o is ``Σ multiplier x normalised weight`` and depends
   only on o and k.
3. **Place**.  Instances go one by one to the cheapest slot, taken from a heap.  Placing
   on an offer changes only that offer's cost (its own depletion), so only it is re-weighed
   and pushed back; capacity filters are re-checked lazily when an offer comes up again.
   This is exactly what the seed's loop (per instance: filter all hosts, weigh all, sort)
   computes — ``naive_place`` below does it that way and the tests and the benchmark check
   both agree — at O((M + N) log M) instead of O(N x M log M).
4. **Improve**.  Greedy is optimal when every offer's cost grows with use (spread,
   anti-affinity, static weighers) and there is no shared pool.  When a weigher makes an
   offer cheaper as it fills (pack) or offers of different sizes share a pool, a small
   local search moves instances between offers while that lowers the total.
5. **All or nothing.**  If the request cannot be placed whole, nothing is returned but a
   ``PlacementError`` that says which filter eliminated what and where room ran out.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..core.errors import CapacityError
from ..offers import (
    Choice,
    Elimination,
    Explanation,
    Offer,
    Plan,
    Pool,
    Request,
    VirtualState,
)
from . import filters as filtmod
from . import weighers as weighmod
from .settings import Placement

EXAMPLES = 3
LOCAL_SEARCH_ROUNDS = 50
LOCAL_SEARCH_SECONDS = 0.05  # the search improves; it must never be what makes `up` slow
SEARCH_TARGETS = 64  # cheapest offers the search may move instances to
MOVE_SIZES = 8  # moves of 1..8 instances, half and all of an offer's


class PlacementError(CapacityError):
    """The request cannot be placed whole; nothing was claimed."""

    reason = "capacity"

    def __init__(self, message: str, *, request: Request | None = None,
                 explanation: Explanation | None = None, **kw) -> None:
        super().__init__(message, field=kw.pop("field", "count"), **kw)
        self.request = request
        self.explanation = explanation

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.explanation is not None:
            d["explanation"] = self.explanation.to_dict()
        return d


@dataclass
class _Weighing:
    weigher: weighmod.Weigher
    multiplier: float
    coef: float  # multiplier / span of the weigher over the candidate set
    lo: float
    values: list[float]  # raw weight of each candidate's first slot


class Scorer:
    """The cost of slot (candidate i, k-th instance): shared by the engine and the
    naive reference so both compute bit-identical numbers."""

    def __init__(self, cands: list[Offer], weighings: list[_Weighing],
                 state: VirtualState) -> None:
        self.cands = cands
        self.weighings = weighings
        self.state = state
        self.has_dynamic = any(w.weigher.dynamic for w in weighings)
        self.first = [self.cost(i, 0) for i in range(len(cands))]

    def cost(self, i: int, placed: int) -> float:
        total = 0.0
        offer = self.cands[i]
        for w in self.weighings:
            if w.weigher.dynamic and placed:
                v = w.weigher.weigh(offer, placed, self.state)
            else:
                v = w.values[i]
            total += w.coef * (v - w.lo)
        return total

    def series_cost(self, i: int, n: int) -> float:
        """Total cost of the first ``n`` instances on candidate i."""
        if not self.has_dynamic:
            return self.first[i] * n
        return sum(self.cost(i, k) for k in range(n))


class Engine:
    """Places requests on offers; pure (no store, no I/O): reservations add the claims."""

    def __init__(self, settings: Placement | None = None) -> None:
        self.settings = settings or Placement()

    # plugins -----------------------------------------------------------------------------
    def filters_for(self, request: Request) -> list[filtmod.Filter]:
        names = request.filters if request.filters is not None else list(
            self.settings.default_filters)
        ordered: list[str] = ["excluded"]
        for n in [*names, "resources", "quota"]:
            if n not in ordered:
                ordered.append(n)
        out = []
        for n in ordered:
            f = filtmod.filter_class(n)()
            if f.prepare(request):
                out.append(f)
        return out

    def weighers_for(self, request: Request) -> list[tuple[weighmod.Weigher, float]]:
        configured = dict(self.settings.weighers)
        for k, v in (request.weighers or {}).items():
            configured[k] = float(v)
        out = []
        for name, m in configured.items():
            w = weighmod.weigher_class(name)()
            mult = w.multiplier(request, float(m))
            if mult:
                w.prepare(request)
                out.append((w, mult))
        return out

    # placing ---------------------------------------------------------------------------------
    def prepare(self, offers: Sequence[Offer], request: Request,
                pools: dict[str, Pool] | None = None
                ) -> tuple[list[filtmod.Filter], Scorer, Explanation, list[float]]:
        """Filter and weigh once: the candidates, their scorer, the explanation so far."""
        state = VirtualState(request, pools)
        filters = self.filters_for(request)
        expl = Explanation(offers=len(offers), wanted=request.count)
        cands = list(offers)
        for f in filters:
            kept = f.filter_all(cands, state)
            gone = len(cands) - len(kept)
            examples: list[str] = []
            if gone:
                kept_ids = {id(o) for o in kept}
                for o in cands:
                    if id(o) not in kept_ids:
                        examples.append(f.reason(o, state))
                        if len(examples) >= EXAMPLES:
                            break
            expl.eliminations.append(Elimination(f.name, gone, examples))
            cands = kept
        expl.candidates = len(cands)
        rooms = [min(state.room(o), state.pool_room(o)) for o in cands]
        expl.room = sum(rooms) if rooms else 0
        weighings = []
        horizon = [max(min(r, request.count) - 1, 0) for r in rooms]
        for w, m in self.weighers_for(request):
            values = w.weigh_all(cands, state)
            if not values:
                continue
            lo, hi = min(values), max(values)
            if w.dynamic:
                last = [w.weigh(o, int(h), state) if h else v
                        for o, h, v in zip(cands, horizon, values, strict=True)]
                lo, hi = min(lo, min(last)), max(hi, max(last))
            if w.minval is not None:
                lo = w.minval
            if w.maxval is not None:
                hi = w.maxval
            expl.weighers[w.name] = m
            if hi - lo <= 0:
                continue  # cannot tell the candidates apart: contributes 0
            weighings.append(_Weighing(w, m, m / (hi - lo), lo, values))
        return filters, Scorer(cands, weighings, state), expl, rooms

    def place(self, offers: Sequence[Offer], request: Request,
              pools: dict[str, Pool] | None = None, improve: bool = True) -> Plan:
        """Place all ``request.count`` instances or raise ``PlacementError``."""
        filters, scorer, expl, rooms = self.prepare(offers, request, pools)
        dynamic = [f for f in filters if f.dynamic]
        order: list[tuple[float, int]] = []  # the greedy's hand-out order
        counts = _greedy(scorer, dynamic, request.count, expl, order)
        if sum(counts.values()) < request.count and pools:
            # offers of different sizes share a pool: fill smallest consumers first
            counts = _fill_pool_friendly(scorer, dynamic, request.count, rooms)
        placed = sum(counts.values())
        expl.placed = placed
        if placed < request.count:
            raise PlacementError(
                f"cannot place {request.describe()}: {expl.text()}. Nothing was reserved.",
                request=request, explanation=expl)
        if improve and _worth_searching(scorer, pools or {}):
            extra = [f for f in dynamic if f.name not in ("resources", "quota")]
            if extra:
                rooms = _rooms_under(scorer, extra, rooms, request.count, counts)
            counts = _Search(scorer, counts, rooms, pools or {}).run()
        return self._plan(scorer, counts, request, expl, order)

    def place_all(self, offers: Sequence[Offer], requests: Iterable[Request],
                  pools: dict[str, Pool] | None = None) -> list[Plan]:
        """Several requests (head and worker types of one cluster) against one depletion;
        all of them or none."""
        cur = list(offers)
        cur_pools = {k: replace(p, free=dict(p.free)) for k, p in (pools or {}).items()}
        plans = []
        for req in requests:
            plan = self.place(cur, req, cur_pools)
            plans.append(plan)
            cur, cur_pools = deplete(cur, cur_pools, plan)
        return plans

    def _plan(self, scorer: Scorer, counts: dict[int, int], request: Request,
              expl: Explanation, order: list[tuple[float, int]] | None = None) -> Plan:
        cands = scorer.cands
        # instance order: as the greedy handed them out; after the search changed the
        # counts, cheapest slot first
        greedy: dict[int, int] = {}
        for _c, i in order or []:
            greedy[i] = greedy.get(i, 0) + 1
        if order and greedy == counts:
            slots = [(c, i, 0) for c, i in order]
        else:
            slots = sorted((scorer.cost(i, k), i, k) for i, n in counts.items()
                           for k in range(n))
        k_alt = max(self.settings.alternates, 0)
        ranked = heapq.nsmallest(min(len(cands), k_alt * 3 + 1), range(len(cands)),
                                 key=lambda j: (scorer.first[j], j))
        alternates: dict[int, list[str]] = {}
        for i in counts:
            mine = cands[i]
            others = [j for j in ranked if j != i]
            where = (mine.provider, mine.availability_zone)
            far = [j for j in others if (cands[j].provider, cands[j].availability_zone) != where]
            first = far[:1]
            rest = [j for j in others if j not in first]
            alternates[i] = [cands[j].key for j in first + rest][:k_alt]
        choices = [Choice(idx, cands[i].key, c, alternates[i])
                   for idx, (c, i, _k) in enumerate(slots)]
        used = {cands[i].key: cands[i] for i in counts}
        for i in ranked:
            used.setdefault(cands[i].key, cands[i])
        return Plan(request=request, choices=choices, explanation=expl, offers=used)


def _greedy(scorer: Scorer, dynamic: list[filtmod.Filter], count: int,
            expl: Explanation, order: list[tuple[float, int]] | None = None
            ) -> dict[int, int]:
    state = scorer.state
    cands = scorer.cands
    heap = [(c, i) for i, c in enumerate(scorer.first)]
    heapq.heapify(heap)
    counts: dict[int, int] = {}
    placed = 0
    has_dynamic = scorer.has_dynamic
    while placed < count and heap:
        c, i = heapq.heappop(heap)
        offer = cands[i]
        ok = True
        for f in dynamic:
            if not f.passes(offer, state):
                ok = False
                break
        if not ok:
            if len(expl.exhausted) < EXAMPLES:
                expl.exhausted.append(offer.key)
            continue
        state.place(offer)
        n = counts.get(i, 0) + 1
        counts[i] = n
        placed += 1
        if order is not None:
            order.append((c, i))
        heapq.heappush(heap, (scorer.cost(i, n) if has_dynamic else c, i))
    return counts


def _fill_pool_friendly(scorer: Scorer, dynamic: list[filtmod.Filter], count: int,
                        rooms: list[float]) -> dict[int, int]:
    """Second chance when greedy ran a shared pool dry with big offers: take offers that
    consume the least of their pool first (cost breaks ties)."""
    state = VirtualState(scorer.state.request, scorer.state.pools)
    scorer.state = state
    cands = scorer.cands

    def pool_use(i: int) -> float:
        o = cands[i]
        if o.pool is None or o.pool not in state.pools:
            return 0.0
        cons = state.consumption(o)
        pool = state.pools[o.pool]
        return max((cons.get(d, 0) / pool.free[d]) for d in cons
                   if pool.free.get(d) not in (None, 0)) if any(
            pool.free.get(d) not in (None, 0) for d in cons) else 0.0

    order = sorted(range(len(cands)), key=lambda i: (pool_use(i), scorer.first[i], i))
    counts: dict[int, int] = {}
    placed = 0
    for i in order:
        offer = cands[i]
        while placed < count and all(f.passes(offer, state) for f in dynamic):
            state.place(offer)
            counts[i] = counts.get(i, 0) + 1
            placed += 1
        if placed >= count:
            break
    return counts


def _rooms_under(scorer: Scorer, extra: list[filtmod.Filter], rooms: list[float],
                 count: int, counts: dict[int, int]) -> list[float]:
    """Rooms when dynamic filters beyond capacity (a JSON query on free amounts, a plugin)
    apply: how many instances each offer takes before one of them fails.  Only computed
    for the offers the local search looks at."""
    out = [0.0] * len(rooms)  # offers the search does not look at take nothing more
    order = sorted(range(len(scorer.cands)), key=lambda j: (scorer.first[j], j))[:SEARCH_TARGETS]
    for i in set(order) | set(counts):
        o = scorer.cands[i]
        state = VirtualState(scorer.state.request)
        n = 0
        while n < min(rooms[i], count) and all(f.passes(o, state) for f in extra):
            state.place(o)
            n += 1
        out[i] = n
    return out


def _worth_searching(scorer: Scorer, pools: dict[str, Pool]) -> bool:
    """Greedy is already optimal when every cost grows with use (convex series) and no
    pool is shared unevenly (a polymatroid); only otherwise run the local search."""
    if not scorer.weighings:
        return False
    return _unevenly_coupled(scorer, pools) or not all(
        _nondecreasing(w) for w in scorer.weighings)


class _Search:
    """Move instances between offers while the total cost drops (bounded in time).

    Costs are separable per offer (each depends on its own count only), so a move's gain
    comes from the series of the offers it touches.  Two kinds of moves:

    * *shift*: n instances (1..8, half or all of them) from one used offer to another
      offer, the cheapest improving shift first;
    * *gather*: n instances into one offer, taken from wherever removing them saves the
      most, which escapes pack's local minima and frees a shared pool for an offer that
      uses less of it.
    """

    def __init__(self, scorer: Scorer, counts: dict[int, int], rooms: list[float],
                 pools: dict[str, Pool]) -> None:
        self.scorer = scorer
        self.cands = scorer.cands
        self.counts = dict(counts)
        self.rooms = rooms
        self.pools = pools
        self.prefix: dict[int, list[float]] = {}
        self.cons = [scorer.state.consumption(o) for o in self.cands]
        self.pool_used: dict[str, dict[str, float]] = {}
        for i, n in self.counts.items():
            self._use(i, n)
        count = sum(self.counts.values())
        self.targets = sorted(range(len(self.cands)),
                              key=lambda j: (scorer.first[j], j))[:SEARCH_TARGETS]
        self.max_move = count

    def total(self, i: int, n: int) -> float:
        sums = self.prefix.get(i)
        if sums is None:
            sums = self.prefix[i] = [0.0]
        while len(sums) <= n:
            sums.append(sums[-1] + self.scorer.cost(i, len(sums) - 1))
        return sums[n]

    def _use(self, i: int, n: int) -> None:
        p = self.cands[i].pool
        if p in self.pools:
            u = self.pool_used.setdefault(p, {})
            for d, v in self.cons[i].items():
                u[d] = u.get(d, 0.0) + n * v

    def pool_ok(self, moves: dict[int, int]) -> bool:
        """Would the pools hold after changing counts by ``moves`` (offer -> +/- n)?"""
        delta: dict[str, dict[str, float]] = {}
        for i, n in moves.items():
            p = self.cands[i].pool
            if p in self.pools:
                acc = delta.setdefault(p, {})
                for d, v in self.cons[i].items():
                    acc[d] = acc.get(d, 0.0) + n * v
        for p, acc in delta.items():
            used = self.pool_used.get(p, {})
            for d, change in acc.items():
                free = self.pools[p].free.get(d)
                if free is not None and change > 0 and used.get(d, 0.0) + change > free + 1e-9:
                    return False
        return True

    def apply(self, moves: dict[int, int]) -> None:
        for i, n in moves.items():
            self._use(i, n)
            new = self.counts.get(i, 0) + n
            if new:
                self.counts[i] = new
            else:
                self.counts.pop(i, None)

    def best_shift(self, deadline: float) -> tuple[float, dict[int, int]] | None:
        best = None
        targets = sorted(set(self.targets) | set(self.counts))
        for src in list(self.counts):
            if time.perf_counter() > deadline:
                break
            ns = self.counts[src]
            for n in sorted({*range(1, min(ns, MOVE_SIZES) + 1), ns // 2 or 1, ns}):
                loss = self.total(src, ns) - self.total(src, ns - n)
                for dst in targets:
                    if dst == src:
                        continue
                    nd = self.counts.get(dst, 0)
                    if nd + n > self.rooms[dst]:
                        continue
                    gain = loss - (self.total(dst, nd + n) - self.total(dst, nd))
                    if gain > 1e-9 and (best is None or gain > best[0]):
                        moves = {src: -n, dst: n}
                        if self.pool_ok(moves):
                            best = (gain, moves)
        return best

    def best_gather(self, deadline: float) -> tuple[float, dict[int, int]] | None:
        best = None
        for dst in sorted(set(self.targets) | set(self.counts)):
            if time.perf_counter() > deadline:
                break
            nd = self.counts.get(dst, 0)
            room = int(min(self.rooms[dst], nd + self.max_move)) - nd
            taken: dict[int, int] = {}
            saved = 0.0
            for n in range(1, room + 1):
                # take the instance whose removal saves the most, from any other offer
                pick, pick_save = None, None
                for src, ns in self.counts.items():
                    if src == dst:
                        continue
                    left = ns - taken.get(src, 0)
                    if left <= 0:
                        continue
                    save = self.total(src, left) - self.total(src, left - 1)
                    if pick_save is None or save > pick_save:
                        pick, pick_save = src, save
                if pick is None:
                    break
                taken[pick] = taken.get(pick, 0) + 1
                saved += pick_save
                gain = saved - (self.total(dst, nd + n) - self.total(dst, nd))
                if gain > 1e-9 and (best is None or gain > best[0]):
                    moves = {src: -k for src, k in taken.items()}
                    moves[dst] = n
                    if self.pool_ok(moves):
                        best = (gain, moves)
        return best

    def run(self) -> dict[int, int]:
        deadline = time.perf_counter() + LOCAL_SEARCH_SECONDS
        for _ in range(LOCAL_SEARCH_ROUNDS):
            if time.perf_counter() > deadline:
                break
            move = self.best_shift(deadline) or self.best_gather(deadline)
            if move is None:
                break
            self.apply(move[1])
        return self.counts


def _unevenly_coupled(scorer: Scorer, pools: dict[str, Pool]) -> bool:
    """Do offers that share a pool take different amounts from it?  (With equal amounts
    the constraints form a polymatroid and greedy stays optimal for growing costs.)"""
    if not pools:
        return False
    seen: dict[str, dict[str, float]] = {}
    state = scorer.state
    for o in scorer.cands:
        if o.pool not in pools:
            continue
        cons = state.consumption(o)
        first = seen.setdefault(o.pool, cons)
        if first is not cons and first != cons:
            return True
    return False


def _nondecreasing(w: _Weighing) -> bool:
    """Does this weighing's cost grow (or stay) with the offer's fill level?"""
    if not w.weigher.dynamic:
        return True
    name = w.weigher.name
    grows = {"spread": True, "anti_affinity": True, "pack": False}.get(name)
    if grows is None:
        return False  # a plugin: assume nothing
    return grows == (w.coef >= 0)


def deplete(offers: list[Offer], pools: dict[str, Pool],
            plan: Plan) -> tuple[list[Offer], dict[str, Pool]]:
    """Offers and pools as they will be once ``plan``'s instances exist."""
    counts = plan.counts()
    if not counts:
        return offers, pools
    out = []
    new_pools = {k: replace(p, free=dict(p.free)) for k, p in pools.items()}
    for o in offers:
        n = counts.get(o.key)
        if not n:
            out.append(o)
            continue
        cons = o.consumption(plan.request)
        free = {d: (None if v is None else v - n * cons.get(d, 0.0))
                for d, v in o.free.items()}
        out.append(replace(o, free=free))
        if o.pool in new_pools:
            pf = new_pools[o.pool].free
            for d, v in cons.items():
                if pf.get(d) is not None:
                    pf[d] -= n * v
    return out, new_pools


def naive_place(engine: Engine, offers: Sequence[Offer], request: Request,
                pools: dict[str, Pool] | None = None, stop_after: int | None = None) -> Plan:
    """The seed's loop, as the reference: for each instance, filter all hosts, weigh all
    of them, sort them all, take the first.  Same filters, weighers, normalisation and
    tie-break as ``Engine.place`` (without its improvement step).  ``stop_after`` ends
    the loop early (the benchmark times a prefix of a long run)."""
    filters, scorer, expl, _rooms = engine.prepare(offers, request, pools)
    state = VirtualState(request, pools)
    scorer.state = state
    index = {id(o): i for i, o in enumerate(scorer.cands)}
    counts: dict[int, int] = {}
    choices: list[Choice] = []
    for n in range(request.count if stop_after is None else min(stop_after, request.count)):
        hosts = list(offers)
        for f in filters:
            hosts = f.filter_all(hosts, state)
        weighed = []
        for o in hosts:
            i = index[id(o)]
            placed = state.placed_on(o)
            cost = 0.0
            for w in scorer.weighings:
                v = w.weigher.weigh(o, placed, state)
                cost += w.coef * (v - w.lo)
            weighed.append((cost, i))
        weighed.sort()
        if not weighed:
            expl.placed = n
            raise PlacementError(f"cannot place {request.describe()}: {expl.text()}",
                                 request=request, explanation=expl)
        cost, i = weighed[0]
        state.place(scorer.cands[i])
        counts[i] = counts.get(i, 0) + 1
        choices.append(Choice(n, scorer.cands[i].key, cost))
    expl.placed = len(choices)
    return Plan(request=request, choices=choices, explanation=expl,
                offers={scorer.cands[i].key: scorer.cands[i] for i in counts})


__all__ = ["Engine", "PlacementError", "Scorer", "deplete", "naive_place"]
