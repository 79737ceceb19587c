"""Consent between users for egress rules, in-process on a real state database
(``hub/egress_consent.py``); the same through a real hub is ``test_hub_ownership.py``."""

from __future__ import annotations

import time

import pytest

from jupyter_cloudtik.core.errors import ConfigError, NotFoundError
from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.core.store import Store, dumps
from jupyter_cloudtik.hub.catalog import Caller, Catalog
from jupyter_cloudtik.hub.egress_consent import EgressRules
from jupyter_cloudtik.hub.policy import CatalogPolicy

ALICE = Caller("alice", ("physics",))
BOB = Caller("bob", ("chemistry",))
ADMIN = Caller("admin", (), admin=True)
VALUE = "Bearer consent-test-value"


def _rules(state_dir) -> EgressRules:
    store = Store(state_dir)
    secrets = SecretStore(store)
    Catalog(store, secrets)
    return EgressRules(store, secrets, CatalogPolicy(store))


def _audience(rules: EgressRules, ref: str) -> tuple[list[str], list[str]]:
    """Who the proxy applies the rule ``ref`` (``user/NAME/ID``, ``admin/ID``) to."""
    r = next(x for x in rules.for_proxy() if x["id"] == ref)
    return r["users"], r["groups"]


def test_offer_accept_move_revoke(state_dir):
    rules = _rules(state_dir)
    body = {"host": "api.example.org", "header": "Authorization", "value": VALUE,
            "users": ["bob", "alice"]}
    rule, detail = rules.put(ALICE, "r1", body)
    assert rule["shares"] == [{"user": "bob", "state": "offered"}]   # not to herself
    assert VALUE not in str(rule) + str(detail)
    assert _audience(rules, "user/alice/r1") == (["alice"], [])
    assert rules.applies_to(BOB)["applied"] == []
    rules.decide(BOB, "r1", accept=True)
    assert _audience(rules, "user/alice/r1") == (["alice", "bob"], [])
    assert rules.applies_to(BOB)["applied"] == ["user/alice/r1"]
    # a new value for the same header and place keeps consent (key rotation) ...
    rules.put(ALICE, "r1", {**body, "value": VALUE + "-2"})
    assert _audience(rules, "user/alice/r1") == (["alice", "bob"], [])
    # ... a new place or header does not (and needs the value again)
    with pytest.raises(ConfigError) as e:
        rules.put(ALICE, "r1", {**body, "path_prefix": "/admin", "value": None})
    assert e.value.field == "value" and "somewhere else" in e.value.message
    rules.put(ALICE, "r1", {**body, "path_prefix": "/admin"})
    assert rules.get(ALICE, "r1")["shares"] == [{"user": "bob", "state": "offered"}]
    assert _audience(rules, "user/alice/r1") == (["alice"], [])
    rules.decide(BOB, "r1", accept=True)
    rules.put(ALICE, "r1", {**body, "path_prefix": "/admin", "header": "X-Other"})
    assert _audience(rules, "user/alice/r1") == (["alice"], [])
    # dropping bob from users deletes his share; so does revoke
    rules.decide(BOB, "r1", accept=True)
    rules.put(ALICE, "r1", {**body, "users": []})
    assert rules.offers(BOB) == [] and _audience(rules, "user/alice/r1") == (["alice"], [])
    with pytest.raises(NotFoundError):
        rules.decide(BOB, "r1", accept=True)
    rules.put(ALICE, "r1", body)
    rules.decide(BOB, "r1", accept=True)
    rules.revoke(ALICE, "r1", "bob")
    assert _audience(rules, "user/alice/r1") == (["alice"], [])
    with pytest.raises(NotFoundError):
        rules.revoke(BOB, "r1", "bob")          # only the owner (or an admin) revokes


def test_broad_audiences_are_for_admins(state_dir):
    rules = _rules(state_dir)
    base = {"host": "api.example.org", "header": "X-K", "value": VALUE}
    for extra, field in (({"users": ["*"]}, "users"), ({"groups": ["chemistry"]}, "groups")):
        with pytest.raises(ConfigError) as e:
            rules.put(ALICE, "broad", {**base, **extra})
        assert e.value.field == field and e.value.http_status == 400
    rule, _ = rules.put(ADMIN, "org", {**base, "users": ["bob"], "groups": ["physics"]})
    assert rule["authority"] == "admin" and rule["shares"] == []
    assert _audience(rules, "admin/org") == (["bob"], ["physics"])
    assert [r["id"] for r in rules.applies_to(BOB)["admin"]] == ["org"]
    assert [r["id"] for r in rules.applies_to(ALICE)["admin"]] == ["org"]
    # an admin editing a user's rule (naming its owner) does not give it the hub's
    # authority; without the owner the admin's PUT is a rule of the admin namespace
    rules.put(ALICE, "mine", {**base, "users": ["bob"]})
    with pytest.raises(ConfigError):
        rules.put(ADMIN, "mine", {**base, "groups": ["chemistry"]}, owner="alice")
    assert rules.get(ADMIN, "mine", owner="alice")["authority"] == "user"


def test_rules_from_before_consent_become_offers(tmp_path):
    """A database with rules made before consent existed: they apply to their owner only,
    and the users they named see an offer."""
    store = Store(tmp_path)
    secrets = SecretStore(store)
    Catalog(store, secrets)
    store.execute("INSERT INTO hub_egress_rules (id, host, header, users, groups, owner,"
                  " updated_at) VALUES ('old', 'bank.example.org', 'Authorization', ?, ?,"
                  " 'alice', ?)", (dumps(["bob", "*"]), dumps(["chemistry"]), time.time()))
    secrets.put("hub:egress:old", "value", VALUE)
    rules = EgressRules(store, secrets, CatalogPolicy(store))
    # a user's rule then: it is now alice's, in her namespace, its value moved with it
    assert _audience(rules, "user/alice/old") == (["alice"], [])
    assert [(o["id"], o["share"]) for o in rules.offers(BOB)] == [("old", "offered")]
    assert secrets.names("hub:egress:old") == []


def test_ids_belong_to_their_owner(state_dir):
    """Issue 26: bob made ``org-token`` first; the admin's later PUT of ``org-token`` kept
    bob as its owner, and bob then pointed it at his own server without resending the
    value — and received the admin's secret.  Namespaces: no shared row, no probe."""
    rules = _rules(state_dir)
    mine = {"host": "bob.example.net", "header": "Authorization", "value": "Bearer bob"}
    rules.put(BOB, "org-token", mine)
    org = {"host": "api.example.org", "header": "Authorization", "value": VALUE,
           "groups": ["physics", "chemistry"]}
    rule, _ = rules.put(ADMIN, "org-token", org)
    assert (rule["ref"], rule["owner"], rule["authority"]) == ("admin/org-token", "admin",
                                                                "admin")
    # bob moves *his* rule, which never held the admin's value; the admin's is untouched
    rules.put(BOB, "org-token", {**mine, "host": "evil.example.net",
                                 "value": "Bearer bob-2"})
    proxy = {r["id"]: r for r in rules.for_proxy()}
    assert proxy["admin/org-token"]["host"] == "api.example.org"
    assert proxy["admin/org-token"]["value"] == VALUE
    assert proxy["user/bob/org-token"]["value"] == "Bearer bob-2"
    # moving a rule needs its value again, whoever asks
    with pytest.raises(ConfigError) as e:
        rules.put(ADMIN, "org-token", {**org, "host": "elsewhere.example.org", "value": ""})
    assert e.value.field == "value"
    # ids cannot be probed: alice's PUT, GET and DELETE of "org-token" act on her own
    # namespace, exactly as for an id nobody uses
    for rid in ("org-token", "never-used"):
        with pytest.raises(NotFoundError) as e:
            rules.get(ALICE, rid)
        assert e.value.message == f"no egress rule '{rid}' of yours"
        with pytest.raises(NotFoundError):
            rules.delete(ALICE, rid)
        rule, _ = rules.put(ALICE, rid, {"host": "a.example.org", "header": "X-A",
                                         "value": "alice-value"})
        assert rule["owner"] == "alice" and rule["ref"] == f"user/alice/{rid}"
    # and a user naming another owner names nothing
    with pytest.raises(NotFoundError):
        rules.get(ALICE, "org-token", owner="bob")
    with pytest.raises(NotFoundError):
        rules.put(ALICE, "org-token", mine, owner="bob")


def test_the_rule_of_docs_hub_egress_md():
    """The doc's rule, in the form the proxy takes it (``EgressSupervisor.update(rules=)``):
    it matches what the table says and never shows its value."""
    import json

    import doc_examples

    from jupyter_cloudtik.hub.egress.rules import Rule

    data = json.loads(doc_examples.block("docs/hub-egress.md", "Rules").text)
    rule = Rule.from_dict(data)
    assert rule.matches_host("eso.archive.example.org", 443)
    assert not rule.matches_host("archive.example.org", 443)  # not the domain itself
    assert not rule.matches_host("eso.archive.example.org", 80)
    assert rule.matches_path("/api/x") and not rule.matches_path("/apix")
    assert data["value"] not in repr(rule) + str(rule) + json.dumps(rule.to_public())
    assert (rule.users, rule.groups, rule.owner) == (("alice",), ("physics",), "carol")
