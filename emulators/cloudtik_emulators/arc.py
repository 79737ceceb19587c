"""An ARC CE REST emulator (``/arex/rest``) that runs the submitted jobs on this machine.

For tests and demos of the ``arc`` backend; pyarcrest talks to it over HTTP::

    python -m cloudtik_emulators.arc --root /tmp/arc --client-secret s3cret

Like A-REX it takes job descriptions in xRSL (``application/rsl``) or ADL
(``application/xml``) with ``POST /jobs?action=new``, answers bulk job actions
(``status``, ``info``, ``kill``, ``clean``, ``delegations``) with per-job status codes,
keeps a session directory per job (``GET``/``PUT /jobs/<id>/session/<path>``, listings,
HTTP ranges), diagnose files, and token delegations.  Jobs go through the REST states as
A-REX names them (its table in ARC1ClusterInfo.pm, nordugrid-arc-arex 6.17): ACCEPTING →
PREPARING (waiting for the client to upload its input files; the CE downloads inputs
given by URL — the "directly reachable storage" of ARC) → PREPARED (held while
``--max-running`` jobs, arc.conf's ``maxjobs`` number2, are in SUBMITTING or the LRMS) →
SUBMITTING → QUEUING → RUNNING → EXITINGLRMS → FINISHING (outputs with a destination URL
are uploaded with PUT) → FINISHED or FAILED.  A kill takes ``--kill-delay`` seconds (40-60
on a real CE): the job keeps its state, then KILLED (KILLING for a moment); a job the
LRMS ends (wall time) stays KILLING for half that on its way to FAILED.

Bearer tokens are OIDC client-credential JWTs from ``/auth/token`` (this emulator is its
own issuer); with ``--tls-cert``/``--tls-key``/``--client-ca`` it serves HTTPS and also
takes X.509 clients (RFC 3820 proxies, as ARC 6 does) in the handshake, the user being the
proxy's subject without its own CN, and X.509 delegations (a certificate request to
sign, then ``PUT``); faults as in ``_service.py``, plus ``max_running`` and
``kill_delay``.  Job records persist under ``<root>/.arex``.

It answers as the real A-REX does (checked against ARC 6.17 and 7.0 from Debian, see
``docs/hpc.md``, "ARC: real A-REX vs emulator"): the versions it serves (``--rest-versions``;
7.0 serves 1.0 and 1.1, 6.17 only 1.0, anything else is 404 "Version Not Supported"); the
error text in the HTTP reason phrase with an empty body; a token it cannot accept is 500
"User can't be assigned configuration"; a refused job is a per-job ``status-code`` 500
with the reason; a bare ``walltime`` is seconds; ``join`` is ignored (stderr goes to its
own file, or nowhere); the session folder keeps only declared outputs (``outputfiles``
with an empty target; ``"/"`` keeps everything) once the job ends; listings are
``{"file": [...], "dir": [...]}`` with a lone entry as a plain string.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections import deque
from pathlib import Path
from typing import Any

from tornado import httpserver, web

from ._service import (
    AdminHandler,
    BaseHandler,
    CertsHandler,
    DetachedJobs,
    Faults,
    TokenHandler,
    TokenIssuer,
    job_environment,
)

API = "/arex/rest"
VERSIONS = ["1.0", "1.1"]  # what ARC 7.0 serves; ARC 6.17 serves "1.0" only
AUTH_REFUSED = "User can't be assigned configuration"  # A-REX's words, 500 on ARC 7
ACTIVE = {"ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING",
          "RUNNING", "EXITINGLRMS", "FINISHING", "KILLING"}
# what counts against maxjobs' number2: "jobs being run (SUBMITTING, INLRMS states)"
IN_LRMS = {"SUBMITTING", "QUEUING", "RUNNING", "HELD", "EXITINGLRMS", "OTHER", "EXECUTED"}


class ArcFaults(Faults):
    """The common faults, and how this CE is run: ``max_running`` (arc.conf's
    ``maxjobs`` number2; None or -1: no limit) and ``kill_delay`` (seconds from a kill
    request to KILLED, the job keeping its state meanwhile: 61 s measured on A-REX 6.17,
    40-60 s reported; a job the LRMS ends stays KILLING half as long before FAILED)."""

    def __init__(self, max_running: int | None = None, kill_delay: float = 0.0) -> None:
        super().__init__()
        self.max_running, self.kill_delay = max_running, kill_delay

    def set(self, data: dict[str, Any], issuer: TokenIssuer | None) -> None:
        super().set(data, issuer)
        with self.lock:
            if "max_running" in data:
                v = data["max_running"]
                self.max_running = None if v is None or int(v) < 0 else int(v)
            if "kill_delay" in data:
                self.kill_delay = float(data["kill_delay"])


# --- job descriptions --------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(\()|(\))|"((?:[^"]|"")*)"|\'((?:[^\']|\'\')*)\'|([&|=!<>]+)|'
                    r'([^\s()"\'=&|]+))')


def parse_xrsl(text: str) -> dict[str, list]:
    """``&(attr="v")(attr=("a" "b")("c" "d"))`` → {attr: [values]}, attr names lower-case."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"xRSL syntax error near {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group(1):
            tokens.append(("(", "("))
        elif m.group(2):
            tokens.append((")", ")"))
        elif m.group(3) is not None:
            tokens.append(("s", m.group(3).replace('""', '"')))
        elif m.group(4) is not None:
            tokens.append(("s", m.group(4).replace("''", "'")))
        elif m.group(5):
            tokens.append(("op", m.group(5)))
        elif m.group(6):
            tokens.append(("s", m.group(6)))
    out: dict[str, list] = {}
    i = 0
    if tokens and tokens[0] == ("op", "&"):
        i = 1
    while i < len(tokens):
        if tokens[i][0] != "(":
            raise ValueError("xRSL: expected '(' to start a relation")
        if i + 2 >= len(tokens) or tokens[i + 1][0] != "s" or tokens[i + 2] != ("op", "="):
            raise ValueError("xRSL: expected (attribute = value)")
        attr = tokens[i + 1][1].lower()
        i += 3
        values: list = []
        while i < len(tokens) and tokens[i][0] != ")":
            if tokens[i][0] == "(":
                i += 1
                group = []
                while i < len(tokens) and tokens[i][0] != ")":
                    group.append(tokens[i][1])
                    i += 1
                values.append(group)
                i += 1
            else:
                values.append(tokens[i][1])
                i += 1
        if i >= len(tokens):
            raise ValueError(f"xRSL: relation '{attr}' is not closed")
        i += 1
        out[attr] = values
    return out


def description_from_xrsl(text: str) -> dict[str, Any]:
    x = parse_xrsl(text)

    def one(key, default=None):
        v = x.get(key)
        return v[0] if v and not isinstance(v[0], list) else default

    if not one("executable"):
        raise ValueError("xRSL: the 'executable' attribute is required")
    wall = one("walltime") or one("cputime")
    return {
        "name": one("jobname", ""),
        "executable": one("executable"),
        "arguments": [a for a in x.get("arguments", []) if not isinstance(a, list)],
        "inputs": [{"name": g[0], "source": g[1] if len(g) > 1 else ""}
                   for g in x.get("inputfiles", []) if isinstance(g, list) and g],
        "outputs": [{"name": g[0], "target": g[1] if len(g) > 1 else ""}
                    for g in x.get("outputfiles", []) if isinstance(g, list) and g],
        "stdout": one("stdout"), "stderr": one("stderr"),
        # A-REX ignores join: stderr goes where "stderr" says, or nowhere
        "join": False,
        "walltime": _seconds(wall) if wall else None,
        "count": int(one("count", "1")), "memory": int(one("memory", "0")) or None,
        "queue": one("queue"), "env": {g[0]: g[1] for g in x.get("environment", [])
                                       if isinstance(g, list) and len(g) == 2},
        "delegation": one("delegationid"),  # how REST 1.0 names the delegation
    }


def _seconds(text: str) -> int:
    """xRSL times as A-REX (ARC >= 6) reads them: a bare number is SECONDS (the xRSL
    manual's "minutes" is not what the CE does: ``(walltime="2")`` is RequestedTotalWallTime
    2), or '<n> seconds|minutes|hours|days'."""
    m = re.match(r"^\s*(\d+)\s*([a-z]*)\s*$", str(text).lower())
    if not m:
        raise ValueError(f"xRSL: bad time {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    factor = {"": 1, "s": 1, "sec": 1, "seconds": 1, "second": 1, "m": 60, "min": 60,
              "minutes": 60, "minute": 60, "h": 3600, "hour": 3600, "hours": 3600,
              "d": 86400, "day": 86400, "days": 86400}.get(unit)
    if factor is None:
        raise ValueError(f"xRSL: bad time unit {unit!r}")
    return n * factor


def description_from_adl(text: str) -> dict[str, Any]:
    root = ET.fromstring(text)

    def find(path):
        el = root.find(path)
        return el.text if el is not None else None

    def strip(tag):
        return tag.split("}", 1)[-1]

    for el in root.iter():
        el.tag = strip(el.tag)
    exe = find("./Application/Executable/Path")
    if not exe:
        raise ValueError("ADL: Application/Executable/Path is required")
    wall = find("./Resources/IndividualWallTime") or find("./Resources/TotalWallTime")
    return {
        "name": find("./ActivityIdentification/Name") or "",
        "executable": exe,
        "arguments": [a.text or "" for a in root.findall("./Application/Executable/Argument")],
        "inputs": [{"name": f.findtext("Name"), "source": f.findtext("Source/URI") or ""}
                   for f in root.findall("./DataStaging/InputFile")],
        "outputs": [{"name": f.findtext("Name"), "target": f.findtext("Target/URI") or ""}
                    for f in root.findall("./DataStaging/OutputFile")],
        "stdout": find("./Application/Output"), "stderr": find("./Application/Error"),
        "join": False, "walltime": int(wall) if wall else None, "count": 1, "memory": None,
        "queue": find("./Resources/QueueName"), "env": {},
    }


# --- the service ---------------------------------------------------------------------------------

class ArcService:
    def __init__(self, root: Path, clients: dict[str, str], admin_token: str,
                 queues: dict[str, dict[str, Any]] | None = None,
                 versions: list[str] | None = None, max_running: int | None = None,
                 kill_delay: float = 0.0) -> None:
        self.versions = list(versions or VERSIONS)
        self.root = root.resolve()
        self.state_dir = self.root / ".arex"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.sessions = self.root / "sessions"
        self.sessions.mkdir(exist_ok=True)
        self.issuer = TokenIssuer(clients, issuer="cloudtik-arc-emulator", audience="arc",
                                  key_file=self.state_dir / "signing-key.pem")
        self.faults = ArcFaults(max_running, kill_delay)
        self.admin_token = admin_token
        self.queues = queues or {"main": {"max_wall_time": 3600,
                                          "max_slots": os.cpu_count() or 2}}
        self.runner = DetachedJobs(self.state_dir / "run")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.delegations: dict[str, dict[str, Any]] = {}
        self.requests: deque = deque(maxlen=5000)
        self.lock = threading.RLock()
        self._load()

    def record(self, method: str, path: str, query: str = "") -> None:
        self.requests.append({"t": time.time(), "method": method, "path": path,
                              "query": query})

    def error_body(self, status: int, message: str, **extra: Any) -> dict[str, Any]:
        return {"message": message, "status-code": str(status), **extra}

    def _load(self) -> None:
        p = self.state_dir / "state.json"
        if p.exists():
            data = json.loads(p.read_text())
            self.jobs, self.delegations = data.get("jobs", {}), data.get("delegations", {})

    def save(self) -> None:
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps({"jobs": self.jobs, "delegations": self.delegations}))
        tmp.replace(self.state_dir / "state.json")

    # jobs -------------------------------------------------------------------------------------
    def new_job(self, desc: dict[str, Any], owner: str, queue: str | None,
                delegation: str | None) -> dict[str, Any]:
        delegation = delegation or desc.get("delegation")
        if not delegation or self.delegations.get(delegation, {}).get("owner") != owner:
            return {"status-code": "400", "reason": "Delegation ID is missing or unknown"}
        q = desc.get("queue") or queue or next(iter(self.queues))
        if q not in self.queues:  # A-REX 6.17 and 7.0, word for word
            return {"status-code": "500",
                    "reason": f"Requested queue {q} is not allowed for this user"}
        limit = self.queues[q].get("max_wall_time")
        if limit and desc.get("walltime") and desc["walltime"] > limit:
            return {"status-code": "500",
                    "reason": f"Requested wall time exceeds the limit of queue '{q}'"}
        jid = uuid.uuid4().hex[:10] + secrets.token_hex(5)
        session = self.sessions / jid
        session.mkdir(parents=True)
        with self.lock:
            self.jobs[jid] = {"id": jid, "owner": owner, "desc": desc, "queue": q,
                              "state": "ACCEPTING", "errors": [], "exit_code": None,
                              "submitted": time.time(), "ended": None, "delegation": delegation}
            self.save()
        return {"status-code": "201", "reason": "Created", "id": jid, "state": "ACCEPTING"}

    def session(self, jid: str) -> Path:
        return self.sessions / jid

    def advance(self) -> None:
        """Move every job along its life (called a few times a second)."""
        with self.lock:
            jobs = [j for j in self.jobs.values() if j["state"] in ACTIVE]
        for j in jobs:
            try:
                self._advance(j)
            except Exception as e:  # an emulator bug must show, not hang the job
                self._fail(j, f"internal error: {e}")
            if j["state"] not in ACTIVE and not j.get("kept_outputs"):
                self._keep_declared_outputs(j)
        if jobs:
            with self.lock:
                self.save()

    def running(self) -> int:
        """Jobs that count against arc.conf's ``maxjobs`` number2 ("jobs being run
        (SUBMITTING, INLRMS states)"; arc.conf.reference of ARC 6.17)."""
        return sum(1 for j in self.jobs.values()
                   if j["state"] in IN_LRMS or (j["state"] == "KILLING" and j.get("lrms")))

    def _advance(self, j: dict[str, Any]) -> None:
        jid, desc, session = j["id"], j["desc"], self.session(j["id"])
        st = j["state"]
        now = time.time()
        if j.get("kill_at") is not None and st != "KILLING" and now >= j["kill_at"]:
            # A-REX takes the kill request up on a later wake-up: CANCELING (REST KILLING),
            # over by the next tick (on 6.17 it was never seen: RUNNING until KILLED)
            self.runner.cancel(jid)
            j["state"], j["killing_since"], j["end_as"] = "KILLING", now, "KILLED"
            j["killing_for"] = 0.0
            return
        if st == "KILLING":
            if now - j.get("killing_since", now) >= j.get("killing_for", 0.0):
                self.runner.cancel(jid)
                j["state"], j["ended"] = j.get("end_as") or "KILLED", now
            return
        if st == "ACCEPTING":  # A-REX's ACCEPTED: taken up on the next wake-up
            j["state"] = "PREPARING"
            return
        if st == "PREPARING":  # waits for the client's uploads, downloads URL inputs
            missing = [i["name"] for i in desc["inputs"]
                       if not i["source"] and not (session / i["name"]).exists()]
            if missing:
                if now - j["submitted"] > 600:
                    self._fail(j, f"input files were never uploaded: {', '.join(missing)}")
                return
            for item in desc["inputs"]:
                if item["source"] and not (session / item["name"]).exists():
                    try:
                        _download(item["source"], session / item["name"])
                    except OSError as e:
                        self._fail(j, f"Failed to download input file {item['name']} from "
                                      f"{item['source']}: {e}")
                        return
            j["state"] = "PREPARED"
            return
        if st == "PREPARED":  # PENDING:PREPARING: held while maxjobs' number2 is reached
            limit = self.faults.max_running
            if limit is None or limit < 0 or self.running() < limit:
                j["state"] = "SUBMITTING"
            return
        if st == "SUBMITTING":
            j["state"], j["lrms"] = "QUEUING", True
            self._start(j)
            return
        if st in ("QUEUING", "RUNNING"):
            native, rc = self.runner.state(jid)
            if native == "PENDING":
                return
            if native == "RUNNING":
                j["state"] = "RUNNING"
                return
            j["exit_code"] = rc
            if native in ("TIMEOUT", "LOST"):
                # the LRMS ended it: A-REX cancels it there (CANCELING, REST KILLING) on
                # its way to FAILED ("a failed job passes through CANCELING", as reported)
                j["errors"].append("Job exceeded the wall time limit" if native == "TIMEOUT"
                                   else "Job was lost by the batch system")
                j["state"], j["killing_since"], j["end_as"] = "KILLING", now, "FAILED"
                j["killing_for"] = self.faults.kill_delay / 2  # our reading: not measured
                return
            if native == "CANCELLED":
                j["state"], j["ended"] = "KILLED", now
                return
            j["state"] = "EXITINGLRMS"  # the LRMS is done; A-REX notices on a wake-up
            return
        if st == "EXITINGLRMS":
            j["state"] = "FINISHING"
            return
        if st == "FINISHING":
            for item in desc["outputs"]:
                target = item["target"]
                if target and target.startswith(("http://", "https://")):
                    try:
                        _upload(session / item["name"], target)
                    except OSError as e:
                        self._fail(j, f"Failed to upload output file {item['name']} to "
                                      f"{target}: {e}")
                        return
            if j["exit_code"]:
                self._fail(j, f"Job finished with non-zero exit code {j['exit_code']}")
            else:
                j["state"], j["ended"] = "FINISHED", time.time()

    def _keep_declared_outputs(self, j: dict[str, Any]) -> None:
        """What A-REX leaves in a finished job's session folder: the outputs declared with
        an empty target (the user downloads them); ``"/"`` keeps the whole folder.  All
        else goes — a job that declares nothing has an empty folder."""
        import shutil

        j["kept_outputs"] = True
        session = self.session(j["id"])
        keep = {o["name"].strip("/") for o in j["desc"]["outputs"] if not o["target"]}
        if "" in keep or not session.exists():
            return
        for path in sorted(session.rglob("*"), key=lambda p: -len(p.parts)):
            rel = path.relative_to(session).as_posix()
            if rel in keep or any(rel.startswith(k + "/") for k in keep):
                continue
            if path.is_dir() and not path.is_symlink():
                if not any(k.startswith(rel + "/") for k in keep):
                    shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _start(self, j: dict[str, Any]) -> None:
        desc, session = j["desc"], self.session(j["id"])
        exe = desc["executable"]
        argv = " ".join(_q(a) for a in desc["arguments"])
        path = exe if exe.startswith("/") else f"./{exe}"
        if not exe.startswith("/") and (session / exe).exists():
            (session / exe).chmod(0o755)
        stdout = session / (desc.get("stdout") or ".arc.stdout")
        # A-REX ignores join; without a "stderr" file the job's stderr is lost
        stderr = session / desc["stderr"] if desc.get("stderr") else Path(os.devnull)
        env = job_environment({**desc.get("env", {}), "GRID_GLOBAL_JOBID": j["id"],
                               "RUNTIME_JOB_DIR": str(session)})
        limit = desc.get("walltime")
        # bash appends to the same file when stdout and stderr are joined
        script = f"{_q(path)} {argv}\n" if stdout != stderr else f"{_q(path)} {argv} 2>&1\n"
        self.runner.start(j["id"], script, session, env, stdout, stderr if stdout != stderr
                          else Path(os.devnull), time_limit=limit,
                          delay=self.faults.queue_delay)

    def _fail(self, j: dict[str, Any], reason: str) -> None:
        j["state"], j["ended"] = "FAILED", time.time()
        j["errors"].append(reason)

    def info_document(self, j: dict[str, Any]) -> dict[str, Any]:
        def ts(t):
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else None

        doc = {"ID": j["id"], "Name": j["desc"].get("name", ""), "Type": "single",
               "IDFromEndpoint": j["id"], "LocalIDFromManager": j["id"],
               "Owner": j["owner"], "LocalOwner": "user", "Queue": j["queue"],
               "State": [f"arcrest:{j['state']}", f"nordugrid:{j['state']}"],
               "StdOut": j["desc"].get("stdout"), "StdErr": j["desc"].get("stderr"),
               "SubmissionTime": ts(j["submitted"]), "RequestedSlots": j["desc"].get("count", 1)}
        if j.get("ended"):
            doc["EndTime"] = ts(j["ended"])
        if j.get("exit_code") is not None:
            doc["ExitCode"] = j["exit_code"]
        if j["errors"]:
            doc["Error"] = list(j["errors"])
        return {"ComputingActivity": doc}


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _download(url: str, dest: Path) -> None:
    if not url.startswith(("http://", "https://")):
        raise OSError(f"unsupported URL scheme in {url}")
    try:
        with urllib.request.urlopen(url, timeout=30) as resp, open(dest, "wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
    except urllib.error.URLError as e:
        dest.unlink(missing_ok=True)
        raise OSError(str(e)) from None


def _upload(src: Path, url: str) -> None:
    if not src.exists():
        raise OSError(f"{src.name} was not produced by the job")
    req = urllib.request.Request(url, data=src.read_bytes(), method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=30):
            pass
    except urllib.error.URLError as e:
        raise OSError(str(e)) from None


# --- HTTP ---------------------------------------------------------------------------------

class Handler(BaseHandler):
    """A-REX's way with errors: the text is the HTTP reason phrase, the body is empty; a
    token it cannot accept is 500 (ARC 7), and a REST version it does not serve is 404."""

    def prepare(self) -> None:
        m = re.match(rf"{API}/([^/]+)", self.request.path)
        if m and m.group(1) not in self.svc.versions:
            self.svc.record(self.request.method, self.request.path, self.request.query)
            self.fail(404, "Version Not Supported")
            return
        subject = self._peer_subject()
        if subject and not self.request.headers.get("Authorization"):
            # X.509 in the TLS handshake (ARC 6): the user is the proxy's subject without
            # the proxy's own CN=<number>
            self.needs_auth, self.user, self.x509 = False, subject, True
        super().prepare()

    def _peer_subject(self) -> str | None:
        sock = getattr(getattr(self.request.connection, "stream", None), "socket", None)
        try:
            cert = sock.getpeercert() if hasattr(sock, "getpeercert") else None
        except (OSError, ValueError):
            return None
        if not cert:
            return None
        names = [f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
        while len(names) > 1 and names[-1].startswith("commonName=") and \
                names[-1].split("=", 1)[1].isdigit():
            names.pop()
        return ",".join(names) or None

    @property
    def version(self) -> str:
        m = re.match(rf"{API}/([^/]+)", self.request.path)
        return m.group(1) if m else ""

    def fail(self, status: int, message: str, **extra: Any) -> None:
        if status == 401:  # A-REX 7 does not say 401: the token maps to no configuration
            status, message = 500, AUTH_REFUSED
        reason = " ".join(str(message).split())[:300].encode("latin-1", "replace").decode(
            "latin-1")
        self.set_status(status, reason=reason)
        self.set_header("Content-Type", "text/plain")
        self.finish()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish()

    def jobs_reply(self, items: list[dict[str, Any]], status: int = 201) -> None:
        """REST 1.0 answers one job as an object, not a list of one."""
        if self.version == "1.0" and len(items) == 1:
            self.reply({"job": items[0]}, status)
        else:
            self.reply({"job": items}, status)


class VersionsHandler(Handler):
    needs_auth = False  # ARC 7 lists its versions to anyone

    def get(self) -> None:
        v = self.svc.versions
        self.reply({"version": v if len(v) > 1 else v[0]})


class InfoHandler(Handler):
    def get(self, version: str) -> None:
        shares = [{"Name": q, "MappingQueue": q, "MaxWallTime": v.get("max_wall_time"),
                   "MaxSlotsPerJob": v.get("max_slots"), "ServingState": "production"}
                  for q, v in self.svc.queues.items()]
        self.reply({"Domains": {"AdminDomain": {"Name": "cloudtik-emulator", "Services": {
            "ComputingService": {"Name": "arex", "Type": "org.nordugrid.arex",
                                 "ComputingShare": shares,
                                 "ComputingManager": {"ProductName": "emulator",
                                                      "ApplicationEnvironments": {
                                                          "ApplicationEnvironment": []}}}}}}})


class DelegationsHandler(Handler):
    def get(self, version: str, did: str | None = None) -> None:
        mine = [{"id": k, "type": v["type"]} for k, v in self.svc.delegations.items()
                if v["owner"] == self.user]
        self.reply({"delegation": mine})

    def put(self, version: str, did: str | None = None) -> None:
        """The client's answer to an X.509 delegation request: the signed certificate."""
        d = self.svc.delegations.get(did or "")
        if d is None or d["owner"] != self.user or d["type"] != "x509":
            self.fail(404, "no such delegation")
            return
        if b"BEGIN CERTIFICATE" not in self.request.body:
            self.fail(400, "a PEM certificate is expected")
            return
        with self.svc.lock:
            d["delegated"] = True
            self.svc.save()
        self.set_header("Content-Type", "text/plain")
        self.finish()

    def post(self, version: str, did: str | None = None) -> None:
        action = self.get_argument("action", "")
        svc = self.svc
        if did is None and action == "new" and getattr(self, "x509", False) and \
                self.get_argument("type", "x509") == "x509":
            # X.509 delegation: a certificate request, signed by the client with its proxy
            new = uuid.uuid4().hex[:12]
            csr = _certificate_request()
            with svc.lock:
                svc.delegations[new] = {"owner": self.user, "type": "x509", "t": time.time()}
                svc.save()
            self.set_header("Location", f"{API}/{version}/delegations/{new}")
            self.set_header("Content-Type", "application/x-pem-file")
            self.set_status(201)
            self.finish(csr)
            return
        if did is None and action == "new":
            delegated = self.request.headers.get("X-Token-Delegation", "")
            if self.get_argument("type", "") != "jwt" or not delegated.startswith("Bearer "):
                self.fail(400, "only token delegation (type=jwt, X-Token-Delegation) is "
                               "supported here")
                return
            try:
                svc.issuer.verify(delegated[len("Bearer "):])
            except PermissionError as e:
                self.fail(400, f"delegated token rejected: {e}")
                return
            new = uuid.uuid4().hex[:12]
            with svc.lock:
                svc.delegations[new] = {"owner": self.user, "type": "jwt", "t": time.time()}
                svc.save()
            self.set_header("Location", f"{API}/{version}/delegations/{new}")
            self.set_status(201)
            self.finish()
            return
        d = svc.delegations.get(did or "")
        if d is None or d["owner"] != self.user:
            self.fail(404, "no such delegation")
            return
        if action == "renew":
            self.reply({}, 200)
        elif action == "delete":
            with svc.lock:
                svc.delegations.pop(did, None)
                svc.save()
            self.set_status(202)
            self.finish()
        elif action == "get":
            self.set_header("Content-Type", "text/plain")
            self.finish("token delegation")
        else:
            self.fail(400, f"unknown action '{action}'")


def _certificate_request() -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    req = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME,
                                                       "delegation")]))
           .sign(key, hashes.SHA256()))
    return req.public_bytes(serialization.Encoding.PEM).decode()


class JobsHandler(Handler):
    def get(self, version: str) -> None:
        jobs = [{"id": k} for k, j in self.svc.jobs.items()
                if j["owner"] == self.user and j["state"] != "WIPED"]
        if not jobs and version == "1.0":  # 6.17 answers no jobs with an empty body
            self.set_status(200)
            self.finish()
            return
        self.jobs_reply(jobs, 200)

    def post(self, version: str) -> None:
        action = self.get_argument("action", "")
        svc = self.svc
        if action == "new":
            ctype = self.request.headers.get("Content-Type", "")
            text = self.request.body.decode(errors="replace")
            try:
                if "rsl" in ctype:
                    descs = [description_from_xrsl(text)]
                elif "xml" in ctype:
                    root = ET.fromstring(text)
                    items = [root] if not root.tag.endswith("ActivityDescriptions") else list(root)
                    descs = [description_from_adl(ET.tostring(x, encoding="unicode"))
                             for x in items]
                else:
                    self.fail(415, f"unsupported description type '{ctype}'")
                    return
            except (ValueError, ET.ParseError) as e:
                self.fail(400, f"cannot parse the job description: {e}")
                return
            queue = self.get_argument("queue", None) if version != "1.0" else None
            deleg = self.get_argument("delegation_id", None) if version != "1.0" else None
            out = [svc.new_job(d, self.user, queue, deleg) for d in descs]
            self.jobs_reply(out, 201)
            return
        body = self.json_body()
        if not isinstance(body, dict) or "job" not in body:
            self.fail(400, "expected {\"job\": [{\"id\": ...}]}")
            return
        items = body["job"] if isinstance(body["job"], list) else [body["job"]]
        out = []
        for item in items:
            jid = str(item.get("id", ""))
            j = svc.jobs.get(jid)
            if j is None or j["owner"] != self.user or j["state"] == "WIPED":
                out.append({"id": jid, "status-code": "404", "reason": "Job not found",
                            "state": "None"})
                continue
            out.append(self._act(action, j))
        with svc.lock:
            svc.save()
        self.jobs_reply(out, 201)

    def _act(self, action: str, j: dict[str, Any]) -> dict[str, Any]:
        jid, svc = j["id"], self.svc
        if action == "status":
            return {"id": jid, "status-code": "200", "reason": "OK", "state": j["state"]}
        if action == "info":
            return {"id": jid, "status-code": "200", "reason": "OK",
                    "info_document": svc.info_document(j)}
        if action == "kill":
            if j["state"] in ACTIVE and j["state"] != "KILLING" and j.get("kill_at") is None:
                # taken up on a later wake-up of A-REX: the job keeps its state meanwhile
                # (6.17 with maxjobs: RUNNING for 61 s, then KILLED)
                j["kill_at"] = time.time() + svc.faults.kill_delay
            return {"id": jid, "status-code": "202", "reason": "Queued for killing"}
        if action == "clean":
            if j["state"] in ACTIVE:
                return {"id": jid, "status-code": "409", "reason": "Job is still active"}
            j["state"] = "WIPED"
            import shutil

            shutil.rmtree(svc.session(jid), ignore_errors=True)
            return {"id": jid, "status-code": "202", "reason": "Queued for cleaning"}
        if action == "delegations":
            return {"id": jid, "status-code": "200", "reason": "OK",
                    "delegation_id": [j.get("delegation")]}
        if action == "restart":
            return {"id": jid, "status-code": "409", "reason": "restart is not supported"}
        return {"id": jid, "status-code": "400", "reason": f"unknown action '{action}'"}


class SessionHandler(Handler):
    def _job(self, jid: str) -> dict[str, Any] | None:
        j = self.svc.jobs.get(jid)
        if j is None or j["owner"] != self.user or j["state"] == "WIPED":
            self.fail(404, "No such job")
            return None
        return j

    def _path(self, jid: str, rel: str) -> Path | None:
        base = self.svc.session(jid).resolve()
        p = (base / rel).resolve() if rel else base
        if p != base and base not in p.parents:
            self.fail(403, "path leaves the session directory")
            return None
        return p

    def get(self, version: str, jid: str, rel: str = "") -> None:
        if self._job(jid) is None:
            return
        p = self._path(jid, rel)
        if p is None:
            return
        if p.is_dir():
            files = sorted(c.name for c in p.iterdir() if c.is_file())
            dirs = sorted(c.name for c in p.iterdir() if c.is_dir())
            if version != "1.0":  # 7.0: always both lists
                self.reply({"file": files, "dir": dirs})
                return
            listing: dict[str, Any] = {}
            if files:  # 6.17: a lone entry is a string, none is no key (no body at all)
                listing["file"] = files if len(files) > 1 else files[0]
            if dirs:
                listing["dir"] = dirs if len(dirs) > 1 else dirs[0]
            if not listing:
                self.set_status(200)
                self.finish()
                return
            self.reply(listing)
            return
        if not p.exists():
            self.fail(404, "Not found")  # A-REX names no file
            return
        size = p.stat().st_size
        start, end = 0, size - 1
        rng = self.request.headers.get("Range", "")
        m = re.match(r"bytes=(\d+)-(\d*)$", rng)
        self.set_header("Content-Type", "application/octet-stream")
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size:
                self.set_status(416)
                self.set_header("Content-Range", f"bytes */{size}")
                self.finish()
                return
            self.set_status(206)
            self.set_header("Content-Range", f"bytes {start}-{end}/{size}")
        with open(p, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
                self.write(chunk)
        self.finish()

    def put(self, version: str, jid: str, rel: str = "") -> None:
        j = self._job(jid)
        if j is None:
            return
        # A-REX takes a PUT in any state (even FINISHED: 200); inputs count only before
        p = self._path(jid, rel)
        if p is None or not rel:
            if p is not None:
                self.fail(400, "a file name is required")
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.request.body)
        self.set_header("Content-Type", "text/plain")
        self.finish()


class DiagnoseHandler(Handler):
    def get(self, version: str, jid: str, name: str) -> None:
        j = self.svc.jobs.get(jid)
        if j is None or j["owner"] != self.user:
            self.fail(404, "No such job")
            return
        self.set_header("Content-Type", "text/plain")
        if name == "errors":
            self.finish("\n".join(j["errors"]) + "\n")
        elif name == "failed":
            if not j["errors"]:
                self.fail(404, "the job did not fail")
                return
            self.finish(j["errors"][-1] + "\n")
        elif name == "status":
            self.finish(j["state"] + "\n")
        elif name == "description":
            self.finish(json.dumps(j["desc"]))
        else:
            self.fail(404, f"no diagnose file '{name}'")


def make_app(service: ArcService) -> web.Application:
    v = r"(1\.[01])"
    jid = r"([A-Za-z0-9]+)"
    return web.Application([
        (r"/auth/token", TokenHandler),
        (r"/auth/certs", CertsHandler),
        (r"/_emulator/(\w+)", AdminHandler),
        (rf"{API}/?", VersionsHandler),
        (rf"{API}/{v}/info", InfoHandler),
        (rf"{API}/{v}/delegations", DelegationsHandler),
        (rf"{API}/{v}/delegations/([A-Za-z0-9]+)", DelegationsHandler),
        (rf"{API}/{v}/jobs", JobsHandler),
        (rf"{API}/{v}/jobs/{jid}/session/?", SessionHandler),
        (rf"{API}/{v}/jobs/{jid}/session/(.+)", SessionHandler),
        (rf"{API}/{v}/jobs/{jid}/diagnose/(\w+)", DiagnoseHandler),
    ], service=service)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ARC CE REST emulator")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--client-id", default="cloudtik")
    parser.add_argument("--client-secret", default=os.environ.get("EMULATOR_CLIENT_SECRET"))
    parser.add_argument("--admin-token", default=os.environ.get("EMULATOR_ADMIN_TOKEN"))
    parser.add_argument("--queues", help="JSON {name: {max_wall_time, max_slots}}")
    parser.add_argument("--rest-versions", default=",".join(VERSIONS),
                        help="REST versions served: 1.0,1.1 (ARC 7) or 1.0 (ARC 6)")
    parser.add_argument("--max-running", type=int, default=-1,
                        help="jobs in SUBMITTING or in the LRMS at once (arc.conf maxjobs' "
                             "second number); more wait PREPARED. -1: no limit")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="its key (PEM)")
    parser.add_argument("--client-ca", help="accept X.509 clients (RFC 3820 proxies "
                                            "included) issued by these CAs (PEM)")
    parser.add_argument("--kill-delay", type=float, default=0.0,
                        help="seconds from a kill request to KILLED (40-60 on a real CE)")
    args = parser.parse_args(argv)
    if not args.client_secret:
        parser.error("--client-secret (or $EMULATOR_CLIENT_SECRET) is required")
    admin = args.admin_token or secrets.token_urlsafe(16)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    svc = ArcService(root, {args.client_id: args.client_secret}, admin,
                     json.loads(args.queues) if args.queues else None,
                     [v.strip() for v in args.rest_versions.split(",") if v.strip()],
                     None if args.max_running < 0 else args.max_running, args.kill_delay)
    app = make_app(svc)

    async def run() -> None:
        from tornado.netutil import bind_sockets

        tls = None
        if args.tls_cert:  # HTTPS; with --client-ca also X.509 (proxy) clients, as ARC 6
            import ssl

            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(args.tls_cert, args.tls_key)
            if args.client_ca:
                tls.load_verify_locations(cafile=args.client_ca)
                tls.verify_mode = ssl.CERT_OPTIONAL
                tls.verify_flags |= ssl.VERIFY_ALLOW_PROXY_CERTS
        server = httpserver.HTTPServer(app, max_buffer_size=1 << 30, ssl_options=tls)
        sockets = bind_sockets(args.port, "127.0.0.1")
        server.add_sockets(sockets)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{sockets[0].getsockname()[1]}"
        print(json.dumps({"url": url, "token_uri": f"{url}/auth/token", "root": str(svc.root),
                          "admin_token": admin}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        async def tick() -> None:
            while not stop.is_set():
                await asyncio.to_thread(svc.advance)
                await asyncio.sleep(0.1)

        ticker = asyncio.create_task(tick())
        await stop.wait()
        ticker.cancel()
        server.stop()

    try:
        asyncio.run(run())
    finally:
        svc.runner.kill_all()


if __name__ == "__main__":
    sys.exit(main())
