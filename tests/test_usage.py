"""Cost so far is the recorded price integrated over time (each price holds until the next
sample), over the cluster's current life only."""

from __future__ import annotations

import time

from jupyter_cloudtik.core import usage


def test_cost_so_far_integrates_the_recorded_prices(manager):
    import asyncio

    asyncio.run(manager.up(name="costs", workers=0))
    try:
        created = manager.get("costs").created_at
        usage._ensure(manager.store)
        with manager.store.transaction() as conn:
            conn.execute("DELETE FROM cluster_usage")
            for at, workers, price in ((created - 100, 9, 99.0),  # an earlier life: ignored
                                       (created + 1, 1, 2.0),
                                       (created + 1801, 3, 6.0)):
                conn.execute("INSERT INTO cluster_usage VALUES (?, ?, ?, ?, 'EUR')",
                             ("costs", at, workers, price))
        u = usage.usage(manager, "costs", now=created + 3601)
        # 2.0/h for half an hour + 6.0/h for half an hour
        assert abs(u["cost_so_far"] - 4.0) < 1e-6, u
        assert [s["workers"] for s in u["samples"]] == [1, 3] and u["currency"] == "EUR"
        # a sample is written when the size changes, not on every look
        with manager.store.transaction() as conn:
            conn.execute("DELETE FROM cluster_usage")
        n = usage.sample(manager, now=time.time())
        assert n == 1 and usage.sample(manager, now=time.time()) == 0
    finally:
        asyncio.run(manager.down("costs"))
