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
* A change of what a rule injects where (host, port, path prefix, header) puts accepted
  shares back to "offered": consent was given to the rule as it was.

The proxy never sees offers: ``for_proxy`` gives it each rule with the users it applies to
now, so its matching stays simple (``egress.rules.Rule.allows``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..core.errors import ConfigError, NotFoundError
from ..core.secrets import SecretStore
from ..core.store import Store, dumps, loads
from .catalog import EVERYONE, SECRET, Caller

__all__ = ["RULE_ID", "EgressRules"]

RULE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
OFFERED, ACCEPTED, DECLINED = "offered", "accepted", "declined"

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


# after the hub area's first migration (it made hub_egress_rules)
MIGRATIONS = [_consent_tables]


def _scope(rule_id: str) -> str:
    return f"hub:egress:{rule_id}"


def _check_id(rule_id: str) -> None:
    if not RULE_ID.match(rule_id or ""):
        raise ConfigError(f"id: {rule_id!r} is not a rule id (1-128 letters, digits, "
                          "'_', '.', ':' or '-')", field="id", value=rule_id)


class EgressRules:
    """The rules table, its shares, and what each caller may see and change."""

    def __init__(self, store: Store, secrets: SecretStore) -> None:
        self.store = store
        self.secrets = secrets
        store.ensure_schema("hub_egress", MIGRATIONS)

    # reading --------------------------------------------------------------------------
    def _rows(self) -> list[Any]:
        return self.store.query("SELECT * FROM hub_egress_rules ORDER BY id")

    def _shares(self, rule_id: str | None = None, user: str | None = None) -> list[Any]:
        sql, params = "SELECT * FROM hub_egress_shares", []
        clauses = []
        if rule_id is not None:
            clauses.append("rule_id = ?")
            params.append(rule_id)
        if user is not None:
            clauses.append("user = ?")
            params.append(user)
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        return self.store.query(sql + " ORDER BY rule_id, user", params)

    def _row(self, rule_id: str) -> Any:
        return self.store.query_one("SELECT * FROM hub_egress_rules WHERE id = ?", (rule_id,))

    def _owned_row(self, caller: Caller, rule_id: str) -> Any:
        row = self._row(rule_id)
        if row is None or (row["owner"] != caller.name and not caller.admin):
            raise NotFoundError(f"no egress rule '{rule_id}' of yours", field="id",
                                value=rule_id)
        return row

    @staticmethod
    def _where(row: Any) -> dict[str, Any]:
        """What a rule injects where: enough to decide on an offer, no audience, no value."""
        return {"id": row["id"], "host": row["host"], "port": row["port"],
                "path_prefix": row["path_prefix"], "header": row["header"],
                "value": SECRET, "owner": row["owner"],
                "authority": "admin" if row["admin"] else "user",
                "updated_at": row["updated_at"]}

    def public(self, row: Any) -> dict[str, Any]:
        """The owner's (or an admin's) view: audience and the state of each offer."""
        return {**self._where(row), "users": loads(row["users"], []),
                "groups": loads(row["groups"], []),
                "shares": [{"user": s["user"], "state": s["state"]}
                           for s in self._shares(rule_id=row["id"])]}

    def owned(self, caller: Caller) -> list[dict[str, Any]]:
        """Rules the caller owns (admins: all)."""
        return [self.public(r) for r in self._rows()
                if caller.admin or r["owner"] == caller.name]

    def get(self, caller: Caller, rule_id: str) -> dict[str, Any]:
        return self.public(self._owned_row(caller, rule_id))

    def offers(self, caller: Caller) -> list[dict[str, Any]]:
        """Shares offered to the caller, whatever their state."""
        out = []
        for s in self._shares(user=caller.name):
            row = self._row(s["rule_id"])
            if row is not None:
                out.append({**self._where(row), "share": s["state"],
                            "offered_at": s["offered_at"], "decided_at": s["decided_at"]})
        return out

    def applies_to(self, caller: Caller) -> dict[str, Any]:
        """Every rule that acts (or may, once accepted) on the caller's sessions."""
        from .egress.rules import Rule

        own, admin = [], []
        for row in self._rows():
            if row["owner"] == caller.name:
                own.append(self.public(row))
            elif row["admin"]:
                rule = Rule(id=row["id"], host=row["host"], header=row["header"],
                            value="-", users=tuple(loads(row["users"], [])),
                            groups=tuple(loads(row["groups"], [])), owner=row["owner"])
                if rule.allows(caller.name, caller.groups):
                    admin.append(self._where(row))
        shared = self.offers(caller)
        return {"own": own, "shared": shared, "admin": admin,
                "applied": sorted([r["id"] for r in own + admin]
                                  + [r["id"] for r in shared if r["share"] == ACCEPTED])}

    # changing ---------------------------------------------------------------------------
    def put(self, caller: Caller, rule_id: str, body: dict[str, Any]) -> tuple[dict, dict]:
        """Create or replace a rule; (its public form, an audit detail without secrets)."""
        from .egress.rules import Rule

        _check_id(rule_id)
        row = self._row(rule_id)
        if row is not None and row["owner"] != caller.name and not caller.admin:
            raise NotFoundError(f"no egress rule '{rule_id}' of yours", field="id",
                                value=rule_id)
        owner = row["owner"] if row is not None else caller.name
        # the authority is the creator's: an admin editing a user's rule does not make it
        # apply without consent, and a user's rule never gains the hub's authority
        authority = bool(row["admin"]) if row is not None else caller.admin
        users = list(body.get("users") or [])
        groups = list(body.get("groups") or [])
        if not authority:
            if EVERYONE in users:
                raise ConfigError(
                    f"users: '*' (everyone) is for rules an admin made; '{rule_id}' is a "
                    f"user's rule ({owner}'s): it applies to its owner and to the users "
                    "it names once each accepted", field="users", value=EVERYONE)
            if groups:
                raise ConfigError(
                    f"groups: {groups!r} — '{rule_id}' is a user's rule ({owner}'s): it is "
                    "offered to named users, who each accept it; rules for groups are "
                    "made by an admin", field="groups", value=groups)
        value = body.get("value")
        if value in (None, "", SECRET):
            value = self.secrets.get_all(_scope(rule_id)).get("value")
            if value is None:
                raise ConfigError("value: a new rule needs the header value to inject",
                                  field="value")
        try:
            rule = Rule(id=rule_id, host=body["host"], header=body["header"], value=value,
                        port=body.get("port"), path_prefix=body.get("path_prefix") or "/",
                        users=tuple(users), groups=tuple(groups), owner=owner)
        except ValueError as e:
            raise ConfigError(str(e), field="body") from None
        # an admin's rule needs no acceptance: it has no shares to offer
        offered = [] if authority else sorted({u for u in rule.users if u != owner})
        moved = row is not None and (
            (row["host"], row["port"], row["path_prefix"], row["header"].lower())
            != (rule.host, rule.port, rule.path_prefix, rule.header.lower()))
        now = time.time()
        self.secrets.put(_scope(rule_id), "value", value)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO hub_egress_rules (id, host, port, path_prefix, header, users,"
                " groups, owner, admin, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET host = excluded.host, port = excluded.port,"
                " path_prefix = excluded.path_prefix, header = excluded.header,"
                " users = excluded.users, groups = excluded.groups,"
                " updated_at = excluded.updated_at",
                (rule_id, rule.host, rule.port, rule.path_prefix, rule.header,
                 dumps(list(rule.users)), dumps(list(rule.groups)), owner, int(authority),
                 now))
            marks = ",".join("?" * len(offered))
            conn.execute(f"DELETE FROM hub_egress_shares WHERE rule_id = ?"
                         f" AND user NOT IN ({marks})", (rule_id, *offered))
            if moved:
                conn.execute("UPDATE hub_egress_shares SET state = ?, decided_at = NULL"
                             " WHERE rule_id = ? AND state = ?", (OFFERED, rule_id, ACCEPTED))
            for u in offered:
                conn.execute("INSERT INTO hub_egress_shares (rule_id, user, state, offered_at)"
                             " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             (rule_id, u, OFFERED, now))
        detail = {"host": rule.host, "header": rule.header, "users": list(rule.users),
                  "groups": list(rule.groups),
                  "authority": "admin" if authority else "user"}
        return self.public(self._row(rule_id)), detail

    def delete(self, caller: Caller, rule_id: str) -> None:
        self._owned_row(caller, rule_id)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM hub_egress_shares WHERE rule_id = ?", (rule_id,))
            conn.execute("DELETE FROM hub_egress_rules WHERE id = ?", (rule_id,))
        self.secrets.delete(_scope(rule_id))

    def decide(self, caller: Caller, rule_id: str, accept: bool) -> dict[str, Any]:
        """The offered user accepts (or declines, or withdraws an acceptance)."""
        share = self.store.query_one(
            "SELECT * FROM hub_egress_shares WHERE rule_id = ? AND user = ?",
            (rule_id, caller.name))
        if share is None:
            raise NotFoundError(f"no egress rule '{rule_id}' is offered to you", field="id",
                                value=rule_id)
        with self.store.transaction() as conn:
            conn.execute("UPDATE hub_egress_shares SET state = ?, decided_at = ?"
                         " WHERE rule_id = ? AND user = ?",
                         (ACCEPTED if accept else DECLINED, time.time(), rule_id,
                          caller.name))
        return next(o for o in self.offers(caller) if o["id"] == rule_id)

    def revoke(self, caller: Caller, rule_id: str, user: str) -> dict[str, Any]:
        """The owner (or an admin) takes an offer back, accepted or not: the user is
        dropped from the rule's ``users``."""
        row = self._owned_row(caller, rule_id)
        users = loads(row["users"], [])
        if user not in users:
            raise NotFoundError(f"egress rule '{rule_id}' is not offered to '{user}'",
                                field="user", value=user)
        with self.store.transaction() as conn:
            conn.execute("UPDATE hub_egress_rules SET users = ?, updated_at = ? WHERE id = ?",
                         (dumps([u for u in users if u != user]), time.time(), rule_id))
            conn.execute("DELETE FROM hub_egress_shares WHERE rule_id = ? AND user = ?",
                         (rule_id, user))
        return self.public(self._row(rule_id))

    # the proxy ----------------------------------------------------------------------------
    def for_proxy(self) -> list[dict[str, Any]]:
        """Every rule with the audience it has now, value included (only for the pipe to
        the proxy process): a user's rule reaches its owner and those who accepted."""
        accepted: dict[str, list[str]] = {}
        for s in self.store.query("SELECT rule_id, user FROM hub_egress_shares"
                                  " WHERE state = ? ORDER BY user", (ACCEPTED,)):
            accepted.setdefault(s["rule_id"], []).append(s["user"])
        out = []
        for r in self._rows():
            value = self.secrets.get_all(_scope(r["id"])).get("value")
            if value is None:
                continue
            if r["admin"]:
                users, groups = loads(r["users"], []), loads(r["groups"], [])
            else:
                named = set(loads(r["users"], []))
                users = [r["owner"], *(u for u in accepted.get(r["id"], []) if u in named)]
                groups = []
            out.append({"id": r["id"], "host": r["host"], "port": r["port"],
                        "path_prefix": r["path_prefix"], "header": r["header"],
                        "value": value, "users": users, "groups": groups,
                        "owner": r["owner"]})
        return out
