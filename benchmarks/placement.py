"""Placement speed: 1,000 instances over 10,000 offers, 5 filters, 3 weighers.

Ours (``Engine.place``: filter and weigh once, then a heap with lazy re-checks) against the
seed's naive loop in the same run (``naive_place``: per instance, filter all hosts, weigh
all of them, sort them all, take the first).  Both must choose the same offers; the script
checks that and prints both times and the speed-up.

    .venv/bin/python benchmarks/placement.py [--offers 10000] [--instances 1000]
        [--baseline-instances N]   # time the baseline on the first N instances only and
                                   # scale up (it is linear in instances); default: all
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jupyter_cloudtik.placement import Engine, Offer, Pool, Request, naive_place
from jupyter_cloudtik.placement.settings import Placement

GIB = 2**30
FILTERS = ["availability_zone", "max_price", "json", "resources", "quota"]
WEIGHERS = {"cost": 1.0, "spread": 1.0, "anti_affinity": 0.5,
            "pack": 0.0, "spot": 0.0, "recent_failures": 0.0}


def make_offers(n: int, seed: int = 42) -> tuple[list[Offer], dict[str, Pool]]:
    rng = random.Random(seed)
    zones = [f"az-{i}" for i in range(20)]
    pools = {f"project-{p}": Pool(f"project-{p}", free={"CPU": 20_000.0, "instances": 5_000.0})
             for p in range(4)}
    offers = []
    for i in range(n):
        cpu = rng.choice([8, 16, 32, 64])
        mem = cpu * rng.choice([2, 4, 8]) * GIB
        used = rng.random()
        offers.append(Offer(
            key=f"host-{i:05d}", provider=f"p{i % 4}", region=f"r{i % 5}",
            availability_zone=rng.choice(zones),
            arch="aarch64" if rng.random() < 0.2 else "x86_64",
            spot=rng.random() < 0.3,
            price_per_hour=round(rng.uniform(0.05, 3.0), 3),
            total={"CPU": float(cpu), "memory": float(mem)},
            free={"CPU": float(int(cpu * (1 - used))), "memory": float(int(mem * (1 - used)))},
            pool=f"project-{i % 4}",
            capabilities={"arch": "aarch64" if rng.random() < 0.2 else "x86_64"},
            instances=[{"owner": "alice", "cluster": "x"}] if rng.random() < 0.1 else [],
        ))
    return offers, pools


def make_request(instances: int) -> Request:
    return Request(
        count=instances, resources={"CPU": 2, "memory": 4 * GIB}, node_type="worker",
        user="alice", cluster="bench", filters=FILTERS, weighers=WEIGHERS,
        availability_zones=[f"az-{i}" for i in range(15)], max_price=2.5,
        query=["and", [">=", "$free_ram_mb", 4096], ["=", "$capabilities.arch", "x86_64"]],
    )


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--offers", type=int, default=10_000)
    ap.add_argument("--instances", type=int, default=1_000)
    ap.add_argument("--baseline-instances", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5, help="runs of ours (median)")
    args = ap.parse_args()

    offers, pools = make_offers(args.offers)
    engine = Engine(Placement())
    request = make_request(args.instances)

    ours_s, plan = timed(lambda: engine.place(offers, request, pools), args.repeat)

    n_base = args.baseline_instances or args.instances
    base_s, base_plan = timed(
        lambda: naive_place(engine, offers, request, pools, stop_after=n_base), 1)
    scaled = base_s * args.instances / n_base

    same = [c.offer for c in plan.choices[:n_base]] == [c.offer for c in base_plan.choices]
    if n_base == args.instances:
        same = same and abs(plan.total_cost - base_plan.total_cost) < 1e-6
    print(f"placement: {args.instances} instances over {args.offers} offers, "
          f"{len(FILTERS)} filters, 3 weighers")
    print(f"  {plan.explanation.text()}")
    print(f"  ours (heap, filter/weigh once)        {ours_s * 1000:9.1f} ms  "
          f"(median of {args.repeat})")
    label = "naive (per instance: filter, weigh, sort)"
    if n_base != args.instances:
        print(f"  {label} {base_s * 1000:9.1f} ms for {n_base} instances -> "
              f"{scaled * 1000:.1f} ms for {args.instances} (linear)")
    else:
        print(f"  {label} {base_s * 1000:9.1f} ms")
    print(f"  speed-up {scaled / ours_s:.1f}x; same choices: {'yes' if same else 'NO'}; "
          f"targets: >= 20x and < 100 ms")
    ok = same and scaled / ours_s >= 20 and ours_s < 0.1
    print("  result: " + ("meets the targets" if ok else "MISSES a target"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
