"""Issue 12, items 2 and 3, attacked through a real hub: rules of one user never act on
another's traffic without consent, and names and ids belong to their owner.

One real JupyterHub per module (``cloudtik_emulators.hub``: configurable-http-proxy,
the sidekick as a managed service, its egress proxy process), real loopback upstreams that
echo what they received (``cloudtik_emulators.upstreams``), real local clusters and HPC jobs.
Users: alice (group physics), bob (group chemistry), admin.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from cloudtik_emulators.hub import TESTER_TOKEN as TESTER_TOKEN_
from cloudtik_emulators.hub import start_hub, wait_operation
from cloudtik_emulators.upstreams import make_test_ca, received, serve

pytestmark = pytest.mark.slow

ALICE_KEY = f"Bearer alice-{uuid.uuid4().hex}"
ADMIN_KEY = f"org-{uuid.uuid4().hex}"
BOB_OWN = f"Bearer bob-own-{uuid.uuid4().hex}"
SECRETS = (ALICE_KEY, ADMIN_KEY)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    base = tmp_path_factory.mktemp("upstreams")
    ca_path, ctx = make_test_ca(base)
    http_srv, _ = serve(None)
    https_srv, _ = serve(ctx)
    yield {"ca": ca_path, "http": http_srv.server_address[1],
           "https": https_srv.server_address[1]}
    for srv in (http_srv, https_srv):
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, upstreams):
    base = tmp_path_factory.mktemp("hub")
    h = start_hub(base, sidekick_config=(
        f"c.CloudTikHub.egress_upstream_ca_bundle = {str(upstreams['ca'])!r}\n"))
    try:
        admin = h.browser("admin")
        api = h.sidekick_api
        for path, body in (("provider/pool", {"spec": {"type": "local"}}),
                           ("hpc/local", {"spec": {}})):
            r = admin.put(api + f"hub/catalog/{path}",
                          json={**body, "groups": ["physics", "chemistry"]})
            assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop()
    log = (base / "hub.log").read_text(errors="replace")
    egress_log = (h.state_dir / "hub" / "egress" / "egress.log")
    if egress_log.exists():
        log += egress_log.read_text(errors="replace")
    assert not [s for s in SECRETS if s in log], "a rule's value reached a log"


def _proxied(hub, upstreams, user: str, tmp: Path) -> requests.Session:
    """A session of ``user`` the way a kernel of theirs is set up: the egress proxy with
    their own proxy credential, trusting the deployment CA (for intercepted hosts) and
    the upstreams' own CA (standing for the system CAs, for tunnelled ones)."""
    data = hub.session(user).get(hub.sidekick_api + "hub/egress/session").json()
    tmp.mkdir(parents=True, exist_ok=True)
    bundle = tmp / "bundle.pem"
    bundle.write_text(data["ca_pem"] + Path(upstreams["ca"]).read_text())
    s = requests.Session()
    s.trust_env = False
    s.proxies = {"http": data["env"]["HTTP_PROXY"], "https": data["env"]["HTTPS_PROXY"]}
    s.verify = str(bundle)
    return s


def _seen(s: requests.Session, url: str, **kw) -> tuple[list[str], requests.Response]:
    """The Authorization values the upstream received."""
    r = s.get(url, timeout=15, **kw)
    assert r.status_code == 200, r.text
    return [v for k, v in received(r)["headers"] if k.lower() == "authorization"], r


def test_a_users_rule_reaches_another_user_only_with_consent(hub, upstreams, tmp_path):
    api = hub.sidekick_api
    # rules and consent: each person's own browser session (tokens: test_held_actions...)
    alice, bob, admin = hub.browser("alice"), hub.browser("bob"), hub.browser("admin")
    urls = [f"http://127.0.0.1:{upstreams['http']}/bank",
            f"https://127.0.0.1:{upstreams['https']}/bank"]
    # the attack: alice names bob on hosts he uses
    for rid, port in (("steal", upstreams["http"]), ("steal-tls", upstreams["https"])):
        r = alice.put(api + f"hub/egress/rules/{rid}", json={
            "host": "127.0.0.1", "port": port, "header": "Authorization",
            "value": ALICE_KEY, "users": ["bob"]})
        assert r.status_code == 200, r.text
        assert r.json()["shares"] == [{"user": "bob", "state": "offered"}]
        assert r.json()["authority"] == "user" and ALICE_KEY not in r.text
    # everyone and groups would be offers nobody asked for: refused, naming the field
    for extra, field in (({"users": ["*"]}, "users"), ({"groups": ["chemistry"]}, "groups")):
        r = alice.put(api + "hub/egress/rules/broad", json={
            "host": "127.0.0.1", "header": "X-A", "value": ALICE_KEY, **extra})
        assert r.status_code == 400 and r.json()["field"] == field, r.text
    assert alice.get(api + "hub/egress/rules/broad").status_code == 404

    sb = _proxied(hub, upstreams, "bob", tmp_path / "bob")
    sa = _proxied(hub, upstreams, "alice", tmp_path / "alice")
    for url in urls:
        seen, r = _seen(sb, url, headers={"Authorization": BOB_OWN})
        assert seen == [BOB_OWN]                      # bob's own header, unchanged
        assert ALICE_KEY not in r.text
        seen, _ = _seen(sb, url)
        assert seen == []                             # an offer is not consent
        seen, _ = _seen(sa, url)
        assert seen == [ALICE_KEY]                    # the owner's own sessions: applied

    # bob sees what is offered to him, never the value
    applies = bob.get(api + "hub/egress/applies")
    assert applies.status_code == 200 and ALICE_KEY not in applies.text
    body = applies.json()
    assert sorted((x["id"], x["share"], x["owner"], x["host"], x["header"])
                  for x in body["shared"]) == [
        ("steal", "offered", "alice", "127.0.0.1", "Authorization"),
        ("steal-tls", "offered", "alice", "127.0.0.1", "Authorization")]
    assert body["applied"] == [] and body["own"] == [] and body["admin"] == []
    assert [x["id"] for x in bob.get(api + "hub/egress/shares").json()["shares"]] == [
        "steal", "steal-tls"]
    # the same from a terminal of bob's session (the server's hub token)
    env = {**os.environ, "CLOUDTIK_HUB_SERVICE_URL": hub.service_url,
           "JUPYTERHUB_API_TOKEN": hub.token("bob")}
    env.pop("CLOUDTIK_API_URL", None)
    cli = [sys.executable, "-m", "jupyter_cloudtik", "sidekick", "egress"]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["RULE", "FROM", "STATE", "HEADER", "ON"]
    assert f"steal-tls alice offered Authorization on 127.0.0.1:{upstreams['https']}/" in [
        " ".join(line.split()) for line in lines]
    assert ALICE_KEY not in out.stdout + out.stderr
    out = subprocess.run([*cli, "accept"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "say which rule" in out.stderr, out
    # consent is bob's own: the terminal's token (his server's, which his kernels can
    # read) may not give it; the answer says where he can
    out = subprocess.run([*cli, "accept", "steal-tls"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "browser session" in out.stderr, out
    assert "/services/cloudtik/egress" in out.stderr
    # nobody else can accept for bob, nor bob for a rule not offered to him
    assert alice.post(api + "hub/egress/shares/steal/accept").status_code == 404
    assert bob.post(api + "hub/egress/shares/nope/accept").status_code == 404
    assert bob.delete(api + "hub/egress/rules/steal").status_code == 404
    # bob's "steal" is a rule of his own: alice's is untouched by it
    r = bob.put(api + "hub/egress/rules/steal", json={
        "host": "127.0.0.1", "header": "Authorization", "value": "x" * 10})
    assert r.status_code == 200 and r.json()["ref"] == "user/bob/steal", r.text
    assert bob.delete(api + "hub/egress/rules/steal").status_code == 204
    assert alice.get(api + "hub/egress/rules/steal").json()["ref"] == "user/alice/steal"

    # bob accepts: alice's key now goes out with his requests, but never replaces his own
    r = bob.post(api + "hub/egress/shares/steal/accept")
    assert r.status_code == 200 and r.json()["share"] == "accepted", r.text
    r = bob.post(api + "hub/egress/shares/steal-tls/accept", params={"owner": "alice"})
    assert r.status_code == 200 and r.json()["share"] == "accepted", r.text
    assert bob.get(api + "hub/egress/applies").json()["applied"] == [
        "user/alice/steal", "user/alice/steal-tls"]
    # (a blind tunnel bob opened before stays blind: new connections see the new rules)
    sb.close()
    sb = _proxied(hub, upstreams, "bob", tmp_path / "bob")
    for url in urls:
        seen, r = _seen(sb, url)
        assert seen == [ALICE_KEY]
        assert r.headers["X-CloudTik-Egress"].startswith("applied rule=user/alice/steal")
        seen, r = _seen(sb, url, headers={"Authorization": BOB_OWN})
        assert seen == [BOB_OWN]
        assert "not-applied rule=user/alice/steal" in r.headers["X-CloudTik-Egress"]
        assert r.headers["X-CloudTik-Egress"].endswith("reason=client-sent-header")

    # the rule moves (another path): only with its value again, and consent was for the
    # rule as it was
    moved = {"host": "127.0.0.1", "port": upstreams["http"], "path_prefix": "/bank",
             "header": "Authorization", "users": ["bob"]}
    r = alice.put(api + "hub/egress/rules/steal", json=moved)
    assert r.status_code == 400 and r.json()["field"] == "value", r.text
    r = alice.put(api + "hub/egress/rules/steal", json={**moved, "value": ALICE_KEY})
    assert r.status_code == 200 and r.json()["shares"] == [
        {"user": "bob", "state": "offered"}], r.text
    assert _seen(sb, urls[0])[0] == []
    assert bob.post(api + "hub/egress/shares/steal/accept").status_code == 200
    assert _seen(sb, urls[0])[0] == [ALICE_KEY]
    # the owner revokes: it stops at once
    r = alice.delete(api + "hub/egress/rules/steal/shares/bob")
    assert r.status_code == 200 and r.json()["users"] == [] and r.json()["shares"] == []
    assert _seen(sb, urls[0])[0] == []
    assert alice.delete(api + "hub/egress/rules/steal/shares/bob").status_code == 404
    assert "steal" not in {x["id"] for x in bob.get(api + "hub/egress/applies").json()[
        "shared"]}
    # bob withdraws his acceptance of the other one: it stops too
    r = bob.post(api + "hub/egress/shares/steal-tls/decline")
    assert r.status_code == 200 and r.json()["share"] == "declined"
    assert _seen(sb, urls[1])[0] == []
    assert _seen(sa, urls[1])[0] == [ALICE_KEY]      # still alice's own

    # an admin's rule carries the hub's authority: it applies as configured, and bob
    # sees it among the rules that act on his sessions
    r = admin.put(api + "hub/egress/rules/org-key", json={
        "host": "127.0.0.1", "port": upstreams["http"], "path_prefix": "/org",
        "header": "X-Org-Key", "value": ADMIN_KEY, "groups": ["chemistry"]})
    assert r.status_code == 200 and r.json()["authority"] == "admin", r.text
    got = received(sb.get(f"http://127.0.0.1:{upstreams['http']}/org/x", timeout=15))
    assert ["X-Org-Key", ADMIN_KEY] in got["headers"]
    got = received(sa.get(f"http://127.0.0.1:{upstreams['http']}/org/x", timeout=15))
    assert all(k.lower() != "x-org-key" for k, _ in got["headers"])  # not in chemistry
    body = bob.get(api + "hub/egress/applies").json()
    assert [(x["id"], x["authority"]) for x in body["admin"]] == [("org-key", "admin")]
    assert "admin/org-key" in body["applied"]
    assert "groups" not in body["admin"][0] and ADMIN_KEY not in str(body)
    assert alice.get(api + "hub/egress/applies").json()["admin"] == []
    # the audit log has the consent trail, without values
    audit = admin.get(api + "hub/audit").json()["entries"]
    trail = [(e["actor"], e["action"]) for e in audit if e["target"].startswith("egress:")]
    for step in (("alice", "egress.put"), ("bob", "egress.accept"),
                 ("alice", "egress.revoke"), ("bob", "egress.decline")):
        assert step in trail
    assert not any(s in str(audit) for s in SECRETS)
    for rid in ("steal", "steal-tls"):
        assert alice.delete(api + f"hub/egress/rules/{rid}").status_code == 204
    assert admin.delete(api + "hub/egress/rules/org-key").status_code == 204


def test_an_admins_rule_is_never_a_users_to_redirect(hub, upstreams, tmp_path):
    """Issue 26: bob made ``org-token`` first; the admin's later PUT of ``org-token``
    answered 200 and kept bob as its owner; bob then pointed it at his own server without
    resending the value and received the admin's secret.  And a user's PUT answered 404
    for someone else's id and 200 for a free one."""
    api = hub.sidekick_api
    admin, bob, alice = hub.browser("admin"), hub.browser("bob"), hub.browser("alice")
    http = upstreams["http"]
    r = bob.put(api + "hub/egress/rules/org-token", json={
        "host": "127.0.0.1", "port": http, "path_prefix": "/bob", "header": "X-Org",
        "value": BOB_OWN})
    assert r.status_code == 200 and r.json()["ref"] == "user/bob/org-token", r.text
    r = admin.put(api + "hub/egress/rules/org-token", json={
        "host": "127.0.0.1", "port": http, "path_prefix": "/org", "header": "X-Org",
        "value": ADMIN_KEY, "groups": ["chemistry"]})
    assert r.status_code == 200, r.text
    assert (r.json()["ref"], r.json()["owner"], r.json()["authority"]) == (
        "admin/org-token", "admin", "admin")
    try:
        # bob re-points *his* rule at "his server" without its value: refused; with his
        # own value it is his rule, which never held the admin's
        moved = {"host": "127.0.0.1", "port": http, "path_prefix": "/mine",
                 "header": "X-Org"}
        r = bob.put(api + "hub/egress/rules/org-token", json=moved)
        assert r.status_code == 400 and r.json()["field"] == "value", r.text
        r = bob.put(api + "hub/egress/rules/org-token", json={**moved, "value": BOB_OWN})
        assert r.status_code == 200 and r.json()["ref"] == "user/bob/org-token"
        sb = _proxied(hub, upstreams, "bob", tmp_path / "bob")
        mine = received(sb.get(f"http://127.0.0.1:{http}/mine/x", timeout=15))["headers"]
        org = received(sb.get(f"http://127.0.0.1:{http}/org/x", timeout=15))["headers"]
        assert ["X-Org", BOB_OWN] in mine and ADMIN_KEY not in str(mine)
        assert ["X-Org", ADMIN_KEY] in org   # the admin's rule, for his group, untouched
        # ids cannot be probed: alice's answers for bob's and the admin's id are those of
        # an id nobody uses, and her PUT of it is a rule of her own
        for rid in ("org-token", f"never-{uuid.uuid4().hex[:6]}"):
            got = alice.get(api + f"hub/egress/rules/{rid}")
            assert got.status_code == 404 and _answer(got, rid) == (
                404, '{"message": "no egress rule \'<ID>\' of yours", "reason": '
                     '"not_found", "field": "id"}'), got.text
            assert alice.delete(api + f"hub/egress/rules/{rid}").status_code == 404
        r = alice.put(api + "hub/egress/rules/org-token", json={
            "host": "127.0.0.1", "header": "X-A", "value": "alice-own-value"})
        assert r.status_code == 200 and r.json()["ref"] == "user/alice/org-token"
        assert alice.delete(api + "hub/egress/rules/org-token").status_code == 204
        # the admin reaches bob's rule by naming him, and cannot give it the hub's authority
        r = admin.get(api + "hub/egress/rules/org-token", params={"owner": "bob"})
        assert r.status_code == 200 and r.json()["authority"] == "user"
        r = admin.put(api + "hub/egress/rules/org-token", params={"owner": "bob"},
                      json={**moved, "groups": ["physics"]})
        assert r.status_code == 400 and r.json()["field"] == "groups", r.text
    finally:
        bob.delete(api + "hub/egress/rules/org-token")
        admin.delete(api + "hub/egress/rules/org-token")


def _answer(r: requests.Response, given: str) -> tuple[int, str]:
    return r.status_code, r.text.replace(given, "<ID>")


def test_ids_of_others_get_the_answer_of_missing_ids(hub):
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    r = alice.post(api + "jobs", json={"command": ["echo", "alices job"], "backend": "local"})
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    job_id, op_id = job["id"], job["op_id"]
    r = bob.post(api + "jobs", json={"command": ["echo", "bobs job"], "backend": "local"})
    assert r.status_code == 202, r.text
    bob_job = r.json()["job"]["id"]

    # alice's own prefixes resolve for her
    assert alice.get(api + f"jobs/{job_id[:4]}").json()["id"] == job_id
    assert alice.get(api + f"operations/{op_id[:5]}").json()["id"] == op_id
    assert bob.get(api + f"jobs/{bob_job[:4]}").json()["id"] == bob_job

    # bob: alice's ids and prefixes are answered exactly like ids that do not exist
    fake_job, fake_op = "zz" * 4, "zz" * 6   # ids are hex: these exist nowhere
    for route, theirs, fake in (
            ("jobs/{}", job_id, fake_job), ("jobs/{}", job_id[:4], fake_job[:4]),
            ("jobs/{}/logs", job_id, fake_job), ("jobs/{}/logs", job_id[:3], fake_job[:3]),
            ("operations/{}", op_id, fake_op), ("operations/{}", op_id[:4], fake_op[:4]),
            ("operations/{}/events", op_id[:4], fake_op[:4])):
        got = bob.get(api + route.format(theirs))
        missing = bob.get(api + route.format(fake))
        assert got.status_code == 404, (route, got.text)
        assert _answer(got, theirs) == _answer(missing, fake), route
        echoed = got.text.replace(theirs, "<ID>")     # the id bob sent is echoed, no more
        assert job_id not in echoed and op_id not in echoed
        assert bob_job not in missing.text            # no "recent jobs" hint either
    for method, route in (("DELETE", f"jobs/{job_id[:4]}"),
                          ("DELETE", f"operations/{op_id[:4]}")):
        assert bob.request(method, api + route).status_code == 404
    # SQL wildcards are not patterns: no id matches them, for anyone
    for user in (alice, bob):
        for hostile in ("%25", "_", "%25%25", "a%25", "%5F"):
            for route in ("jobs/", "operations/"):
                r = user.get(api + route + hostile)
                assert r.status_code == 404, (route, hostile, r.text)
                assert job_id not in r.text and bob_job not in r.text


def test_a_freed_cluster_name_hands_nothing_to_the_next_owner(hub):
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    marker = f"alice-setup-{uuid.uuid4().hex[:8]}"
    r = alice.post(api + "clusters", json={
        "name": "shared-name", "provider": "pool", "workers": 0,
        "config": {"setup_commands": [f"echo {marker}"]}})
    assert r.status_code == 202, r.text
    alice_up = r.json()["operation"]["id"]
    assert wait_operation(alice, api, alice_up)["state"] == "succeeded"
    logs = alice.get(api + "clusters/shared-name/logs").json()["logs"]
    alice_nodes = set(logs)
    assert any(marker in text for text in logs.values())
    r = alice.delete(api + "clusters/shared-name")
    alice_down = r.json()["operation"]["id"]
    assert wait_operation(alice, api, alice_down)["state"] == "succeeded"

    # bob takes the free name
    r = bob.post(api + "clusters", json={"name": "shared-name", "provider": "pool",
                                         "workers": 0})
    assert r.status_code == 202, r.text
    bob_up = r.json()["operation"]["id"]
    try:
        assert wait_operation(bob, api, bob_up)["state"] == "succeeded"
        info = bob.get(api + "clusters/shared-name").json()
        assert info["owner"] == "bob" and info["last_operation"]["id"] == bob_up
        logs = bob.get(api + "clusters/shared-name/logs").json()["logs"]
        assert logs and not set(logs) & alice_nodes
        assert marker not in str(logs)
        for node in alice_nodes:
            r = bob.get(api + "clusters/shared-name/logs", params={"node": node})
            assert r.status_code == 404 and marker not in r.text
        ops = bob.get(api + "operations", params={"cluster": "shared-name"}).json()
        assert [o["id"] for o in ops["operations"]] == [bob_up]
        events = bob.get(api + "events", params={"after": 0}).json()["events"]
        assert bob_up in {e["op_id"] for e in events}
        assert not {e["op_id"] for e in events} & {alice_up, alice_down}
        for op in (alice_up, alice_down):
            assert bob.get(api + f"operations/{op}").status_code == 404
        # the name is bob's now; alice still has her own history
        assert alice.get(api + "clusters/shared-name").status_code == 404
        mine = {o["id"]: o for o in alice.get(api + "operations").json()["operations"]}
        assert {alice_up, alice_down} <= set(mine)
        assert mine[alice_up]["target"].startswith("cluster:shared-name@")
    finally:
        r = bob.delete(api + "clusters/shared-name")
        if r.status_code == 202:
            wait_operation(bob, api, r.json()["operation"]["id"])
    deadline = time.monotonic() + 5
    while bob.get(api + "clusters").json()["clusters"] and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_dashboard_is_served_to_its_owner_only(hub):
    """Through the hub's proxy, the sidekick serves a cluster's dashboard to its owner;
    another user gets the answer of a missing cluster, and no login gets nothing."""
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    name = f"dash-{uuid.uuid4().hex[:6]}"
    r = alice.post(api + "clusters", json={"name": name, "provider": "pool", "workers": 0})
    assert r.status_code == 202, r.text
    try:
        assert wait_operation(alice, api, r.json()["operation"]["id"])["state"] == "succeeded"
        link = alice.get(api + f"clusters/{name}").json()["dashboard_link"]
        assert link == f"/services/cloudtik/cloudtik/dashboard/{name}/status"
        url = hub.url.rstrip("/") + link
        page = alice.get(url, timeout=30)
        assert page.status_code == 200 and "bokeh" in page.text.lower()
        theirs = bob.get(url, timeout=30)
        assert theirs.status_code == 404 and "bokeh" not in theirs.text.lower()
        assert theirs.json()["reason"] == "not_found"
        missing = bob.get(url.replace(name, name + "x"), timeout=30)
        assert missing.status_code == 404 and missing.json() == theirs.json() | {
            "message": missing.json()["message"]}
        anonymous = requests.get(url, allow_redirects=False, timeout=30)
        assert anonymous.status_code in (302, 403) and "bokeh" not in anonymous.text.lower()
    finally:
        r = alice.delete(api + f"clusters/{name}")
        if r.status_code == 202:
            wait_operation(alice, api, r.json()["operation"]["id"])


# --------------------------------------------------------------------------- stateful
OWNED = ("clusters/", "operations/", "jobs/", "storages/", "workspaces/")
LISTS = ("clusters", "operations", "jobs", "storages", "workspaces", "events")
HUB_PLANTED = f"hub-planted-{uuid.uuid4().hex}"


def test_stateful_workflows_through_the_sidekick_keep_users_apart(hub):
    """schemathesis' stateful phase through the hub, as alice, on this module's hub: every
    step of hers on a resource is replayed with bob's token (never a 2xx), every list bob
    gets is searched for what alice made, every step is replayed without a token (403),
    and no answer to either carries a planted secret or a token."""
    import schemathesis
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import FlakyStrategyDefinition
    from schemathesis import GenerationMode

    from cloudtik_emulators.stateful_api import leaks, replay, stateful_machine
    from jupyter_cloudtik.api import openapi

    api = hub.sidekick_api
    base_url = api + "cloudtik/api" if not api.endswith("cloudtik/api/") else api.rstrip("/")
    alice = {"Authorization": f"token {hub.token('alice')}"}
    bob = requests.Session()
    bob.trust_env = False
    anonymous = requests.Session()
    anonymous.trust_env = False
    r = hub.session("alice").post(api + "storages", json={
        "name": "alices", "url": "s3://bucket/x", "options": {
            "provider": "Other", "access_key_id": "AKIAHUB", "secret_access_key": HUB_PLANTED,
            "endpoint": "http://127.0.0.1:9"}})
    assert r.status_code in (201, 403, 409), r.text   # users may not add storages here
    secrets_ = [HUB_PLANTED, hub.token("alice"), hub.token("bob"), TESTER_TOKEN_]
    # what bob's lists hold of his own (earlier tests of this module): a name alice also
    # uses ("echo", a job's default name) is not hers showing through
    bob_auth = {"Authorization": f"token {hub.token('bob')}"}
    bob_before = {sub: bob.get(f"{base_url}/{sub}", headers=bob_auth, timeout=30).text
                  for sub in LISTS if sub != "events"}
    made: set[str] = {"alices"} if r.status_code == 201 else set()
    stats: dict = {"steps": 0, "operations": set(), "links": set(), "failures": [],
                   "bob": 0, "bob_lists": 0, "anonymous": 0}

    def attacks(case, response):
        method = case.method.upper()
        sub = case.formatted_path.lstrip("/")
        if response.status_code < 300 and method in ("POST", "PUT") and response.text:
            body = response.json()
            for key in ("cluster", "storage", "workspace", "name", "id"):
                if isinstance(body.get(key), str) and len(body[key]) >= 4:
                    made.add(body[key])
            for key in ("operation", "job"):
                if isinstance(body.get(key), dict) and body[key].get("id"):
                    made.add(body[key]["id"])
        got = replay(anonymous, case, base_url, {})
        stats["anonymous"] += 1
        assert got.status_code == 403, (method, sub, got.status_code, got.text[:200])
        auth = {"Authorization": f"token {hub.token('bob')}"}
        if sub.startswith(OWNED) and case.path_parameters and response.status_code < 300:
            got = replay(bob, case, base_url, auth)
            stats["bob"] += 1
            assert got.status_code in (403, 404), (
                "bob reached alice's", method, sub, got.status_code, got.text[:300])
            assert not leaks(got, secrets_)
        if method == "GET" and sub in LISTS:
            got = replay(bob, case, base_url, auth)
            stats["bob_lists"] += 1
            assert got.status_code < 500 and not leaks(got, secrets_)
            theirs = [m for m in made if m in got.text and m not in bob_before.get(sub, "")]
            assert not theirs, ("bob's list shows alice's", sub, theirs)

    good = {
        "POST /clusters": lambda: {"name": f"st-{uuid.uuid4().hex[:6]}", "provider": "pool",
                                   "workers": 0},
        "PATCH /clusters/{name}": lambda: {"workers": 0},
        "POST /jobs": lambda: {"command": ["echo", "stateful"], "backend": "local"},
    }
    schema = schemathesis.openapi.from_dict(copy.deepcopy(openapi.spec()))  # it adds to the dict
    schema.config.update(base_url=base_url, request_timeout=60)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE])
    machine = stateful_machine(schema, auth=alice, secrets_=secrets_, attacks=attacks,
                               stats=stats, good_bodies=good)
    started = time.monotonic()
    stops = 0
    try:
        for _ in range(2):
            try:
                machine.run(settings=settings(
                    max_examples=8, stateful_step_count=6, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck)))
            except FlakyStrategyDefinition:
                stops += 1
    finally:
        a = hub.session("alice")
        for c in a.get(api + "clusters").json()["clusters"]:
            r = a.delete(api + f"clusters/{c['name']}")
            if r.status_code == 202:
                wait_operation(a, api, r.json()["operation"]["id"])
        a.delete(api + "storages/alices")
    print(f"hub stateful: {stats['steps']} steps over {len(stats['operations'])} operations, "
          f"{len(stats['links'])} links, {stats['bob']} replays as bob on alice's resources, "
          f"{stats['bob_lists']} of bob's lists searched, {stats['anonymous']} anonymous, "
          f"{stops} runs stopped early, in {time.monotonic() - started:.1f}s")
    assert not stats["failures"], "\n\n".join(stats["failures"][:10])
    assert stats["steps"] > 0 and stats["anonymous"] == stats["steps"]
