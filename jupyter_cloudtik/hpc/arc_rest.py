"""The A-REX REST client of the ``arc`` backend: the connection (TCP connect and TLS
handshake with their own short limit), one REST version's calls with the CE's own error
words (``ArcHTTPError``), and what the CE's answers mean (its states in ours, bulk answers
by id, job info, the GLUE2 limits)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from typing import Any

from ..core.errors import BackendUnavailable, ConfigError
from .base import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, UNKNOWN, JobStatus, Limits

# The REST states and what A-REX means by them: A-REX's own table (REST state ← grid
# manager state) in ARC1ClusterInfo.pm (nordugrid-arc-arex 6.17, /usr/share/arc/), and
# https://www.nordugrid.org/arc/arc7/tech/rest/rest.html ("Job states"; our reading):
# ACCEPTING ← ACCEPTED, ACCEPTED ← PENDING:ACCEPTED, PREPARING ← PREPARING, PREPARED ←
# PENDING:PREPARING (held: the CE runs as many jobs as arc.conf's maxjobs allows),
# SUBMITTING ← SUBMIT, QUEUING/RUNNING/HELD/EXITINGLRMS/OTHER ← INLRMS as the LRMS says
# (EXITINGLRMS: the LRMS is done, A-REX has not noticed yet), EXECUTED ← PENDING:INLRMS,
# FINISHING ← FINISHING, KILLING ← CANCELING (a kill, 40-60 s on a real CE, and also a job
# that failed in the LRMS on its way to FAILED: not final), FINISHED/FAILED/KILLED ←
# FINISHED without errors / with errors / cancelled, WIPED ← DELETED.
QUEUED_STATES = {"ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING",
                 "HELD", "OTHER"}
RUNNING_STATES = {"RUNNING", "EXITINGLRMS", "EXECUTED", "FINISHING"}
# on their way to an end that is not known yet (KILLED, or FAILED for a failed job)
ENDING_STATES = {"KILLING", "CANCELING"}
# before these the CE waits for the client's uploads; a retry may finish them
UPLOAD_STATES = {"ACCEPTING", "ACCEPTED", "PREPARING"}
CONNECT_TIMEOUT = 5.0  # TCP connect + TLS handshake; a CE that accepts and stays silent


def common_state(native: str) -> str:
    native = (native or "").upper()
    if native in QUEUED_STATES:
        return QUEUED
    if native in RUNNING_STATES:
        return RUNNING
    if native == "FINISHED":
        return SUCCEEDED
    if native in ("FAILED", "WIPED"):
        return FAILED
    if native == "KILLED":
        return CANCELLED
    if native in ENDING_STATES:  # not final: a failed job passes here on its way to FAILED
        return RUNNING
    return UNKNOWN


class ArcHTTPError(Exception):
    """An answer of the CE that is not a success: status, reason phrase and body."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(status, reason, body)
        self.status, self.reason, self.body = status, reason or "", body or ""

    @property
    def message(self) -> str:
        """The CE's own words: the reason phrase (A-REX puts its error there), else the
        body's message."""
        text = _text(self.body)
        reason = self.reason.strip()
        generic = {"", "ok", "bad request", "internal server error", "not found",
                   "forbidden", "unauthorized", "created"}
        if reason.lower() not in generic:
            return reason if not text or text in reason else f"{reason}: {text}"
        return text or reason or f"HTTP {self.status}"


class _Connection(http.client.HTTPConnection):
    """HTTP(S) to the CE whose opening (TCP connect, then the TLS handshake) has its own
    short limit: a CE that accepts the connection but never completes TLS costs
    ``connect_timeout`` once, not a read timeout per request.  Answers are then waited
    for up to ``timeout``.  (Also when http.client opens it again by itself.)"""

    def __init__(self, url: str, host: str, port: int, context: ssl.SSLContext | None,
                 timeout: float, connect_timeout: float | None) -> None:
        self.connect_timeout = min(connect_timeout or timeout, timeout)
        super().__init__(host, port, timeout=self.connect_timeout)
        self.url, self.context, self.read_timeout = url, context, timeout

    def connect(self) -> None:
        n = f"{self.connect_timeout:g}"
        try:
            super().connect()  # TCP, within connect_timeout (self.timeout)
        except TimeoutError:
            raise BackendUnavailable(f"the CE at {self.url} did not accept a connection "
                                     f"within {n} s") from None
        if self.context is not None:
            try:
                self.sock = self.context.wrap_socket(self.sock, server_hostname=self.host)
            except TimeoutError:
                self.close()
                raise BackendUnavailable(f"the CE at {self.url} did not complete TLS "
                                         f"within {n} s") from None
            except BaseException:
                self.close()
                raise
        self.sock.settimeout(self.read_timeout)


class _Rest:
    """One connection to the CE's REST interface at one version."""

    def __init__(self, url: str, context: ssl.SSLContext | None, token: str | None,
                 timeout: float, version: str | None = None,
                 connect_timeout: float | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"url: {url!r} is not an http(s) URL of a CE", field="url")
        self.base = parts.path.rstrip("/")
        if not self.base.endswith("/arex"):
            self.base += "/arex"
        self.token, self.version = token, version
        self.conn: http.client.HTTPConnection = _Connection(
            url, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
            context, timeout, connect_timeout)

    def close(self) -> None:
        self.conn.close()

    def raw(self, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
            versioned: bool = True):
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        prefix = f"{self.base}/rest/{self.version}" if versioned else f"{self.base}/rest"
        url = prefix + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        self.conn.request(method, url, body=body, headers=h)
        return self.conn.getresponse()

    def call(self, method: str, path: str, *, ok: tuple[int, ...] = (200,),
             body: bytes | None = None, json_body: Any = None,
             headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
             versioned: bool = True) -> tuple[Any, http.client.HTTPResponse, bytes]:
        h = {"Accept": "application/json", **(headers or {})}
        if json_body is not None:
            body = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        resp = self.raw(method, path, body, h, params, versioned)
        data = resp.read()
        if resp.status not in ok:
            raise ArcHTTPError(resp.status, resp.reason, data.decode(errors="replace"))
        doc = None
        if data and "json" in (resp.getheader("Content-Type") or "json"):
            try:
                doc = json.loads(data)
            except ValueError:
                doc = None
        return doc, resp, data

    def manage(self, ids: list[str], action: str) -> list[dict[str, Any]]:
        """A bulk job action; one answer per id, in order (1.0 answers one as an object)."""
        if not ids:
            return []
        items = [{"id": i} for i in ids]
        doc, _, _ = self.call("POST", "/jobs", ok=(201, 200), params={"action": action},
                              json_body={"job": items[0] if len(items) == 1 else items})
        return answers_by_id(doc, ids)


def answers_by_id(doc: Any, ids: list[str]) -> list[dict[str, Any]]:
    """A bulk job action's answer document, one answer per id in order (1.0 answers one
    job as an object, not a list); a job the CE does not answer for is a 404."""
    answers = _as_list(doc.get("job") if isinstance(doc, dict) else None)
    by_id = {str(a.get("id")): a for a in answers if isinstance(a, dict)}
    return [by_id.get(i, {"id": i, "status-code": "404", "reason": "No such job"})
            for i in ids]


def status_from_answer(jid: str, ans: dict[str, Any]) -> tuple[JobStatus, bool]:
    """A job's status from its answer to ``action=status``, and whether its info (exit
    code, errors) is worth asking for; a CE that cannot answer is BackendUnavailable."""
    code = str(ans.get("status-code"))
    if code == "404":
        return JobStatus(FAILED, "WIPED", "the CE no longer knows the job (cleaned?)"), False
    if code != "200":
        raise BackendUnavailable(f"status of {jid}: {code} {ans.get('reason')}")
    native = str(ans.get("state", ""))
    state = common_state(native)
    return JobStatus(state, native), state in (SUCCEEDED, FAILED)


def add_info(st: JobStatus, ans: dict[str, Any]) -> None:
    """What a finished job's answer to ``action=info`` adds: exit code, errors."""
    if str(ans.get("status-code")) != "200":
        return
    info = _activity(ans)
    code = info.get("ExitCode")
    if code not in (None, ""):
        try:
            st.exit_code = int(code)
        except (TypeError, ValueError):
            pass
    errors = [str(x) for x in _as_list(info.get("Error")) if x]
    if errors:
        st.message = "; ".join(errors)[:1000]


def limits_from_info(lim: Limits, info: Any, queue: str | None = None) -> None:
    """Fill ``lim`` (queues, per-queue limits) from the CE's ``GET /info`` document
    (GLUE2 as JSON: its ComputingShares)."""
    service = info
    for key in ("Domains", "AdminDomain", "Services", "ComputingService"):
        service = service.get(key) if isinstance(service, dict) else None
    if isinstance(service, list):
        service = service[0] if service else {}
    if not isinstance(service, dict):
        return  # no GLUE2 service here: no queues known
    names: list[str] = []
    for share in _as_list(service.get("ComputingShare")):
        if not isinstance(share, dict) or not share.get("Name"):
            continue
        name = share.get("MappingQueue") or share["Name"]
        if not isinstance(name, str) or name in names:
            continue
        names.append(name)
        q = lim.per_queue.get(name) or Limits()
        wall = _number(share.get("MaxWallTime"))
        q.max_duration = _min(q.max_duration, wall, lim.max_duration)
        slots = _number(share.get("MaxSlotsPerJob"))
        q.max_cpus_per_node = _min(q.max_cpus_per_node,
                                   int(slots) if slots else None, lim.max_cpus_per_node)
        q.max_nodes = _min(q.max_nodes, lim.max_nodes)
        lim.per_queue[name] = q
    if names:
        lim.queues = names
        lim.default_queue = queue or names[0]


def _auth_failure(e: ArcHTTPError) -> bool:
    """ARC 7 answers a token it cannot validate with 500; its reason says so."""
    text = f"{e.reason} {e.body}".lower()
    return any(w in text for w in ("can't be assigned configuration", "token", "authoriz",
                                   "authentic", "security"))


def _activity(ans: dict[str, Any]) -> dict[str, Any]:
    doc = ans.get("info_document") or {}
    act = doc.get("ComputingActivity", doc) if isinstance(doc, dict) else {}
    return act if isinstance(act, dict) else {}


def _rest_state(info: dict[str, Any]) -> str:
    for s in _as_list(info.get("State")):
        s = str(s)
        if s.startswith("arcrest:"):
            return s.split(":", 1)[1].upper()
    return ""


def _as_list(v: Any) -> list:
    if v is None or v == "":
        return []
    return v if isinstance(v, list) else [v]


def _number(v: Any) -> float | None:
    """A positive, finite number the CE wrote (as a number or text), else None."""
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit int
        return None
    return f if 0 < f < 2**63 else None  # not inf ("1e999"), not NaN


def _text(text: str) -> str:
    try:
        data = json.loads(text)
        return str(data.get("message") or data)[:500]
    except (ValueError, AttributeError):
        return (text or "").strip()[:500]


def _min(*values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None
