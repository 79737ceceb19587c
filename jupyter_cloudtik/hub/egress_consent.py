"""Egress rules of the sidekick's users, and the consent that lets one act on another's traffic.

A rule injects a header into some sessions' outbound requests.  Whose sessions is the
point (issue 12: alice's rule with ``users: ["bob"]`` used to replace bob's own
``Authorization`` with hers, and bob could not even see the rule):

* A rule made by a **user** applies to its owner.  Every other user it names in ``users``
  is *offered* a share: it applies to that user's sessions only once they accepted, and
  stops when they decline or the owner revokes (removes them from ``users`` or deletes
  the offer).  ``"*"`` and ``groups`` would offer it to people who never asked: refused for
  users' rules (400 naming the field); an admin makes such rules.
* A rule made by an **admin** carries the hub's authority and applies as configured
  (``users``, ``groups``, ``"*"``) with no acceptance, like the catalogue.
* Whatever applies, each user sees it (``applies_to``: public form, never the value).
* A change of what a rule injects where (host, port, path prefix, header) needs the value
  again (whoever made the change may not redirect a secret they never held) and puts
  accepted shares back to "offered": consent was given to the rule as it was.

**Ids belong to their owner** (issue 26: bob made ``org-token`` first, the admin's later
PUT of ``org-token`` kept bob as owner, and bob then pointed it at his own server).  Rules
live in namespaces: ``admin`` for admins' rules, ``user:NAME`` for each user's.  A user's
PUT or DELETE of an id only ever touches their own namespace — so no answer says whether
someone else uses that id — and an admin's touches the admin namespace (another user's
rule only when the admin names its owner, ``?owner=NAME``).  A rule's reference
``admin/ID`` or ``user/NAME/ID`` (``ref``) is its id for the proxy and the secret store.

The proxy never sees offers: ``for_proxy`` gives it each rule with the users it applies to
now, so its matching stays simple (``egress.rules.Rule.allows``).
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

from ..core.errors import ConfigError, ConflictError, NotFoundError
from ..core.grants import Policy
from ..core.secrets import SecretStore
from ..core.store import Store, dumps, loads
from .catalog import EVERYONE, SECRET, Caller

__all__ = ["RULE_ID", "EgressRules"]

RULE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
OFFERED, ACCEPTED, DECLINED = "offered", "accepted", "declined"
ADMIN_NS = "admin"


def _consent_tables(conn: Any) -> None:
    """Rules made before consent existed become users' rules (their creator's authority
    is not recorded), and every user they named is offered a share: nothing of theirs
    acts on another user's traffic until that user accepts."""
    conn.execute("ALTER TABLE hub_egress_rules ADD COLUMN admin INTEGER NOT NULL DEFAULT 0")
    conn.execute("""
        CREATE TABLE hub_egress_shares (
            rule_id TEXT NOT NULL REFERENCES hub_egress_rules(id) ON DELETE CASCADE,
            user TEXT NOT NULL,
            state TEXT NOT NULL,
            offered_at REAL NOT NULL,
            decided_at REAL,
            PRIMARY KEY (rule_id, user)
        )""")
    conn.execute("CREATE INDEX hub_egress_shares_user ON hub_egress_shares(user)")
    now = time.time()
    for row in conn.execute("SELECT id, users, owner FROM hub_egress_rules").fetchall():
        for user in sorted(set(loads(row[1], [])) - {row[2], EVERYONE}):
            conn.execute("INSERT INTO hub_egress_shares (rule_id, user, state, offered_at)"
                         " VALUES (?, ?, ?, ?)", (row[0], user, OFFERED, now))


def _namespaces(conn: Any) -> None:
    """Rules and shares keyed by (namespace, id): an admin's rule and a user's rule never
    share a row.  Existing rules go to their authority's namespace (ids were unique, so
    nothing collides); their secrets follow at start-up (``EgressRules._move_secrets``)."""
    conn.execute("""
        CREATE TABLE hub_egress_rules_ns (
            ns TEXT NOT NULL,
            id TEXT NOT NULL,
            host TEXT NOT NULL,
            port INTEGER,
            path_prefix TEXT NOT NULL DEFAULT '/',
            header TEXT NOT NULL,
            users TEXT NOT NULL DEFAULT '[]',
            groups TEXT NOT NULL DEFAULT '[]',
            owner TEXT NOT NULL,
            admin INTEGER NOT NULL DEFAULT 0,
            updated_at REAL NOT NULL,
            legacy_id TEXT,
            PRIMARY KEY (ns, id)
        )""")
    conn.execute("""
        CREATE TABLE hub_egress_shares_ns (
            ns TEXT NOT NULL,
            rule_id TEXT NOT NULL,
            user TEXT NOT NULL,
            state TEXT NOT NULL,
            offered_at REAL NOT NULL,
            decided_at REAL,
            PRIMARY KEY (ns, rule_id, user)
        )""")
    conn.execute("CREATE INDEX hub_egress_shares_ns_user ON hub_egress_shares_ns(user)")
    conn.execute(
        "INSERT INTO hub_egress_rules_ns (ns, id, host, port, path_prefix, header, users,"
        " groups, owner, admin, updated_at, legacy_id)"
        " SELECT CASE WHEN admin THEN 'admin' ELSE 'user:' || owner END, id, host, port,"
        " path_prefix, header, users, groups, owner, admin, updated_at, id"
        " FROM hub_egress_rules")
    conn.execute(
        "INSERT INTO hub_egress_shares_ns (ns, rule_id, user, state, offered_at, decided_at)"
        " SELECT r.ns, s.rule_id, s.user, s.state, s.offered_at, s.decided_at"
        " FROM hub_egress_shares s JOIN hub_egress_rules_ns r ON r.id = s.rule_id")
    conn.execute("DROP TABLE hub_egress_shares")
    conn.execute("DROP TABLE hub_egress_rules")


# after the hub area's first migration (it made hub_egress_rules)
MIGRATIONS = [_consent_tables, _namespaces]


def ref_of(ns: str, rule_id: str) -> str:
    """A rule's reference: ``admin/ID`` or ``user/NAME/ID`` (the name percent-encoded)."""
    if ns == ADMIN_NS:
        return f"admin/{rule_id}"
    return f"user/{quote(ns.removeprefix('user:'), safe='')}/{rule_id}"


def _scope(ns: str, rule_id: str) -> str:
    return f"hub:egress:{ref_of(ns, rule_id)}"


def _check_id(rule_id: str) -> None:
    if not RULE_ID.match(rule_id or ""):
        raise ConfigError(f"id: {rule_id!r} is not a rule id (1-128 letters, digits, "
                          "'_', '.', ':' or '-')", field="id", value=rule_id)


def _missing(rule_id: str) -> NotFoundError:
    return NotFoundError(f"no egress rule '{rule_id}' of yours", field="id", value=rule_id)


class EgressRules:
    """The rules table, its shares, and what each caller may see and change."""

    def __init__(self, store: Store, secrets: SecretStore, policy: Policy) -> None:
        self.store = store
        self.secrets = secrets
        self.policy = policy
        store.ensure_schema("hub_egress", MIGRATIONS)
        self._move_secrets()

    def _move_secrets(self) -> None:
        """Values of rules made before namespaces, under their old scope: moved once."""
        for r in self.store.query("SELECT ns, id, legacy_id FROM hub_egress_rules_ns"
                                  " WHERE legacy_id IS NOT NULL"):
            old = f"hub:egress:{r['legacy_id']}"
            if self.secrets.names(old):
                self.secrets.rename_scope(old, _scope(r["ns"], r["id"]))
            with self.store.transaction() as conn:
                conn.execute("UPDATE hub_egress_rules_ns SET legacy_id = NULL WHERE ns = ?"
                             " AND id = ?", (r["ns"], r["id"]))

    # namespaces ---------------------------------------------------------------------------
    @staticmethod
    def namespace(caller: Caller, owner: str | None = None) -> str:
        """Where the caller's request acts: their own namespace; an admin's, the admin
        namespace — or ``owner``'s when an admin names one (``owner`` from anyone else
        names nothing of theirs: the very answer of a missing rule)."""
        if owner is None or owner == "":
            return ADMIN_NS if caller.admin else f"user:{caller.name}"
        if caller.admin:
            return ADMIN_NS if owner == ADMIN_NS else f"user:{owner}"
        if owner == caller.name:
            return f"user:{caller.name}"
        return "\0nobody"  # matches no row

    # reading --------------------------------------------------------------------------
    def _rows(self, ns: str | None = None) -> list[Any]:
        if ns is None:
            return self.store.query("SELECT * FROM hub_egress_rules_ns ORDER BY ns, id")
        return self.store.query("SELECT * FROM hub_egress_rules_ns WHERE ns = ? ORDER BY id",
                                (ns,))

    def _shares(self, ns: str | None = None, rule_id: str | None = None,
                user: str | None = None) -> list[Any]:
        sql, params = "SELECT * FROM hub_egress_shares_ns", []
        clauses = []
        for col, val in (("ns", ns), ("rule_id", rule_id), ("user", user)):
            if val is not None:
                clauses.append(f"{col} = ?")
                params.append(val)
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        return self.store.query(sql + " ORDER BY ns, rule_id, user", params)

    def _row(self, ns: str, rule_id: str) -> Any:
        return self.store.query_one("SELECT * FROM hub_egress_rules_ns WHERE ns = ? AND id = ?",
                                    (ns, rule_id))

    def _owned_row(self, caller: Caller, rule_id: str, owner: str | None = None) -> Any:
        row = self._row(self.namespace(caller, owner), rule_id)
        if row is None:
            raise _missing(rule_id)
        return row

    @staticmethod
    def _where(row: Any) -> dict[str, Any]:
        """What a rule injects where: enough to decide on an offer, no audience, no value."""
        return {"id": row["id"], "ref": ref_of(row["ns"], row["id"]), "host": row["host"],
                "port": row["port"], "path_prefix": row["path_prefix"],
                "header": row["header"], "value": SECRET, "owner": row["owner"],
                "authority": "admin" if row["admin"] else "user",
                "updated_at": row["updated_at"]}

    def public(self, row: Any) -> dict[str, Any]:
        """The owner's (or an admin's) view: audience and the state of each offer."""
        return {**self._where(row), "users": loads(row["users"], []),
                "groups": loads(row["groups"], []),
                "shares": [{"user": s["user"], "state": s["state"]}
                           for s in self._shares(ns=row["ns"], rule_id=row["id"])]}

    def owned(self, caller: Caller) -> list[dict[str, Any]]:
        """Rules the caller owns (admins: all)."""
        rows = self._rows() if caller.admin else self._rows(f"user:{caller.name}")
        return [self.public(r) for r in rows]

    def get(self, caller: Caller, rule_id: str, owner: str | None = None) -> dict[str, Any]:
        return self.public(self._owned_row(caller, rule_id, owner))

    def offers(self, caller: Caller) -> list[dict[str, Any]]:
        """Shares offered to the caller, whatever their state."""
        out = []
        for s in self._shares(user=caller.name):
            row = self._row(s["ns"], s["rule_id"])
            if row is not None:
                out.append({**self._where(row), "share": s["state"],
                            "offered_at": s["offered_at"], "decided_at": s["decided_at"]})
        return out

    def applies_to(self, caller: Caller) -> dict[str, Any]:
        """Every rule that acts (or may, once accepted) on the caller's sessions."""
        # deferred: start-up (hub.egress.rules ~68 ms, loads cryptography, ssl)
        from .egress.rules import Rule

        own = [self.public(r) for r in self._rows(f"user:{caller.name}")]
        admin = []
        for row in self._rows(ADMIN_NS):
            rule = Rule(id=ref_of(row["ns"], row["id"]), host=row["host"],
                        header=row["header"], value="-",
                        users=tuple(loads(row["users"], [])),
                        groups=tuple(loads(row["groups"], [])), owner=row["owner"])
            if rule.allows(caller.name, caller.groups):
                admin.append(self._where(row))
        shared = self.offers(caller)
        return {"own": own, "shared": shared, "admin": admin,
                "applied": sorted([r["ref"] for r in own + admin]
                                  + [r["ref"] for r in shared if r["share"] == ACCEPTED])}

    # changing ---------------------------------------------------------------------------
    def put(self, caller: Caller, rule_id: str, body: dict[str, Any],
            owner: str | None = None) -> tuple[dict, dict]:
        """Create or replace a rule in the caller's namespace (an admin's: the admin one,
        or ``owner``'s rule when named); (its public form, an audit detail without
        secrets)."""
        # deferred: start-up (hub.egress.rules ~68 ms, loads cryptography, ssl)
        from .egress.rules import Rule

        _check_id(rule_id)
        ns = self.namespace(caller, owner)
        if ns == "\0nobody" or (owner not in (None, "", ADMIN_NS)
                                and self._row(ns, rule_id) is None):
            raise _missing(rule_id)  # an admin edits other users' existing rules only
        row = self._row(ns, rule_id)
        rule_owner = row["owner"] if row is not None else caller.name
        # the authority is the namespace's: an admin editing a user's rule does not make
        # it apply without consent, and a user's rule never gains the hub's authority
        authority = ns == ADMIN_NS
        users = list(body.get("users") or [])
        groups = list(body.get("groups") or [])
        if not authority:
            if EVERYONE in users:
                raise ConfigError(
                    f"users: '*' (everyone) is for rules an admin made; '{rule_id}' is a "
                    f"user's rule ({rule_owner}'s): it applies to its owner and to the "
                    "users it names once each accepted", field="users", value=EVERYONE)
            if groups:
                raise ConfigError(
                    f"groups: {groups!r} — '{rule_id}' is a user's rule ({rule_owner}'s): "
                    "it is offered to named users, who each accept it; rules for groups "
                    "are made by an admin", field="groups", value=groups)
        given = body.get("value")
        new_value = given not in (None, "", SECRET)
        try:
            rule = Rule(id=ref_of(ns, rule_id), host=body["host"], header=body["header"],
                        value=given if new_value else "-",
                        port=body.get("port"), path_prefix=body.get("path_prefix") or "/",
                        users=tuple(users), groups=tuple(groups), owner=rule_owner)
        except ValueError as e:
            raise ConfigError(str(e), field="body") from None
        moved = row is not None and (
            (row["host"], row["port"], row["path_prefix"], row["header"].lower())
            != (rule.host, rule.port, rule.path_prefix, rule.header.lower()))
        if not new_value:
            if row is None:
                raise ConfigError("value: a new rule needs the header value to inject",
                                  field="value")
            if moved:
                raise ConfigError(
                    f"value: rule '{rule_id}' would send its secret somewhere else (host, "
                    "port, path prefix or header changed); send the value again with the "
                    "change — a rule's destination changes only with its value",
                    field="value")
        # an admin's rule needs no acceptance: it has no shares to offer
        offered = [] if authority else sorted({u for u in rule.users if u != rule_owner})
        now = time.time()
        if new_value:
            self.secrets.put(_scope(ns, rule_id), "value", given)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hub_egress_rules_ns (ns, id, host, port, path_prefix, header,"
                " users, groups, owner, admin, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(ns, id) DO UPDATE SET host = excluded.host,"
                " port = excluded.port, path_prefix = excluded.path_prefix,"
                " header = excluded.header, users = excluded.users, groups = excluded.groups,"
                " updated_at = excluded.updated_at",
                (ns, rule_id, rule.host, rule.port, rule.path_prefix, rule.header,
                 dumps(list(rule.users)), dumps(list(rule.groups)), rule_owner,
                 int(authority), now))
            marks = ",".join("?" * len(offered))
            conn.execute(f"DELETE FROM hub_egress_shares_ns WHERE ns = ? AND rule_id = ?"
                         f" AND user NOT IN ({marks})", (ns, rule_id, *offered))
            if moved:
                conn.execute("UPDATE hub_egress_shares_ns SET state = ?, decided_at = NULL"
                             " WHERE ns = ? AND rule_id = ? AND state = ?",
                             (OFFERED, ns, rule_id, ACCEPTED))
            for u in offered:
                conn.execute("INSERT INTO hub_egress_shares_ns (ns, rule_id, user, state,"
                             " offered_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             (ns, rule_id, u, OFFERED, now))
        detail = {"ref": ref_of(ns, rule_id), "host": rule.host, "header": rule.header,
                  "users": list(rule.users), "groups": list(rule.groups),
                  "authority": "admin" if authority else "user",
                  "value": "changed" if new_value else "kept"}
        return self.public(self._row(ns, rule_id)), detail

    def delete(self, caller: Caller, rule_id: str, owner: str | None = None) -> str:
        row = self._owned_row(caller, rule_id, owner)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM hub_egress_shares_ns WHERE ns = ? AND rule_id = ?",
                         (row["ns"], rule_id))
            conn.execute("DELETE FROM hub_egress_rules_ns WHERE ns = ? AND id = ?",
                         (row["ns"], rule_id))
        self.secrets.delete(_scope(row["ns"], rule_id))
        return ref_of(row["ns"], rule_id)

    def _offered(self, caller: Caller, rule_id: str, owner: str | None) -> Any:
        shares = [s for s in self._shares(rule_id=rule_id, user=caller.name)
                  if owner in (None, "") or s["ns"] == f"user:{owner}"]
        if not shares:
            raise NotFoundError(f"no egress rule '{rule_id}' is offered to you", field="id",
                                value=rule_id)
        if len(shares) > 1:
            owners = ", ".join(s["ns"].removeprefix("user:") for s in shares)
            raise ConflictError(f"id: rules named '{rule_id}' are offered to you by "
                                f"{owners}; say whose (?owner=NAME)", field="owner",
                                value=rule_id)
        return shares[0]

    def decide(self, caller: Caller, rule_id: str, accept: bool,
               owner: str | None = None) -> dict[str, Any]:
        """The offered user accepts (or declines, or withdraws an acceptance)."""
        share = self._offered(caller, rule_id, owner)
        with self.store.transaction() as conn:
            conn.execute("UPDATE hub_egress_shares_ns SET state = ?, decided_at = ?"
                         " WHERE ns = ? AND rule_id = ? AND user = ?",
                         (ACCEPTED if accept else DECLINED, time.time(), share["ns"],
                          rule_id, caller.name))
        ref = ref_of(share["ns"], rule_id)
        return next(o for o in self.offers(caller) if o["ref"] == ref)

    def revoke(self, caller: Caller, rule_id: str, user: str,
               owner: str | None = None) -> dict[str, Any]:
        """The owner (or an admin) takes an offer back, accepted or not: the user is
        dropped from the rule's ``users``."""
        row = self._owned_row(caller, rule_id, owner)
        users = loads(row["users"], [])
        if user not in users:
            raise NotFoundError(f"egress rule '{rule_id}' is not offered to '{user}'",
                                field="user", value=user)
        with self.store.transaction() as conn:
            conn.execute("UPDATE hub_egress_rules_ns SET users = ?, updated_at = ?"
                         " WHERE ns = ? AND id = ?",
                         (dumps([u for u in users if u != user]), time.time(), row["ns"],
                          rule_id))
            conn.execute("DELETE FROM hub_egress_shares_ns WHERE ns = ? AND rule_id = ?"
                         " AND user = ?", (row["ns"], rule_id, user))
        return self.public(self._row(row["ns"], rule_id))

    # the proxy ----------------------------------------------------------------------------
    def for_proxy(self) -> list[dict[str, Any]]:
        """Every rule with the audience it has now, value included (only for the pipe to
        the proxy process, read with the service's own grant): a user's rule reaches its
        owner and those who accepted."""
        accepted: dict[tuple[str, str], list[str]] = {}
        for s in self.store.query("SELECT ns, rule_id, user FROM hub_egress_shares_ns"
                                  " WHERE state = ? ORDER BY user", (ACCEPTED,)):
            accepted.setdefault((s["ns"], s["rule_id"]), []).append(s["user"])
        out = []
        for r in self._rows():
            ref = ref_of(r["ns"], r["id"])
            value = self.secrets.reveal(
                self.policy.service("egress", ref, "the egress proxy injects it"), "value")
            if value is None:
                continue
            if r["admin"]:
                users, groups = loads(r["users"], []), loads(r["groups"], [])
            else:
                named = set(loads(r["users"], []))
                users = [r["owner"], *(u for u in accepted.get((r["ns"], r["id"]), [])
                                       if u in named)]
                groups = []
            out.append({"id": ref, "host": r["host"], "port": r["port"],
                        "path_prefix": r["path_prefix"], "header": r["header"],
                        "value": value, "users": users, "groups": groups,
                        "owner": r["owner"]})
        return out
