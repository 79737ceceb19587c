"""Nested zones: ask child zones where a request would go, then boot where chosen.

A zone is an installation of jupyter_cloudtik with its own offers (its providers, a
catalog) and, optionally, child zones it can reach over HTTP.  Placing across zones takes
two steps, as in the seed:

``select`` (estimate only, nothing is created)
    The zone weighs its own offers and asks every healthy child
    (``POST {child}/cloudtik/api/zones/select``) at the same time.  Each option carries a
    weight, a count and a price, and a *hint*: the zone's internal choice (offer key, or
    which grandchild and its hint) sealed with the zone's own key (Fernet: AES-CBC +
    HMAC, with a timestamp, so hints expire).  The zone re-seals its children's hints
    inside its own, applies each child's ``offset + scale x weight`` and merges.  A parent
    therefore never learns a child's host names or offer keys, only weights and prices.

``boot``
    The caller sends the chosen hints back to the zone that issued them.  The zone opens
    each one (refusing an altered, expired, already used or foreign hint with a clear
    error), places exactly there as claims under a reservation id, or forwards the inner
    hint to the grandchild it names.  Then the zone's own core creates the instances on
    its claims through its own providers (``zone_nodes_class``; the parent's
    ``node_config`` goes with the request), so the nodes exist before ``boot`` answers.
    All parts succeed or every part is released and every node made so far ends.

``servers``
    The nodes of a reservation and their states, across zones: this zone's own and, for
    each part booted in a child, what that child reports (``GET
    {child}/cloudtik/api/servers?reservation_id=``, the seed's ``GET /servers``).  A
    grandchild's nodes are reported under the child that booted them: a parent learns
    node ids and states, never the layout below its children.

A child that does not answer within ``zone_timeout`` is skipped and backs off (30 s,
doubling); while it recovers its options carry a weight penalty.  A zone gives its own
children less time than its caller gives it (``budget``), so a slow grandchild is skipped
one level down instead of timing out the whole subtree.  Keys are per zone:
``<state_dir>/zone.key`` (0600, newest first; ``rotate`` adds a key, old hints still open
until ``retire``), ``$CLOUDTIK_ZONE_KEY`` or ``c.Placement.zone_key``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlparse

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from ..core.errors import CloudTikError, ConfigError, ConflictError, NotFoundError
from ..core.grants import policy_for
from ..core.secrets import SecretStore
from ..core.settings import CloudTik
from ..core.store import Store
from ..offers import OfferQuery, OfferSet, Request
from .catalog import zone_offers
from .engine import PlacementError
from .reservations import MIGRATIONS, Reservations
from .settings import ZONE_KEY_ENV, Placement

# the sources of reservations whose nodes the zone service created (and so ends)
BOOTED_SOURCES = ("zone", "boot")

KEY_FILE = "zone.key"
HINT_VERSION = 1
ZONE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_BACKOFF = 600.0
ZONE_PENALTY = 1.0  # weight added per recent failure of a child zone
API = "/cloudtik/api/zones"
SERVERS_API = "/cloudtik/api/servers"
BUDGET_SHARE = 0.7  # of its caller's wait a zone gives its own children


class HintRefused(CloudTikError):
    """A sealed hint cannot be used here (altered, foreign, expired, used, mismatched)."""

    http_status = 400
    reason = "hint_refused"


class ZoneUnreachable(CloudTikError):
    http_status = 502
    reason = "zone_unreachable"


# keys ----------------------------------------------------------------------------------------
class ZoneKeys:
    """This zone's sealing keys, newest first; only this zone can open its hints."""

    def __init__(self, state_dir: Path, configured: str = "") -> None:
        self.path = Path(state_dir) / KEY_FILE
        self.configured = configured

    def _keys(self) -> list[bytes]:
        text = self.configured or os.environ.get(ZONE_KEY_ENV, "")
        if text:
            return [k.strip().encode() for k in text.split(",") if k.strip()]
        if not self.path.exists():
            self._write([Fernet.generate_key()])
        mode = self.path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(f"zone_key: {self.path} is readable by others (mode {mode:o}); "
                              f"run `chmod 600 {self.path}`", field="zone_key")
        return [line.strip() for line in self.path.read_bytes().splitlines() if line.strip()]

    def _write(self, keys: list[bytes]) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\n".join(keys) + b"\n")
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def fernet(self) -> MultiFernet:
        try:
            return MultiFernet([Fernet(k) for k in self._keys()])
        except (ValueError, TypeError) as e:
            raise ConfigError("zone_key: not a valid Fernet key (32 url-safe base64-encoded "
                              "bytes)", field="zone_key") from e

    def rotate(self) -> int:
        """Seal new hints with a fresh key; hints sealed before still open.  Returns the
        number of keys kept."""
        if self.configured or os.environ.get(ZONE_KEY_ENV):
            raise ConfigError("zone_key: the keys come from the configuration; rotate them "
                              "there (newest first, comma-separated)", field="zone_key")
        keys = [Fernet.generate_key(), *self._keys()]
        self._write(keys)
        return len(keys)

    def retire(self, keep: int = 1) -> int:
        """Forget all but the newest ``keep`` keys: hints sealed with the others stop
        opening.  Do it once ``hint_ttl`` has passed since ``rotate``."""
        keys = self._keys()[:max(keep, 1)]
        self._write(keys)
        return len(keys)

    def seal(self, payload: dict[str, Any]) -> str:
        return self.fernet().encrypt(json.dumps(payload, sort_keys=True).encode()).decode()

    def open(self, token: str, ttl: float) -> dict[str, Any]:
        f = self.fernet()
        if not isinstance(token, str) or not token:
            raise HintRefused("hint: missing", field="hint")
        if not token.isascii():  # a Fernet token is base64; "\udcff" cannot even be encoded
            raise HintRefused("hint: not a hint this zone issued (hints are base64 text); "
                              "run select again", field="hint")
        try:
            data = f.decrypt(token.encode())
        except InvalidToken:
            raise HintRefused(
                "hint: not sealed by this zone, or altered on the way (each zone opens only "
                "the hints it issued); run select again", field="hint") from None
        age = time.time() - f.extract_timestamp(token.encode())
        if age > ttl:
            raise HintRefused(f"hint: expired {age - ttl:.0f}s ago (hints are valid for "
                              f"{ttl:.0f}s); run select again", field="hint")
        return json.loads(data)


# child zones -------------------------------------------------------------------------------
@dataclass
class ZoneInfo:
    name: str
    url: str
    offset: float
    scale: float
    state: str
    failures: int
    last_ok: float | None
    last_error: str | None
    retry_at: float | None
    has_token: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ZoneRegistry:
    """The child zones this zone asks, with the token it uses toward each (secret)."""

    def __init__(self, store: Store, settings: Placement | None = None) -> None:
        self.store = store
        self.settings = settings or Placement()
        store.ensure_schema("placement", MIGRATIONS)
        self.secrets = SecretStore(store)

    @staticmethod
    def _scope(name: str) -> str:
        return f"zone:{name}"

    def add(self, name: str, url: str, offset: float = 0.0, scale: float = 1.0,
            token: str | None = None, replace: bool = False) -> ZoneInfo:
        if not isinstance(name, str) or not ZONE_NAME.match(name):
            raise ConfigError(f"name: {name!r} is not a zone name (letters, digits, '_', '.', "
                              "'-'; up to 63 characters)", field="name", value=name)
        parsed = urlparse(url or "")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"url: {url!r} is not an http(s) URL of the child's server, "
                              "e.g. https://zone-b.example.org/", field="url", value=url)
        for fname, v in (("offset", offset), ("scale", scale)):
            if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
                raise ConfigError(f"{fname}: {v!r} is not a number", field=fname, value=v)
        if scale <= 0:
            raise ConfigError(f"scale: {scale} must be > 0 (it multiplies the child's "
                              "weights)", field="scale", value=scale)
        now = time.time()
        with self.store.transaction() as conn:
            exists = conn.execute("SELECT 1 FROM placement_zones WHERE name = ?",
                                  (name,)).fetchone()
            if exists and not replace:
                raise ConflictError(f"zone '{name}' exists; remove it first or use --replace",
                                    field="name", value=name)
            conn.execute(
                'INSERT INTO placement_zones (name, url, "offset", scale, state, failures,'
                " created_at, updated_at) VALUES (?, ?, ?, ?, 'unknown', 0, ?, ?)"
                ' ON CONFLICT(name) DO UPDATE SET url = excluded.url, "offset" ='
                " excluded.\"offset\", scale = excluded.scale, state = 'unknown', failures = 0,"
                " retry_at = NULL, updated_at = excluded.updated_at",
                (name, url.rstrip("/"), float(offset), float(scale), now, now))
        if token:
            self.secrets.put(self._scope(name), "token", token)
        elif replace:
            self.secrets.delete(self._scope(name))
        return self.get(name)

    def remove(self, name: str) -> None:
        self.get(name)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM placement_zones WHERE name = ?", (name,))
        self.secrets.delete(self._scope(name))

    def get(self, name: str) -> ZoneInfo:
        row = self.store.query_one("SELECT * FROM placement_zones WHERE name = ?", (name,))
        if row is None:
            known = ", ".join(z.name for z in self.list()) or "none"
            raise NotFoundError(f"no child zone named '{name}' (zones: {known})",
                                field="name", value=name)
        return self._info(row)

    def list(self) -> list[ZoneInfo]:
        return [self._info(r) for r in self.store.query(
            "SELECT * FROM placement_zones ORDER BY name")]

    def _info(self, row) -> ZoneInfo:
        return ZoneInfo(name=row["name"], url=row["url"], offset=row["offset"],
                        scale=row["scale"], state=row["state"], failures=row["failures"],
                        last_ok=row["last_ok"], last_error=row["last_error"],
                        retry_at=row["retry_at"],
                        has_token=self.secrets.has(self._scope(row["name"]), "token"))

    def token(self, name: str) -> str | None:
        if not self.secrets.has(self._scope(name), "token"):
            return None

        grant = policy_for(self.store).service("zone", name,
                                               "authenticate to a child zone we ask")
        return self.secrets.reveal(grant, "token")

    def mark_ok(self, name: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE placement_zones SET state = 'healthy', last_ok = ?,"
                         " failures = MAX(failures - 1, 0), retry_at = NULL, updated_at = ?"
                         " WHERE name = ?", (time.time(), time.time(), name))

    def mark_failed(self, name: str, error: str) -> float:
        """Back off: 30 s after the first failure, doubling, at most 10 minutes."""
        now = time.time()
        with self.store.transaction() as conn:
            row = conn.execute("SELECT failures FROM placement_zones WHERE name = ?",
                               (name,)).fetchone()
            failures = (row[0] if row else 0) + 1
            wait = min(self.settings.zone_retry * 2 ** (failures - 1), MAX_BACKOFF)
            conn.execute("UPDATE placement_zones SET state = 'unhealthy', failures = ?,"
                         " last_error = ?, retry_at = ?, updated_at = ? WHERE name = ?",
                         (failures, error[:300], now + wait, now, name))
        return wait


# the service -------------------------------------------------------------------------------
class ZoneNodeMaker(Protocol):
    """What creates a booted reservation's nodes (the zone's core, not placement):
    ``jupyter_cloudtik.clusters.zone_nodes.ZoneNodes`` unless configured otherwise."""

    def create(self, reservations: Reservations, rid: str, request: Request,
               node_config: dict[str, Any]) -> list[str]: ...

    def servers(self, reservations: Reservations, rid: str) -> list[dict[str, Any]]: ...

    def terminate(self, reservations: Reservations, rid: str) -> int: ...


class ZoneService:
    """What a zone answers: select, boot, release, servers (and what a local caller uses
    to place across its zones)."""

    def __init__(self, store: Store, settings: CloudTik | None = None,
                 placement: Placement | None = None, offer_source=None,
                 nodes: ZoneNodeMaker | None = None) -> None:
        self.store = store
        self.settings = settings or CloudTik(state_dir=str(store.state_dir))
        self.placement = placement or Placement(parent=self.settings)
        self.keys = ZoneKeys(store.state_dir, self.placement.zone_key)
        self.registry = ZoneRegistry(store, self.placement)
        self.reservations = Reservations(store, self.placement)
        self._offer_source = offer_source
        # the class comes from configuration (a string, like a ServerApp's
        # kernel_manager_class): placement names no layer above it in its imports
        self.nodes = nodes if nodes is not None else self.placement.zone_nodes_class(
            store, self.settings)

    @property
    def name(self) -> str:
        return self.placement.zone_name

    def offers(self, request: Request) -> OfferSet:
        if self._offer_source is not None:
            return self._offer_source(request)

        query = OfferQuery(cluster=request.cluster, user=request.user,
                           node_types={request.node_type: dict(request.resources)})
        return zone_offers(self.store, self.settings, self.placement, query)

    # select ------------------------------------------------------------------------------
    async def select(self, body: dict[str, Any]) -> dict[str, Any]:
        request, path = self._parse(body)
        # the caller waits at most ``budget`` seconds: ask children for less, so a slow
        # grandchild is skipped here instead of making this whole zone time out upstream
        timeout = self.placement.zone_timeout
        budget = body.get("budget")
        if isinstance(budget, int | float) and not isinstance(budget, bool) and budget > 0:
            timeout = min(timeout, budget * BUDGET_SHARE)
        local = await asyncio.to_thread(self._local_options, request)
        children = [z for z in self.registry.list()]
        now = time.time()
        asked, skipped = [], []
        for z in children:
            if z.state == "unhealthy" and z.retry_at and z.retry_at > now:
                skipped.append({"zone": z.name, "reason": f"not answering ({z.last_error}); "
                                f"next try in {z.retry_at - now:.0f}s"})
            else:
                asked.append(z)
        answers = await asyncio.gather(
            *(self._ask(z, "select", {"request": request.to_dict(), "budget": timeout,
                                      "path": [*path, self.name]}, timeout)
              for z in asked),
            return_exceptions=True)
        options = list(local)
        for z, answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                wait = await asyncio.to_thread(self.registry.mark_failed, z.name,
                                               _short(answer))
                skipped.append({"zone": z.name, "reason": f"{_short(answer)}; skipped for "
                                f"{wait:.0f}s"})
                continue
            await asyncio.to_thread(self.registry.mark_ok, z.name)
            penalty = ZONE_PENALTY * z.failures  # recovering: ranks lower for a while
            for opt in answer.get("options") or []:
                try:
                    weight = z.offset + z.scale * float(opt["weight"]) + penalty
                    count = int(opt["count"])
                    inner = str(opt["hint"])
                except (KeyError, TypeError, ValueError):
                    continue  # a malformed option from a child is not ours to trust
                options.append({
                    "weight": weight, "count": count,
                    "price_per_hour": float(opt.get("price_per_hour") or 0.0),
                    "currency": str(opt.get("currency") or ""),
                    "hint": self.keys.seal({"v": HINT_VERSION, "zone": self.name,
                                            "via": z.name, "inner": inner, "count": count,
                                            "req": request.digest(),
                                            "id": uuid.uuid4().hex}),
                })
        options.sort(key=lambda o: o["weight"])
        return {"zone": self.name, "count": request.count,
                "options": options[: max(self.placement.zone_options, 1) * (1 + len(asked))],
                "skipped": skipped}

    def _local_options(self, request: Request) -> list[dict[str, Any]]:
        snapshot = time.time()
        offer_set = self.offers(request)
        offers, pools = self.reservations.available(offer_set.offers, offer_set.pools,
                                                    snapshot)
        try:
            _filters, scorer, _expl, rooms = self.reservations.engine.prepare(
                offers, request, pools)
        except PlacementError:
            return []
        ranked = sorted((i for i, r in enumerate(rooms) if r >= 1),
                        key=lambda i: (scorer.first[i], i))[: self.placement.zone_options]
        out = []
        for i in ranked:
            o = scorer.cands[i]
            count = int(min(rooms[i], request.count))
            out.append({
                "weight": scorer.series_cost(i, count) / count, "count": count,
                "price_per_hour": o.price_per_hour, "currency": o.currency,
                "hint": self.keys.seal({"v": HINT_VERSION, "zone": self.name,
                                        "offer": o.key, "count": count,
                                        "req": request.digest(), "id": uuid.uuid4().hex}),
            })
        return out

    # boot ----------------------------------------------------------------------------------
    async def boot(self, body: dict[str, Any], source: str = "zone") -> dict[str, Any]:
        """Place exactly where the hints say, all parts or none."""
        request, _path = self._parse(body)
        node_config = body.get("node_config") or {}
        if not isinstance(node_config, dict):
            raise ConfigError("node_config: must be a JSON object (merged into each "
                              "node's provider config)", field="node_config")
        hints = body.get("hints")
        if not isinstance(hints, list) or not hints:
            raise ConfigError("hints: a non-empty list of {hint, count} from select",
                              field="hints")
        local: dict[str, int] = {}
        remote: list[tuple[str, str, int]] = []
        used: list[str] = []
        for k, h in enumerate(hints):
            if not isinstance(h, dict) or "hint" not in h:
                raise ConfigError(f"hints[{k}]: needs 'hint' (and 'count')",
                                  field=f"hints[{k}]")
            payload = self.keys.open(h["hint"], self.placement.hint_ttl)
            if payload.get("v") != HINT_VERSION or payload.get("zone") != self.name:
                raise HintRefused(f"hints[{k}]: issued for zone '{payload.get('zone')}', "
                                  f"this is zone '{self.name}'", field=f"hints[{k}]")
            if payload.get("req") != request.digest():
                raise HintRefused(f"hints[{k}]: issued for a different request (other "
                                  "resources or options); run select again",
                                  field=f"hints[{k}]")
            count = h.get("count", payload["count"])
            if isinstance(count, bool) or not isinstance(count, int) or not (
                    1 <= count <= payload["count"]):
                raise ConfigError(f"hints[{k}].count: {count!r} must be 1..{payload['count']}"
                                  " (what select offered)", field=f"hints[{k}].count")
            used.append(payload["id"])
            if "offer" in payload:
                local[payload["offer"]] = local.get(payload["offer"], 0) + count
            else:
                remote.append((payload["via"], payload["inner"], count))
        total = sum(local.values()) + sum(n for _z, _h, n in remote)
        if total != request.count:
            raise ConfigError(f"hints: they hold {total} instance(s), the request asks for "
                              f"{request.count}", field="hints")
        await asyncio.to_thread(self._use_hints, used)
        rid = await asyncio.to_thread(self.reservations.create, request.cluster,
                                      request.user, source)
        booted: list[tuple[str, str]] = []
        try:
            if local:
                snapshot = time.time()
                offer_set = await asyncio.to_thread(self.offers, request)
                await asyncio.to_thread(
                    self.reservations.reserve, offer_set.offers,
                    [request.with_count(sum(local.values()))], offer_set.pools,
                    cluster=request.cluster, user=request.user, snapshot_at=snapshot,
                    reservation_id=rid, exact=local)
                await asyncio.to_thread(self.nodes.create, self.reservations, rid, request,
                                        node_config)
            by_zone: dict[str, list[dict[str, Any]]] = {}
            for zone, inner, n in remote:
                by_zone.setdefault(zone, []).append({"hint": inner, "count": n})
            for zone, zone_hints in by_zone.items():
                n = sum(h["count"] for h in zone_hints)
                # creating nodes takes longer than an estimate: the child's own wait
                answer = await self._ask(self.registry.get(zone), "boot", {
                    "request": request.with_count(n).to_dict(), "hints": zone_hints,
                    "node_config": node_config}, self.placement.boot_timeout)
                booted.append((zone, answer["reservation_id"]))
                await asyncio.to_thread(self.reservations.add_remote, rid, zone,
                                        answer["reservation_id"], n,
                                        float(answer.get("price_per_hour") or 0.0))
        except BaseException:
            await asyncio.to_thread(self.nodes.terminate, self.reservations, rid)
            await asyncio.to_thread(self.reservations.release, rid, "boot failed")
            for zone, remote_id in booted:
                try:
                    await self._ask(self.registry.get(zone), "release",
                                    {"reservation_id": remote_id})
                except Exception:
                    pass  # it expires on its own
            raise
        res = await asyncio.to_thread(self.reservations.get, rid)
        return {"zone": self.name, "reservation_id": rid, "instances": res.instances,
                "price_per_hour": res.price_per_hour, "currency": res.currency}

    def _use_hints(self, ids: list[str]) -> None:
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM placement_used_hints WHERE expires_at < ?", (now,))
            for hid in ids:
                if conn.execute("SELECT 1 FROM placement_used_hints WHERE hint_id = ?",
                                (hid,)).fetchone():
                    raise HintRefused("hint: already used for a boot; run select again",
                                      field="hint")
                conn.execute("INSERT INTO placement_used_hints (hint_id, used_at, expires_at)"
                             " VALUES (?, ?, ?)", (hid, now, now + self.placement.hint_ttl))

    async def release(self, body: dict[str, Any]) -> dict[str, Any]:
        rid = body.get("reservation_id") if isinstance(body, dict) else None
        if not isinstance(rid, str) or not rid:
            raise ConfigError("reservation_id: missing", field="reservation_id")
        res = await asyncio.to_thread(self.reservations.get, rid)
        if res.source != "zone":
            raise NotFoundError(f"no reservation with id '{rid}'", field="reservation_id")
        return await self.release_booted(rid, "released by parent")

    async def release_booted(self, rid: str, reason: str = "released") -> dict[str, Any]:
        """End a booted reservation everywhere: its nodes here, its parts in children,
        then its claims."""
        res = await asyncio.to_thread(self.reservations.get, rid)
        if res.source in BOOTED_SOURCES:
            await asyncio.to_thread(self.nodes.terminate, self.reservations, rid)
        for part in res.remote:
            if part["state"] == "active":
                try:
                    await self._ask(self.registry.get(part["zone"]), "release",
                                    {"reservation_id": part["remote_id"]})
                except Exception:
                    pass
        res = await asyncio.to_thread(self.reservations.release, rid, reason)
        return {"zone": self.name, "reservation_id": rid, "state": res.state}

    async def servers(self, rid: str, public: bool = True) -> dict[str, Any]:
        """The nodes of reservation ``rid`` and their states, here and in the children
        it was booted in (asked at the same time).  A child that does not answer is
        listed with its count and ``state: "unknown"`` and the reason."""
        if not isinstance(rid, str) or not rid:
            raise ConfigError("reservation_id: missing", field="reservation_id")
        res = await asyncio.to_thread(self.reservations.get, rid)
        if public and res.source != "zone":
            raise NotFoundError(f"no reservation with id '{rid}'", field="reservation_id")
        own = await asyncio.to_thread(self.nodes.servers, self.reservations, rid)
        servers = [{"zone": self.name, **s} for s in own]
        parts = [p for p in res.remote if p["state"] == "active"]
        answers = await asyncio.gather(
            *(self._ask(self.registry.get(p["zone"]), "servers",
                        {"reservation_id": p["remote_id"]}) for p in parts),
            return_exceptions=True)
        unreachable = []
        for part, answer in zip(parts, answers, strict=True):
            if isinstance(answer, BaseException):
                unreachable.append({"zone": part["zone"], "count": part["count"],
                                    "reason": _short(answer)})
                servers.extend({"zone": part["zone"], "index": None, "node_type": "",
                                "node_id": None, "state": "unknown"}
                               for _ in range(part["count"]))
                continue
            # a grandchild's nodes are the child's to name: the layout below stays sealed
            servers.extend({**s, "zone": part["zone"]} for s in answer.get("servers") or [])
        return {"zone": self.name, "reservation_id": rid, "state": res.state,
                "servers": servers, "unreachable": unreachable}

    async def place(self, request: Request, cluster: str = "", user: str = "",
                    node_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Select across this zone and its children, take the cheapest options that hold
        the whole request, and boot them (the local caller's entry point)."""
        body = {"request": request.to_dict()}
        sel = await self.select(body)
        chosen, left = [], request.count
        for opt in sel["options"]:
            if left <= 0:
                break
            n = min(opt["count"], left)
            chosen.append({"hint": opt["hint"], "count": n})
            left -= n
        if left > 0:
            skipped = "; ".join(f"{s['zone']}: {s['reason']}" for s in sel["skipped"])
            raise PlacementError(
                f"cannot place {request.describe()} across zones: the options hold "
                f"{request.count - left}" + (f" (skipped {skipped})" if skipped else ""),
                request=request)
        return await self.boot({"request": request.to_dict(), "hints": chosen,
                                "node_config": node_config or {}}, source="boot")

    # plumbing -------------------------------------------------------------------------------
    def _parse(self, body: Any) -> tuple[Request, list[str]]:
        if not isinstance(body, dict):
            raise ConfigError("body: must be a JSON object", field="body")
        path = body.get("path") or []
        if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
            raise ConfigError("path: must be a list of zone names", field="path")
        if self.name in path:
            raise ConflictError(f"zone loop: '{self.name}' was already asked "
                                f"({' -> '.join([*path, self.name])})", field="path")
        return Request.from_dict(body.get("request")), path

    async def _ask(self, zone: ZoneInfo, action: str, body: dict[str, Any],
                   timeout: float | None = None) -> dict[str, Any]:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

        headers = {"Content-Type": "application/json"}
        token = await asyncio.to_thread(self.registry.token, zone.name)
        if token:
            headers["Authorization"] = f"token {token}"
        if action == "servers":  # the seed's GET /servers?reservation_id=
            url = f"{zone.url}{SERVERS_API}?{urlencode(body)}"
            req = HTTPRequest(url, method="GET", headers=headers,
                              connect_timeout=timeout or self.placement.zone_timeout,
                              request_timeout=timeout or self.placement.zone_timeout)
        else:
            req = HTTPRequest(f"{zone.url}{API}/{action}", method="POST",
                              body=json.dumps(body), headers=headers,
                              connect_timeout=timeout or self.placement.zone_timeout,
                              request_timeout=timeout or self.placement.zone_timeout)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            message = _error_message(e)
            if e.code == 599:
                raise ZoneUnreachable(f"zone '{zone.name}': {message}") from None
            err = CloudTikError(f"zone '{zone.name}' refused {action}: {message}")
            err.http_status = e.code
            raise err from None
        except OSError as e:
            raise ZoneUnreachable(f"zone '{zone.name}': {e.strerror or e}") from None
        try:
            return json.loads(resp.body)
        except ValueError:
            raise ZoneUnreachable(f"zone '{zone.name}': answered {action} with something "
                                  "that is not JSON") from None


def _error_message(e) -> str:
    if e.response is not None and e.response.body:
        try:
            return json.loads(e.response.body).get("message") or str(e)
        except ValueError:
            pass
    if e.code == 599:
        return "timed out or unreachable" if "Timeout" in str(e) else str(e)
    return str(e)


def _short(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e) or type(e).__name__
    return text[:200]


def same_token(given: str | None, expected: list[str]) -> bool:
    """Constant-time check of a bearer token against the accepted ones."""
    if not given:
        return False
    return any(hmac.compare_digest(given.encode(), t.encode()) for t in expected if t)
