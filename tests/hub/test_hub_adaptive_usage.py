"""Adaptive scaling and cost in the sidekick of a real JupyterHub.

* A sidekick that restarts resumes every recorded adaptive cluster at startup: after the
  restart, with no request made to it, a load of slow tasks grows a user's cluster to its
  maximum (the reaper daemon is off here, so only the sidekick can do it).
* Admins see every user's clusters, workers now, cost per hour and cost so far
  (``hub/usage``, and the admin page in Chromium, logged in through the hub); other
  users get 403.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from cloudtik_emulators.hub import service_pid, start_hub, wait_operation
from jupyter_cloudtik.clusters import adaptive
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.runtime import tls

pytestmark = pytest.mark.slow

PRICE = 0.5  # per core-hour, from the catalogue


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hubadapt")
    h = start_hub(base, sidekick_config="c.CloudTik.start_reaper = False\n")
    try:
        admin = h.browser("admin")
        r = admin.put(h.sidekick_api + "hub/catalog/provider/pool", json={
            "spec": {"type": "local", "price_per_core_hour": PRICE},
            "groups": ["physics", "chemistry"]})
        assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop()


def up(session, api, name, workers, **config):
    r = session.post(api + "clusters", json={"name": name, "provider": "pool",
                                             "workers": workers, "config": config})
    assert r.status_code == 202, r.text
    assert wait_operation(session, api, r.json()["operation"]["id"])["state"] == "succeeded"


def down(session, api, name):
    r = session.delete(api + f"clusters/{name}")
    if r.status_code == 202:
        wait_operation(session, api, r.json()["operation"]["id"])


def admin_page_usage(hub) -> dict[str, list[str]]:
    """The Usage table of the sidekick's admin page, as the admin sees it in Chromium."""
    from cloudtik_emulators.browser import chromium
    from cloudtik_emulators.hub import PASSWORD

    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{hub.url}hub/login?next=/services/cloudtik/admin", timeout=30_000)
        page.fill("input[name='username']", "admin")
        page.fill("input[name='password']", PASSWORD)
        page.click("input[type='submit'], button[type='submit']")
        page.wait_for_selector("#usage tbody tr", timeout=60_000)
        return {tr.get_attribute("data-user"): [td.inner_text() for td in
                                                tr.locator("td").all()]
                for tr in page.locator("#usage tbody tr").all()}


def test_admins_see_every_users_cost_others_get_403(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.session("admin")
    up(alice, api, "alice-cost", 1)
    up(bob, api, "bob-cost", 0)
    try:
        cfg = alice.get(api + "clusters/alice-cost").json()["config"]
        types = cfg["available_node_types"]
        # what the provider gives each node (a local node: its threads, at least one),
        # not what the config declares (the head declares CPU 0: it is no free node)
        head = max(float(types[cfg["head_node_type"]]["resources"]["CPU"]), 1.0)
        worker = max(float(next(t for n, t in types.items()
                                if n != cfg["head_node_type"])["resources"]["CPU"]), 1.0)
        time.sleep(2)  # some cost accrues
        r = admin.get(api + "hub/usage")
        assert r.status_code == 200, r.text
        users = {u["user"]: u for u in r.json()["users"]}
        a, b = users["alice"], users["bob"]
        assert (a["clusters"], a["workers"]) == (1, 1)
        assert (b["clusters"], b["workers"]) == (1, 0)
        assert a["cost_per_hour"] == pytest.approx((head + worker) * PRICE)
        assert b["cost_per_hour"] == pytest.approx(head * PRICE)
        assert 0 < a["cost_so_far"] < a["cost_per_hour"] * 0.1  # seconds, not hours
        assert {c["cluster"]: c["owner"] for c in r.json()["clusters"]} == {
            "alice-cost": "alice", "bob-cost": "bob"}
        # cost so far grows with time
        time.sleep(1.5)
        later = {u["user"]: u for u in admin.get(api + "hub/usage").json()["users"]}
        assert later["alice"]["cost_so_far"] > a["cost_so_far"]
        for user in (alice, bob):  # only admins may read it
            r = user.get(api + "hub/usage")
            assert r.status_code == 403 and "admin" in r.json()["message"], r.text
            assert "alice-cost" not in r.text and "bob-cost" not in r.text
        # the admin page shows the same table, in a browser logged in through the hub
        assert alice.get(hub.url + "services/cloudtik/admin").status_code == 403
        rows = admin_page_usage(hub)
        assert rows["alice"][:3] == ["alice", "1", "1"], rows
        assert rows["bob"][:3] == ["bob", "1", "0"], rows
        assert float(rows["alice"][3]) == pytest.approx((head + worker) * PRICE, abs=1e-3)
        assert float(rows["alice"][4]) > 0
    finally:
        down(alice, api, "alice-cost")
        down(bob, api, "bob-cost")


def test_a_restarted_sidekick_resumes_adaptive_with_no_request(hub):
    from distributed import Client

    api = hub.sidekick_api
    alice = hub.session("alice")
    up(alice, api, "alice-adapt", 1, max_workers=3)
    store = Store(hub.state_dir)
    try:
        r = alice.put(api + "clusters/alice-adapt/adapt",
                      json={"minimum": 1, "maximum": 3, "wait_count": 2})
        assert r.status_code == 200, r.text
        # as alice's kernel connects: the cluster's client certificate (a shared state
        # folder's local clusters speak TLS even on loopback, docs/security.md)
        connect = alice.get(api + "clusters/alice-adapt/connect").json()["connect_info"]
        address = connect["scheduler_address"]
        security = tls.security(connect["tls_credentials"])
        old = service_pid(hub.base)
        assert old and adaptive.lease_holder(store)["pid"] == old
        os.kill(old, signal.SIGTERM)  # an orderly stop: the hub starts the service again
        deadline = time.monotonic() + 90
        new = None
        while time.monotonic() < deadline:
            new = service_pid(hub.base)
            holder = adaptive.lease_holder(store)
            if new and new != old and holder and holder["pid"] == new:
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"sidekick not back with the lease: {new} "
                                 f"{adaptive.lease_holder(store)}\n{hub.log_tail()}")
        t0 = time.time()
        # no request to the new sidekick from here on: only the store is read
        with Client(address, timeout=30, security=security) as c:
            futures = c.map(lambda i: (time.sleep(1.5), i * i)[1], range(40), pure=False)
            deadline = time.monotonic() + 90
            seen = None
            while time.monotonic() < deadline:
                row = store.query_one("SELECT state, target_workers FROM clusters"
                                      " WHERE name = 'alice-adapt'")
                seen = (sum(json.loads(row["target_workers"]).values()), row["state"])
                if seen == (3, "running"):
                    break
                time.sleep(0.3)
            assert seen == (3, "running"), seen
            assert c.gather(futures) == [i * i for i in range(40)]
        ops = store.query("SELECT id FROM operations WHERE kind = 'cluster.scale'"
                          " AND target = 'cluster:alice-adapt' AND created_at >= ?", (t0,))
        assert ops
    finally:
        down(alice, api, "alice-adapt")
        store.close()
