"""Reservations: a placement held as claims until its nodes exist.

Nova's zones raced: two schedulers picked the same free host because nothing recorded a
choice between "selected" and "created".  Here the choice *is* a record.  ``reserve``
runs inside one store write transaction (SQLite ``BEGIN IMMEDIATE``, so one process at a
time, across processes): it reads every claim that still counts, subtracts them from the
offers, places the request with the engine and writes the new claims before the lock is
released.  A second process placing at the same time waits for the lock and then sees
the first one's claims: capacity cannot be promised twice.

A claim counts against its offer

* while it is ``claimed`` (no node yet) and its reservation has not expired, and
* once ``bound`` to a node, only while the provider's view of capacity may not include
  that node yet: bound after the caller took its snapshot of the offers.

Claims end as ``released`` (not used, or the node is gone) or ``failed`` (the cloud
refused the node: the offer is then recorded as recently failed).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core.errors import ConflictError, NotFoundError
from ..core.store import Store, dumps, loads
from ..offers import Choice, Explanation, Offer, Plan, Pool, Request
from .engine import Engine, PlacementError, deplete
from .settings import Placement

AREA = "placement"

MIGRATIONS = [
    """
    CREATE TABLE placement_reservations (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL DEFAULT '',
        user TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT 'local',
        state TEXT NOT NULL,
        requests TEXT NOT NULL DEFAULT '[]',
        explanation TEXT NOT NULL DEFAULT '[]',
        price_per_hour REAL NOT NULL DEFAULT 0,
        currency TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        expires_at REAL
    );
    CREATE INDEX placement_reservations_cluster ON placement_reservations(cluster, created_at);
    CREATE TABLE placement_claims (
        reservation_id TEXT NOT NULL
            REFERENCES placement_reservations(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        node_type TEXT NOT NULL DEFAULT '',
        offer_key TEXT NOT NULL,
        pool TEXT,
        consumption TEXT NOT NULL,
        provider TEXT NOT NULL DEFAULT '',
        availability_zone TEXT NOT NULL DEFAULT '',
        flavor TEXT NOT NULL DEFAULT '',
        price_per_hour REAL NOT NULL DEFAULT 0,
        currency TEXT NOT NULL DEFAULT '',
        cost REAL NOT NULL DEFAULT 0,
        node_config TEXT NOT NULL DEFAULT '{}',
        alternates TEXT NOT NULL DEFAULT '[]',
        state TEXT NOT NULL,
        cluster TEXT NOT NULL DEFAULT '',
        node_id TEXT,
        reason TEXT,
        created_at REAL NOT NULL,
        bound_at REAL,
        ended_at REAL,
        PRIMARY KEY (reservation_id, idx)
    );
    CREATE INDEX placement_claims_state ON placement_claims(state, offer_key);
    CREATE INDEX placement_claims_node ON placement_claims(cluster, node_id);
    CREATE TABLE placement_failures (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        offer_key TEXT NOT NULL,
        ts REAL NOT NULL,
        code TEXT,
        message TEXT,
        cluster TEXT
    );
    CREATE INDEX placement_failures_key ON placement_failures(offer_key, ts);
    CREATE TABLE placement_remote (
        reservation_id TEXT NOT NULL
            REFERENCES placement_reservations(id) ON DELETE CASCADE,
        zone TEXT NOT NULL,
        remote_id TEXT NOT NULL,
        count INTEGER NOT NULL,
        price_per_hour REAL NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        PRIMARY KEY (reservation_id, zone, remote_id)
    );
    CREATE TABLE placement_zones (
        name TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        "offset" REAL NOT NULL DEFAULT 0,
        scale REAL NOT NULL DEFAULT 1,
        state TEXT NOT NULL DEFAULT 'unknown',
        failures INTEGER NOT NULL DEFAULT 0,
        last_ok REAL,
        last_error TEXT,
        retry_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE placement_used_hints (
        hint_id TEXT PRIMARY KEY,
        reservation_id TEXT,
        used_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
]

ACTIVE = "active"
CLAIMED, BOUND, RELEASED, FAILED = "claimed", "bound", "released", "failed"


@dataclass
class Claim:
    index: int
    node_type: str
    offer: str
    provider: str
    availability_zone: str
    flavor: str
    price_per_hour: float
    currency: str
    cost: float
    state: str
    node_id: str | None = None
    alternates: list[str] = field(default_factory=list)
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def public(self) -> dict[str, Any]:
        """What a parent zone may see of a claim made at its request."""
        return {"index": self.index, "node_type": self.node_type,
                "price_per_hour": self.price_per_hour, "currency": self.currency,
                "state": self.state}


@dataclass
class Reservation:
    id: str
    cluster: str
    user: str
    source: str
    state: str
    created_at: float
    expires_at: float | None
    price_per_hour: float
    currency: str
    claims: list[Claim] = field(default_factory=list)
    remote: list[dict[str, Any]] = field(default_factory=list)
    explanation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def instances(self) -> int:
        return sum(1 for c in self.claims if c.state in (CLAIMED, BOUND)) + sum(
            r["count"] for r in self.remote if r["state"] == ACTIVE)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["claims"] = [c.to_dict() for c in self.claims]
        d["instances"] = self.instances
        return d


class Reservations:
    """Places requests and holds the result as claims in the store (area ``placement``)."""

    def __init__(self, store: Store, settings: Placement | None = None,
                 engine: Engine | None = None) -> None:
        self.store = store
        self.settings = settings or Placement()
        self.engine = engine or Engine(self.settings)
        store.ensure_schema(AREA, MIGRATIONS)

    # placing ---------------------------------------------------------------------------
    def reserve(
        self,
        offers: list[Offer],
        requests: list[Request],
        pools: dict[str, Pool] | None = None,
        *,
        cluster: str = "",
        user: str = "",
        snapshot_at: float | None = None,
        reservation_id: str | None = None,
        source: str = "local",
        ttl: float | None = None,
        exact: dict[str, int] | None = None,
    ) -> Reservation:
        """Place ``requests`` (all or nothing) and claim the result atomically.

        ``snapshot_at`` is when the offers were read from the provider (default: now, for
        offers that do not change by themselves).  ``reservation_id`` adds the claims to
        an existing active reservation (failover, repairs).  ``exact`` places on exactly
        these offer keys (a sealed hint from ``select``), refusing when they are full.
        """
        now = time.time()
        snapshot_at = now if snapshot_at is None else snapshot_at
        ttl = self.settings.reservation_ttl if ttl is None else ttl
        with self.store.transaction() as conn:
            self._expire(conn, now)
            offers, pools = self._available(conn, offers, pools or {}, snapshot_at, now)
            if exact is not None:
                plans = [self._exact_plan(offers, pools, requests, exact)]
            else:
                plans = self.engine.place_all(offers, requests, pools)
            rid = reservation_id or uuid.uuid4().hex[:12]
            if reservation_id:
                row = conn.execute("SELECT state FROM placement_reservations WHERE id = ?",
                                   (rid,)).fetchone()
                if row is None or row[0] != ACTIVE:
                    raise ConflictError(f"reservation {rid} is not active", field="reservation")
                start = conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM placement_claims"
                                     " WHERE reservation_id = ?", (rid,)).fetchone()[0]
                conn.execute("UPDATE placement_reservations SET updated_at = ?, expires_at = ?"
                             " WHERE id = ?", (now, now + ttl, rid))
            else:
                start = 0
                conn.execute(
                    "INSERT INTO placement_reservations (id, cluster, user, source, state,"
                    " requests, explanation, created_at, updated_at, expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rid, cluster, user, source, ACTIVE,
                     dumps([r.to_dict() for r in requests]),
                     dumps([p.explanation.to_dict() for p in plans]), now, now, now + ttl))
            idx = start
            for plan in plans:
                for choice in plan.choices:
                    o = plan.offers[choice.offer]
                    conn.execute(
                        "INSERT INTO placement_claims (reservation_id, idx, node_type,"
                        " offer_key, pool, consumption, provider, availability_zone, flavor,"
                        " price_per_hour, currency, cost, node_config, alternates, state,"
                        " cluster, created_at) VALUES"
                        " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (rid, idx, plan.request.node_type, o.key, o.pool,
                         dumps(o.consumption(plan.request)), o.provider,
                         o.availability_zone, o.flavor, o.price_per_hour, o.currency,
                         choice.cost, dumps(o.node_config), dumps(choice.alternates),
                         CLAIMED, cluster, now))
                    idx += 1
            self._reprice(conn, rid)
        return self.get(rid)

    def _exact_plan(self, offers: list[Offer], pools: dict[str, Pool],
                    requests: list[Request], exact: dict[str, int]) -> Plan:
        """Place on exactly the given offers (a hint): capacity and filters still apply."""
        if len(requests) != 1:
            raise ConflictError("a hinted placement has exactly one request", field="hint")
        req = requests[0]
        by_key = {o.key: o for o in offers}
        choices, chosen = [], {}
        cur, cur_pools = offers, pools
        for key, n in exact.items():
            if key not in by_key:
                raise PlacementError(
                    "the hinted capacity is no longer offered here; select again",
                    request=req)
            sub = req.with_count(n)
            sub.availability_zones = None
            only = [o for o in cur if o.key == key]
            try:
                plan = self.engine.place(only, sub, cur_pools, improve=False)
            except PlacementError as e:
                raise PlacementError(
                    f"the hinted capacity is no longer free: {e.explanation.text()}; select "
                    "again", request=req, explanation=e.explanation) from None
            for c in plan.choices:
                choices.append(Choice(len(choices), c.offer, c.cost, []))
            chosen.update(plan.offers)
            cur, cur_pools = deplete(cur, cur_pools, plan)

        expl = Explanation(offers=len(offers), candidates=len(exact),
                           placed=len(choices), wanted=len(choices))
        return Plan(request=req.with_count(len(choices)), choices=choices,
                    explanation=expl, offers=chosen)

    def create(self, cluster: str = "", user: str = "", source: str = "local",
               ttl: float | None = None) -> str:
        """An empty active reservation (parts are added by ``reserve`` / ``add_remote``)."""
        now = time.time()
        ttl = self.settings.reservation_ttl if ttl is None else ttl
        rid = uuid.uuid4().hex[:12]
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO placement_reservations (id, cluster, user, source, state,"
                " created_at, updated_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rid, cluster, user, source, ACTIVE, now, now, now + ttl))
        return rid

    def available(self, offers: list[Offer], pools: dict[str, Pool] | None = None,
                  snapshot_at: float | None = None) -> tuple[list[Offer], dict[str, Pool]]:
        """Offers and pools minus what claims hold (a read for estimates: ``select``)."""
        now = time.time()
        return self._available(self.store, offers, pools or {},
                               now if snapshot_at is None else snapshot_at, now)

    # capacity that claims still hold ----------------------------------------------------
    def _available(self, conn, offers: list[Offer], pools: dict[str, Pool],
                   snapshot_at: float, now: float) -> tuple[list[Offer], dict[str, Pool]]:
        rows = conn.execute(
            "SELECT c.offer_key, c.pool, c.consumption FROM placement_claims c"
            " JOIN placement_reservations r ON r.id = c.reservation_id"
            " WHERE (c.state = 'claimed' AND r.state = 'active')"
            " OR (c.state = 'bound' AND c.bound_at > ?)",
            (snapshot_at,)).fetchall()
        by_offer: dict[str, dict[str, float]] = {}
        by_pool: dict[str, dict[str, float]] = {}
        for key, pool, cons_text in rows:
            cons = loads(cons_text, {})
            acc = by_offer.setdefault(key, {})
            for d, v in cons.items():
                acc[d] = acc.get(d, 0.0) + v
            if pool:
                pacc = by_pool.setdefault(pool, {})
                for d, v in cons.items():
                    pacc[d] = pacc.get(d, 0.0) + v
        failures = self._recent_failures(conn, now)
        out = []
        for o in offers:
            taken = by_offer.get(o.key)
            fails = failures.get(o.key, 0)
            if not taken and not fails:
                out.append(o)
                continue
            free = dict(o.free)
            for d, v in (taken or {}).items():
                if free.get(d) is not None:
                    free[d] = free[d] - v
            out.append(replace(o, free=free, recent_failures=o.recent_failures + fails))
        new_pools = {}
        for name, p in pools.items():
            taken = by_pool.get(name)
            if not taken:
                new_pools[name] = p
                continue
            free = dict(p.free)
            for d, v in taken.items():
                if free.get(d) is not None:
                    free[d] = free[d] - v
            new_pools[name] = replace(p, free=free)
        return out, new_pools

    def _expire(self, conn, now: float) -> None:
        expired = [r[0] for r in conn.execute(
            "SELECT id FROM placement_reservations WHERE state = 'active' AND expires_at < ?",
            (now,)).fetchall()]
        for rid in expired:
            conn.execute("UPDATE placement_claims SET state = 'released', ended_at = ?,"
                         " reason = 'reservation expired' WHERE reservation_id = ?"
                         " AND state = 'claimed'", (now, rid))
            has_nodes = conn.execute("SELECT 1 FROM placement_claims WHERE reservation_id = ?"
                                     " AND state = 'bound' LIMIT 1", (rid,)).fetchone()
            conn.execute("UPDATE placement_reservations SET state = ?, updated_at = ?"
                         " WHERE id = ?", ("fulfilled" if has_nodes else "expired", now, rid))

    # failures --------------------------------------------------------------------------
    def _recent_failures(self, conn, now: float) -> dict[str, int]:
        rows = conn.execute("SELECT offer_key, COUNT(*) FROM placement_failures WHERE ts > ?"
                            " GROUP BY offer_key",
                            (now - self.settings.failure_window,)).fetchall()
        return {k: n for k, n in rows}

    def recent_failures(self) -> dict[str, int]:
        return self._recent_failures(self.store, time.time())

    def record_failure(self, offer_key: str, code: str | None, message: str,
                       cluster: str = "") -> None:
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO placement_failures (offer_key, ts, code, message,"
                         " cluster) VALUES (?, ?, ?, ?, ?)",
                         (offer_key, time.time(), code, message[:500], cluster))
            conn.execute("DELETE FROM placement_failures WHERE ts < ?",
                         (time.time() - 10 * self.settings.failure_window,))

    # life of claims -----------------------------------------------------------------------
    def bind(self, rid: str, pairs: list[tuple[int, str]]) -> None:
        """Claims ``idx`` now have nodes ``node_id`` (the provider created them)."""
        now = time.time()
        with self.store.transaction() as conn:
            for idx, node_id in pairs:
                conn.execute("UPDATE placement_claims SET state = 'bound', node_id = ?,"
                             " bound_at = ? WHERE reservation_id = ? AND idx = ?",
                             (node_id, now, rid, idx))
            conn.execute("UPDATE placement_reservations SET updated_at = ? WHERE id = ?",
                         (now, rid))

    def fail(self, rid: str, idxs: list[int], code: str | None, message: str) -> None:
        """The cloud refused these claims' nodes: end them and remember the offer."""
        now = time.time()
        with self.store.transaction() as conn:
            keys = set()
            cluster = ""
            for idx in idxs:
                row = conn.execute("SELECT offer_key, cluster FROM placement_claims"
                                   " WHERE reservation_id = ? AND idx = ?",
                                   (rid, idx)).fetchone()
                if row is None:
                    continue
                keys.add(row[0])
                cluster = row[1]
                conn.execute("UPDATE placement_claims SET state = 'failed', ended_at = ?,"
                             " reason = ? WHERE reservation_id = ? AND idx = ?",
                             (now, message[:500], rid, idx))
            for key in keys:
                conn.execute("INSERT INTO placement_failures (offer_key, ts, code, message,"
                             " cluster) VALUES (?, ?, ?, ?, ?)",
                             (key, now, code, message[:500], cluster))
            self._reprice(conn, rid)

    def finish(self, rid: str, reason: str = "not needed") -> Reservation:
        """The operation that held the reservation is over: unused claims are released."""
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute("UPDATE placement_claims SET state = 'released', ended_at = ?,"
                         " reason = ? WHERE reservation_id = ? AND state = 'claimed'",
                         (now, reason, rid))
            has_nodes = conn.execute("SELECT 1 FROM placement_claims WHERE reservation_id = ?"
                                     " AND state = 'bound' LIMIT 1", (rid,)).fetchone()
            remote = conn.execute("SELECT 1 FROM placement_remote WHERE reservation_id = ?"
                                  " AND state = 'active' LIMIT 1", (rid,)).fetchone()
            conn.execute("UPDATE placement_reservations SET state = ?, updated_at = ?"
                         " WHERE id = ? AND state = 'active'",
                         ("fulfilled" if has_nodes or remote else "released", now, rid))
            self._reprice(conn, rid)
        return self.get(rid)

    def release(self, rid: str, reason: str = "released") -> Reservation:
        """Give everything back: unused claims and the claims of nodes that are gone."""
        self.get(rid)
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute("UPDATE placement_claims SET state = 'released', ended_at = ?,"
                         " reason = ? WHERE reservation_id = ? AND state IN ('claimed',"
                         " 'bound')", (now, reason, rid))
            conn.execute("UPDATE placement_remote SET state = 'released'"
                         " WHERE reservation_id = ?", (rid,))
            conn.execute("UPDATE placement_reservations SET state = 'released',"
                         " updated_at = ? WHERE id = ?", (now, rid))
            self._reprice(conn, rid)
        return self.get(rid)

    def release_nodes(self, cluster: str, node_ids: list[str] | None = None,
                      reason: str = "node stopped") -> None:
        """Nodes are gone (down, scale in, replaced): their claims end."""
        now = time.time()
        with self.store.transaction() as conn:
            if node_ids is None:
                conn.execute("UPDATE placement_claims SET state = 'released', ended_at = ?,"
                             " reason = ? WHERE cluster = ? AND state IN ('claimed', 'bound')",
                             (now, reason, cluster))
                conn.execute("UPDATE placement_reservations SET state = 'released',"
                             " updated_at = ? WHERE cluster = ? AND state IN ('active',"
                             " 'fulfilled')", (now, cluster))
            else:
                for n in node_ids:
                    conn.execute("UPDATE placement_claims SET state = 'released',"
                                 " ended_at = ?, reason = ? WHERE cluster = ? AND node_id = ?"
                                 " AND state = 'bound'", (now, reason, cluster, n))

    def add_remote(self, rid: str, zone: str, remote_id: str, count: int,
                   price_per_hour: float) -> None:
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO placement_remote (reservation_id, zone, remote_id, count,"
                         " price_per_hour, state) VALUES (?, ?, ?, ?, ?, 'active')",
                         (rid, zone, remote_id, count, price_per_hour))
            self._reprice(conn, rid)

    def _reprice(self, conn, rid: str) -> None:
        row = conn.execute(
            "SELECT COALESCE(SUM(price_per_hour), 0), MAX(currency) FROM placement_claims"
            " WHERE reservation_id = ? AND state IN ('claimed', 'bound')", (rid,)).fetchone()
        remote = conn.execute(
            "SELECT COALESCE(SUM(price_per_hour), 0) FROM placement_remote"
            " WHERE reservation_id = ? AND state = 'active'", (rid,)).fetchone()[0]
        conn.execute("UPDATE placement_reservations SET price_per_hour = ?,"
                     " currency = COALESCE(?, currency) WHERE id = ?",
                     (row[0] + remote, row[1], rid))

    # reading ---------------------------------------------------------------------------------
    def get(self, rid: str) -> Reservation:
        row = self.store.query_one("SELECT * FROM placement_reservations WHERE id = ?", (rid,))
        if row is None:
            raise NotFoundError(f"no reservation with id '{rid}'", field="reservation_id",
                                value=rid)
        self._expire_if_due(row)
        row = self.store.query_one("SELECT * FROM placement_reservations WHERE id = ?", (rid,))
        claims = [
            Claim(index=c["idx"], node_type=c["node_type"], offer=c["offer_key"],
                  provider=c["provider"], availability_zone=c["availability_zone"],
                  flavor=c["flavor"], price_per_hour=c["price_per_hour"],
                  currency=c["currency"], cost=c["cost"], state=c["state"],
                  node_id=c["node_id"], alternates=loads(c["alternates"], []),
                  reason=c["reason"])
            for c in self.store.query("SELECT * FROM placement_claims WHERE reservation_id = ?"
                                      " ORDER BY idx", (rid,))
        ]
        remote = [dict(r) for r in self.store.query(
            "SELECT zone, remote_id, count, price_per_hour, state FROM placement_remote"
            " WHERE reservation_id = ? ORDER BY zone", (rid,))]
        return Reservation(
            id=row["id"], cluster=row["cluster"], user=row["user"], source=row["source"],
            state=row["state"], created_at=row["created_at"], expires_at=row["expires_at"],
            price_per_hour=row["price_per_hour"], currency=row["currency"], claims=claims,
            remote=remote, explanation=loads(row["explanation"], []))

    def _expire_if_due(self, row) -> None:
        if row["state"] == ACTIVE and row["expires_at"] and row["expires_at"] < time.time():
            with self.store.transaction() as conn:
                self._expire(conn, time.time())

    def list(self, cluster: str | None = None, limit: int = 50) -> list[Reservation]:
        sql = "SELECT id FROM placement_reservations"
        params: list[Any] = []
        if cluster is not None:
            sql += " WHERE cluster = ?"
            params.append(cluster)
        sql += " ORDER BY created_at DESC LIMIT ?"
        params.append(limit)
        return [self.get(r[0]) for r in self.store.query(sql, params)]

    def unbound(self, rid: str, node_type: str) -> list[dict[str, Any]]:
        """Claims of ``node_type`` still waiting for their node, cheapest first."""
        return [
            {"index": r["idx"], "offer": r["offer_key"],
             "node_config": loads(r["node_config"], {}),
             "alternates": loads(r["alternates"], [])}
            for r in self.store.query(
                "SELECT c.* FROM placement_claims c JOIN placement_reservations r"
                " ON r.id = c.reservation_id WHERE c.reservation_id = ? AND c.node_type = ?"
                " AND c.state = 'claimed' AND r.state = 'active' ORDER BY c.cost, c.idx",
                (rid, node_type))
        ]

    def node_placement(self, cluster: str, node_id: str) -> dict[str, Any] | None:
        row = self.store.query_one(
            "SELECT * FROM placement_claims WHERE cluster = ? AND node_id = ?"
            " ORDER BY bound_at DESC LIMIT 1", (cluster, node_id))
        if row is None:
            return None
        return {"reservation_id": row["reservation_id"], "provider": row["provider"],
                "availability_zone": row["availability_zone"], "flavor": row["flavor"],
                "price_per_hour": row["price_per_hour"], "currency": row["currency"],
                "offer": row["offer_key"]}

    def cluster_summary(self, cluster: str) -> dict[str, Any] | None:
        """The cluster's latest reservation and what its nodes cost per hour now."""
        last = self.store.query_one(
            "SELECT id, state, price_per_hour, currency FROM placement_reservations"
            " WHERE cluster = ? ORDER BY created_at DESC LIMIT 1", (cluster,))
        if last is None:
            return None
        row = self.store.query_one(
            "SELECT COALESCE(SUM(price_per_hour), 0), COUNT(*), MAX(currency)"
            " FROM placement_claims WHERE cluster = ? AND state = 'bound'", (cluster,))
        return {"reservation_id": last["id"], "reservation_state": last["state"],
                "cost_per_hour": round(row[0], 6), "priced_nodes": row[1],
                "currency": row[2] or last["currency"] or ""}
