"""The create journal of the huaweicloud node provider (a mixin of
``HuaweiCloudNodeProvider``, nodes.py).

Listings lag behind creates, so a process killed mid-``up`` must not leave the next ``up``
to find its servers by listing alone: every create is written to the ``huaweicloud_creates``
table of the state store *before* it is sent, with its client token and what it asked for,
and its job and server ids once answered; ``_recover`` finds or re-sends what a killed run
left (ECS "Idempotent Requests": the same token and body give the original servers)."""

from __future__ import annotations

import logging
import time
from typing import Any

from ...core.errors import ProviderError
from ...core.store import dumps, loads
from .limits import ECS_TOKEN_EXPIRED, ECS_TOKEN_REUSED
from .servers import GONE

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

# "Idempotency identifiers are valid for 8 hours" (Ecs.0124 after): the ECS API reference,
# "Idempotent Requests", https://support.huaweicloud.com/api-ecs/zh-cn_topic_0000001105258814.html
TOKEN_TTL = 8 * 3600
# an entry older than this is not sent again (a listing has long caught up by then, and
# the token may be about to expire at the cloud)
REPLAY_WITHIN = TOKEN_TTL - 3600
JOURNAL_MIGRATIONS = [
    # 1: creates sent, before their answer: what a killed `up` leaves the next one to find
    """
    CREATE TABLE huaweicloud_creates (
        token TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        cluster TEXT NOT NULL,
        created_at REAL NOT NULL,
        request TEXT NOT NULL,
        job_id TEXT,
        server_ids TEXT
    )
    """,
]


class CreateJournal:
    """The journal of server creates (what a killed ``up`` leaves the next one to find);
    needs ``context``, ``clients``, ``workspace()``, ``cluster_name``, ``_own_tokens`` and
    ``_request`` of the node provider."""

    def _journal(self):
        store = self.context.store
        store.ensure_schema("huaweicloud", JOURNAL_MIGRATIONS)
        return store

    def _journal_add(self, token: str, args: dict[str, Any]) -> None:
        """Written before the create is sent: a kill after this line cannot lose it."""
        with self._journal().transaction() as conn:
            conn.execute("INSERT INTO huaweicloud_creates(token, workspace, cluster, "
                         "created_at, request) VALUES (?, ?, ?, ?, ?)",
                         (token, self.workspace()["name"], self.cluster_name, time.time(),
                          dumps(args)))
        self._own_tokens.add(token)

    def _journal_answer(self, token: str, job_id: str | None, ids: list[str]) -> None:
        with self._journal().transaction() as conn:
            conn.execute("UPDATE huaweicloud_creates SET job_id = ?, server_ids = ? "
                         "WHERE token = ?", (job_id, dumps(ids), token))

    def _journal_drop(self, tokens) -> None:
        tokens = list(tokens)
        if not tokens:
            return
        with self._journal().transaction() as conn:
            conn.executemany("DELETE FROM huaweicloud_creates WHERE token = ?",
                             [(t,) for t in tokens])
        self._own_tokens.difference_update(tokens)

    def _recover(self, listed: set[str]) -> list[Any]:
        """Servers other runs created that the listing does not show yet.

        For each journal entry of this cluster not made by this provider: an entry never
        answered (its process died with the create in flight) is sent again with its token
        and body, and the cloud answers with the servers it made for it (or makes them
        now: exactly once either way); recorded ids the listing lacks are asked for one by
        one (``show_server`` knows a server at once).  An entry goes once the listing shows
        all its servers, or they are gone."""
        from huaweicloudsdkecs.v2 import ShowServerRequest

        rows = self._journal().query(
            "SELECT * FROM huaweicloud_creates WHERE workspace = ? AND cluster = ?",
            (self.workspace()["name"], self.cluster_name))
        found: list[Any] = []
        done: list[str] = []
        for row in rows:
            token = row["token"]
            if token in self._own_tokens:
                continue
            ids = loads(row["server_ids"])
            if ids is None:
                if time.time() - row["created_at"] > REPLAY_WITHIN:
                    done.append(token)
                    continue
                args = loads(row["request"])
                what = (f"send again the create of {args['count']} server(s) an interrupted "
                        "run sent (the same client token returns the same servers)")
                try:
                    resp = self.clients.call("ecs", "create_post_paid_servers", self._request(
                        args["node_config"], dict(args["tags"]), args["count"],
                        args["user_data"], token=token), what=what)
                except ProviderError as e:
                    if 400 <= (e.details.get("status") or 500) < 500:
                        log.warning("huaweicloud: %s: refused (%s); %s", what, e.message,
                                    "servers it made show in listings once they catch up"
                                    if e.details.get("code") in (ECS_TOKEN_REUSED,
                                                                 ECS_TOKEN_EXPIRED)
                                    else "nothing was created")
                        done.append(token)
                    continue  # 5xx: the cloud could not say; ask again next time
                ids = list(resp.server_ids or [])
                log.info("huaweicloud: an interrupted run's create of %d server(s) "
                         "answered again: %s", len(ids), ", ".join(ids))
                self._journal_answer(token, resp.job_id, ids)
            pending = [i for i in ids if i not in listed]
            for sid in pending:
                got = self.clients.call("ecs", "show_server", ShowServerRequest(
                    server_id=sid), missing_ok=True, what="look up a server an interrupted "
                    "run created")
                if got is not None and got.server.status not in GONE:
                    found.append(got.server)
            if not any(s.id in pending for s in found):
                done.append(token)  # listed, or gone: the journal has nothing more to add
        self._journal_drop(done)
        return found
