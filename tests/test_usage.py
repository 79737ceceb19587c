"""Cost so far is the recorded price integrated over time (each price holds until the next
sample), over the cluster's current life only."""

from __future__ import annotations

import time

from jupyter_cloudtik.clusters import usage


def test_cost_so_far_integrates_the_recorded_prices(manager):
    import asyncio

    asyncio.run(manager.up(name="costs", workers=0))
    try:
        created = manager.get("costs").created_at
        usage._ensure(manager.store)
        with manager.store.transaction() as conn:
            conn.execute("DELETE FROM cluster_usage")
            for at, workers, price in (
                (created - 100, 9, 99.0),  # an earlier life: ignored
                (created + 1, 1, 2.0),
                (created + 1801, 3, 6.0),
            ):
                conn.execute(
                    "INSERT INTO cluster_usage (cluster, at, workers, cost_per_hour,"
                    " currency) VALUES (?, ?, ?, ?, 'EUR')",
                    ("costs", at, workers, price),
                )
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


def test_old_table_gains_the_load_columns(manager):
    """A state folder from before CPU/memory were recorded keeps its rows."""
    with manager.store.transaction() as conn:
        conn.execute("DROP TABLE IF EXISTS cluster_usage")
        conn.execute(
            "CREATE TABLE cluster_usage (cluster TEXT NOT NULL, at REAL NOT NULL,"
            " workers INTEGER NOT NULL, cost_per_hour REAL, currency TEXT)"
        )
        conn.execute("INSERT INTO cluster_usage VALUES ('old', 1.0, 2, NULL, '')")
    usage._ensure(manager.store)
    row = manager.store.query_one("SELECT * FROM cluster_usage WHERE cluster = 'old'")
    assert row["workers"] == 2 and row["cpu"] is None and row["memory"] is None


def test_workers_cpu_and_memory_from_the_real_scheduler(manager):
    """A running local cluster's Dask scheduler reports its workers' load: it is sampled
    with the size, every METRICS_PERIOD, and answered by ``usage``."""
    import asyncio

    from distributed import Client

    asyncio.run(manager.up(name="load", workers=1))
    try:
        _, info = manager.connect_info("load")
        with Client(info.scheduler_address, timeout=30) as client:
            client.submit(sum, range(10**6)).result()  # the worker has worked
            figures = usage.worker_load(manager, "load")
            deadline = time.monotonic() + 30
            while figures is None:  # the first heartbeat carries the metrics
                assert time.monotonic() < deadline
                time.sleep(0.5)
                figures = usage.worker_load(manager, "load")
        assert 0.0 <= figures["cpu"] <= 100.0, figures
        assert figures["memory"] > 10 * 2**20, figures  # a Python process holds > 10 MiB
        assert figures["memory_limit"] >= 0
        # the scheduler is asked with METRICS_TIMEOUT (3 s): on a loaded machine (the CI's
        # four workers on two cores) it once did not answer in time, which is a gap in
        # the chart (cpu None), asked again a METRICS_PERIOD later — as here, a few times
        start = time.time()
        for attempt in range(5):
            usage._asked.clear()
            # the first writes a row; a retry writes one only when it has a reading
            assert usage.sample(manager, now=start) == 1 or attempt > 0
            last = usage.usage(manager, "load", now=start + 1)["samples"][-1]
            if last["cpu"] is not None:
                break
            assert last["memory"] is None, last  # a gap is a gap, not half a reading
            start += usage.METRICS_PERIOD + 1
        assert last["cpu"] is not None and last["memory"] > 0, last
        # within METRICS_PERIOD nothing new; after it, a new load sample
        assert usage.sample(manager, now=start + 1) == 0
        assert usage.sample(manager, now=start + usage.METRICS_PERIOD + 1) == 1
    finally:
        asyncio.run(manager.down("load"))


def test_load_of_an_identity_without_metrics_is_none():
    assert usage.load_from_identity({"workers": {}}) is None
    assert usage.load_from_identity({"workers": {"a": {"nthreads": 2}}}) is None
    two = {
        "workers": {
            "a": {"nthreads": 2, "memory_limit": 100, "metrics": {"cpu": 150.0, "memory": 40}},
            "b": {"nthreads": 2, "memory_limit": 100, "metrics": {"cpu": 50.0, "memory": 10}},
        }
    }
    assert usage.load_from_identity(two) == {"cpu": 50.0, "memory": 50, "memory_limit": 200}


def test_load_of_an_answer_of_another_shape_is_none():
    """The head is the cluster owner's machine: whatever its scheduler's HTTP server
    answers, the sampler gets no figure (and goes on with the other clusters), never an
    exception."""
    bad = [
        [],  # not an object
        {"workers": ["a"]},
        {"workers": {"a": "x"}},
        {"workers": {"a": {"metrics": ["cpu", "memory"]}}},
        {"workers": {"a": {"metrics": {"cpu": {"x": 1}, "memory": 1}}}},
        {"workers": {"a": {"metrics": {"cpu": 1.0, "memory": "lots"}}}},
        {"workers": {"a": {"metrics": {"cpu": "nan", "memory": 1}}}},
        {"workers": {"a": {"metrics": {"cpu": 1.0, "memory": 1e400}}}},
    ]
    for answer in bad:
        assert usage.load_from_identity(answer) is None, answer
    # threads that sum to nothing: no division by zero (each worker has at least one)
    odd = {"workers": {"a": {"nthreads": -1, "metrics": {"cpu": 1.0, "memory": 1}},
                       "b": {"nthreads": 1, "metrics": {"cpu": 1.0, "memory": 1}}}}
    assert usage.load_from_identity(odd) == {"cpu": 1.0, "memory": 2, "memory_limit": 0}
