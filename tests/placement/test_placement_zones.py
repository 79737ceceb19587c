"""Zones over real HTTP: a parent, two children, a grandchild, each its own server process.

    P (parent, 2 x 0.30/h) ── a (offset 0.1, scale 0.5): 3 x 0.10/h, 2 x 0.15/h
                          └── b (offset 0.2, scale 1):   2 x 0.20/h
                                   └── b1 (offset 0.05): 4 x 0.05/h
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from cryptography.fernet import Fernet

from cloudtik_emulators.zones import SilentServer, start_zone
from jupyter_cloudtik.placement import Request

REQUEST = {"count": 9, "resources": {"CPU": 1}, "user": "ann", "cluster": "big",
           "weighers": {"cost": 1.0, "spread": 0.0, "pack": 0.0, "anti_affinity": 0.0,
                        "recent_failures": 0.0, "spot": 0.0}}
SECRETS = ["p-rack-1", "a-rack-01", "a-rack-02", "b-rack-01", "b1-secret-07"]


def offer(key: str, price: float, count: int) -> dict:
    return {"key": key, "provider": "static", "price_per_hour": price, "currency": "EUR",
            "size": {"CPU": 2}, "free": {"instances": count}, "total": {"instances": count}}


@pytest.fixture(scope="module")
def zones(tmp_path_factory):
    root = tmp_path_factory.mktemp("zones")
    started = []
    try:
        # long enough for a busy CI machine; the hung child costs it once, then backs off
        fast = {"zone_timeout": 5.0, "zone_retry": 30.0}
        b1 = start_zone(root, "b1", [offer("b1-secret-07", 0.05, 4)], "tok-b1")
        started.append(b1)
        b = start_zone(root, "b", [offer("b-rack-01", 0.20, 2)], "tok-b", fast)
        started.append(b)
        a = start_zone(root, "a", [offer("a-rack-01", 0.10, 3), offer("a-rack-02", 0.15, 2)],
                       "tok-a")
        started.append(a)
        p = start_zone(root, "p", [offer("p-rack-1", 0.30, 2)], "tok-p", fast)
        started.append(p)
        # the parent's admin adds its children with the CLI (tokens from the environment)
        for parent, child, extra in ((p, a, ["--offset", "0.1", "--scale", "0.5"]),
                                     (p, b, ["--offset", "0.2"]),
                                     (b, b1, ["--offset", "0.05"])):
            out = parent.cli("zone", "add", child.name, child.url, *extra,
                             "--token-env", "CHILD_TOKEN", env={"CHILD_TOKEN": child.token})
            assert out.returncode == 0, out.stderr
            assert child.token not in out.stdout
        for z in started:  # first requests load code: keep that out of the timings
            assert z.call("POST", "/cloudtik/api/zones/select",
                          {"request": {"count": 1}, "path": ["warm-up"]})[0] == 200
        yield {z.name: z for z in started}
    finally:
        for z in started:
            z.stop()


def test_select_and_boot_round_trip(zones):
    p, a, b, b1 = zones["p"], zones["a"], zones["b"], zones["b1"]
    status, sel = p.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST})
    assert status == 200, sel
    assert sel["skipped"] == []
    got = [(round(o["weight"], 6), o["price_per_hour"], o["count"]) for o in sel["options"]]
    # own option first (0), then a's cheaper offer (0.1 + 0.5 x 0), b (0.2 + 0),
    # b1 through b (0.2 + 1 x (0.05 + 0)), a's dearer offer (0.1 + 0.5 x 1)
    assert got == [(0.0, 0.30, 2), (0.1, 0.10, 3), (0.2, 0.20, 2), (0.25, 0.05, 4),
                   (0.6, 0.15, 2)]
    text = json.dumps(sel)
    assert not any(s in text for s in SECRETS), "a child's internals reached the caller"

    hints = [{"hint": o["hint"], "count": n} for o, n in zip(sel["options"], [2, 3, 2, 2],
                                                             strict=False)]
    status, boot = p.call("POST", "/cloudtik/api/zones/boot",
                          {"request": REQUEST, "hints": hints})
    assert status == 200, boot
    assert boot["instances"] == 9
    assert boot["price_per_hour"] == pytest.approx(2 * 0.30 + 3 * 0.10 + 2 * 0.20 + 2 * 0.05)
    assert not any(s in json.dumps(boot) for s in SECRETS)

    # the parent's record (its admin's view): its own claims, and one reservation id per
    # child it booted in
    out = p.cli("reservations", "show", boot["reservation_id"], "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert [c["offer"] for c in res["claims"]] == ["p-rack-1", "p-rack-1"]
    text = p.cli("reservations", "show", boot["reservation_id"]).stdout
    assert "estimated 1.400 EUR per hour" in text and "zone b: 4 instance(s)" in text
    # over HTTP, a reservation made by boot shows counts and prices only
    status, public = p.call("GET", f"/cloudtik/api/reservations/{boot['reservation_id']}")
    assert status == 200 and public["instances"] == 9 and "offer" not in public["claims"][0]
    remote = {r["zone"]: r for r in res["remote"]}
    assert {z: r["count"] for z, r in remote.items()} == {"a": 3, "b": 4}

    # each child placed exactly where its hint said; b forwarded to b1
    status, ra = a.call("GET", f"/cloudtik/api/reservations/{remote['a']['remote_id']}")
    assert status == 200 and ra["instances"] == 3
    assert "offer" not in ra["claims"][0]  # the parent's view of a child: counts and prices
    status, rb = b.call("GET", f"/cloudtik/api/reservations/{remote['b']['remote_id']}")
    assert rb["instances"] == 4 and len(rb["claims"]) == 2 and rb["remote"][0]["count"] == 2
    b1_db = b"".join(f.read_bytes() for f in b1.state_dir.glob("state.db*"))
    assert b"b1-secret-07" in b1_db  # (so the check on the parent below can fail)
    out = b1.cli("reservations", "list", "--json")
    assert out.returncode == 0, out.stderr
    [b1_res] = json.loads(out.stdout)
    assert [c["offer"] for c in b1_res["claims"]] == ["b1-secret-07"] * 2
    assert all(c["state"] == "claimed" for c in b1_res["claims"])

    # nothing of the children's layout is stored at the parent
    parent_db = b"".join(f.read_bytes() for f in p.state_dir.glob("state.db*"))
    for s in ("a-rack-01", "a-rack-02", "b-rack-01", "b1-secret-07"):
        assert s.encode() not in parent_db

    # claims hold: b1 has 2 of its 4 left, so a new select offers 2 there
    _, sel2 = b1.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST})
    assert [o["count"] for o in sel2["options"]] == [2]

    # the same hints cannot be used twice
    status, again = p.call("POST", "/cloudtik/api/zones/boot",
                           {"request": REQUEST, "hints": hints})
    assert status == 400 and again["reason"] == "hint_refused"
    assert "already used" in again["message"]

    # release at the parent gives everything back down the tree
    status, rel = p.call("POST", "/cloudtik/api/zones/release",
                         {"reservation_id": boot["reservation_id"]})
    assert status == 200 and rel["state"] == "released"
    _, ra = a.call("GET", f"/cloudtik/api/reservations/{remote['a']['remote_id']}")
    assert ra["state"] == "released" and ra["instances"] == 0
    out = b1.cli("reservations", "show", b1_res["id"])
    assert f"reservation {b1_res['id']} (released)" in out.stdout


def _a_hint(zone, request=None):
    status, sel = zone.call("POST", "/cloudtik/api/zones/select",
                            {"request": request or {"count": 1, "resources": {"CPU": 1}}})
    assert status == 200, sel
    return sel["options"][0]["hint"]


def test_tampered_foreign_expired_and_mismatched_hints_are_refused(zones):
    a, b = zones["a"], zones["b"]
    req = {"count": 1, "resources": {"CPU": 1}}

    def boot(zone, hint, request=req):
        return zone.call("POST", "/cloudtik/api/zones/boot",
                         {"request": request, "hints": [{"hint": hint, "count": 1}]})

    hint = _a_hint(a)
    mid = len(hint) // 2
    tampered = hint[:mid] + ("A" if hint[mid] != "A" else "B") + hint[mid + 1:]
    status, err = boot(a, tampered)
    assert status == 400 and err["reason"] == "hint_refused"
    assert "not sealed by this zone, or altered" in err["message"]

    status, err = boot(b, _a_hint(a))  # a's hint sent to b
    assert status == 400 and "not sealed by this zone" in err["message"]

    # a hint sealed with a's own key, an hour ago
    key = (a.state_dir / "zone.key").read_bytes().splitlines()[0]
    payload = json.dumps({"v": 1, "zone": "a", "offer": "a-rack-01", "count": 1,
                          "req": "x", "id": "old"}).encode()
    old = Fernet(key).encrypt_at_time(payload, int(time.time()) - 3600).decode()
    status, err = boot(a, old)
    assert status == 400 and "expired" in err["message"]

    # a genuine fresh hint, but for a request with other resources
    status, err = boot(a, _a_hint(a), {"count": 1, "resources": {"CPU": 2}})
    assert status == 400 and "different request" in err["message"]

    # a's key sealing a hint that names another zone (two zones sharing a key)
    forged = Fernet(key).encrypt(json.dumps({"v": 1, "zone": "b", "offer": "x", "count": 1,
                                             "req": "x", "id": "f"}).encode()).decode()
    status, err = boot(a, forged)
    assert status == 400 and "issued for zone 'b'" in err["message"]

    # nothing was claimed by any refused boot
    out = a.cli("reservations", "list", "--json")
    assert all(r["instances"] == 0 for r in json.loads(out.stdout))


def test_api_needs_the_token(zones):
    a = zones["a"]
    status, err = a.call("POST", "/cloudtik/api/zones/select",
                         {"request": {"count": 1}}, token="")
    assert status == 401 and err["reason"] == "unauthorized"
    status, _ = a.call("POST", "/cloudtik/api/zones/select", {"request": {"count": 1}},
                       token="tok-b")
    assert status == 401
    status, err = a.call("POST", "/cloudtik/api/zones/select", {"request": {"count": 0}})
    assert status == 400 and err["field"] == "count"
    status, err = a.call("POST", "/cloudtik/api/zones/select",
                         {"request": {"count": 1}, "path": ["p", "a"]})
    assert status == 409 and "zone loop" in err["message"]


def test_dead_and_hung_children_are_skipped_without_hanging(zones, tmp_path):
    p, b = zones["p"], zones["b"]
    c = start_zone(tmp_path, "c", [offer("c-rack", 0.01, 5)], "tok-c")
    hung = SilentServer()  # accepts connections, never answers
    try:
        assert p.cli("zone", "add", "c", c.url, "--token-env", "T",
                     env={"T": "tok-c"}).returncode == 0
        # a grandchild that hangs: b gives it less time than p gives b (the budget), so
        # b skips it and still answers p in time
        assert b.cli("zone", "add", "hung", hung.url).returncode == 0
        req = {"request": {**REQUEST, "count": 1}}
        status, sel = p.call("POST", "/cloudtik/api/zones/select", req)
        assert status == 200 and sel["skipped"] == [], sel["skipped"]
        prices = {o["price_per_hour"] for o in sel["options"]}
        assert {0.01, 0.20, 0.05} <= prices  # c, b and b1 (through b) all answered
        out = b.cli("zone", "list")
        assert next(x for x in out.stdout.splitlines()
                    if x.startswith("hung ")).split()[1] == "unhealthy"

        c.stop(9)  # a child dies
        t0 = time.monotonic()
        status, sel = p.call("POST", "/cloudtik/api/zones/select", req)
        took = time.monotonic() - t0
        assert status == 200
        assert [s["zone"] for s in sel["skipped"]] == ["c"]
        assert "skipped for 30s" in sel["skipped"][0]["reason"]
        # a refused connection is skipped at once: well under the 5 s zone_timeout that a
        # hanging child would cost (the margin is for a loaded CI machine)
        assert took < 5.0, f"select waited {took:.1f}s for a dead child"
        assert 0.01 not in {o["price_per_hour"] for o in sel["options"]}
        assert 0.20 in {o["price_per_hour"] for o in sel["options"]}

        status, sel = p.call("POST", "/cloudtik/api/zones/select", req)
        assert "next try in" in sel["skipped"][0]["reason"]  # backing off: not even asked
        out = p.cli("zone", "list")
        line = next(x for x in out.stdout.splitlines() if x.startswith("c "))
        assert "unhealthy" in line and "retry in" in line
    finally:
        hung.close()
        c.stop()
        p.cli("zone", "remove", "c")
        b.cli("zone", "remove", "hung")


def test_zone_cli(zones, tmp_path):
    p = zones["p"]
    token_file = tmp_path / "t"
    token_file.write_text("s3cret-token\n")
    out = p.cli("zone", "add", "x", "http://127.0.0.1:9/", "--token-file", str(token_file))
    assert out.returncode == 0, out.stderr
    out = p.cli("zone", "list", "--json")
    data = json.loads(out.stdout)
    assert data["zone"] == "p"
    assert {z["name"]: z["has_token"] for z in data["children"]}["x"] is True
    assert "s3cret" not in out.stdout
    db = b"".join(f.read_bytes() for f in p.state_dir.glob("state.db*"))
    assert b"s3cret-token" not in db  # the token is stored encrypted
    out = p.cli("zone", "add", "x", "http://127.0.0.1:9/")
    assert out.returncode == 2 and "exists" in out.stderr
    out = p.cli("zone", "add", "y", "ftp://nope")
    assert out.returncode == 2 and "url:" in out.stderr
    out = p.cli("zone", "remove", "x")
    assert out.returncode == 0
    out = p.cli("zone", "remove", "x")
    assert out.returncode == 2 and "no child zone named 'x'" in out.stderr


def test_key_rotation_keeps_old_hints_until_retired(zones):
    a = zones["a"]
    req = {"count": 1, "resources": {"CPU": 1}}
    digest = Request.from_dict(req).digest()

    def sealed_with(key: bytes) -> str:
        payload = {"v": 1, "zone": "a", "offer": "a-rack-02", "count": 1, "req": digest,
                   "id": uuid.uuid4().hex}
        return Fernet(key).encrypt(json.dumps(payload).encode()).decode()

    def boot(hint):
        return a.call("POST", "/cloudtik/api/zones/boot",
                      {"request": req, "hints": [{"hint": hint, "count": 1}]})

    old_key = (a.state_dir / "zone.key").read_bytes().splitlines()[0]
    out = a.cli("zone", "rotate-key")
    assert out.returncode == 0, out.stderr
    keys = (a.state_dir / "zone.key").read_bytes().splitlines()
    assert len(keys) == 2 and keys[1] == old_key
    assert boot(sealed_with(old_key))[0] == 200  # sealed before the rotation: still opens
    assert boot(_a_hint(a, req))[0] == 200  # new hints use the new key
    out = a.cli("zone", "retire-keys")
    assert out.returncode == 0
    status, err = boot(sealed_with(old_key))
    assert status == 400 and "not sealed by this zone" in err["message"]
    assert (a.state_dir / "zone.key").read_bytes().splitlines() == [keys[0]]


def test_backoff_doubles_and_recovery_is_gradual(store):
    from jupyter_cloudtik.placement.settings import Placement
    from jupyter_cloudtik.placement.zones import ZoneRegistry

    reg = ZoneRegistry(store, Placement(zone_retry=30.0))
    reg.add("flaky", "http://127.0.0.1:9/")
    assert [reg.mark_failed("flaky", "refused") for _ in range(6)] == [
        30.0, 60.0, 120.0, 240.0, 480.0, 600.0]
    z = reg.get("flaky")
    assert z.state == "unhealthy" and z.failures == 6 and z.last_error == "refused"
    reg.mark_ok("flaky")  # answering again, but it keeps a penalty for a while
    z = reg.get("flaky")
    assert z.state == "healthy" and z.failures == 5 and z.retry_at is None
