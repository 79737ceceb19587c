"""``arc``: jobs on an ARC Compute Element through its REST API (``/arex/rest/1.1``).

Uses pyarcrest for the protocol (token auth, bulk job actions, session-directory files);
job descriptions are xRSL written here, so the ARC client libraries are not needed.
Authentication is a bearer token: OIDC client credentials (``token_uri``, ``client_id`` and
the secret ``client_secret``) or a fixed token (secret ``token``), delegated to the CE so
it can fetch inputs on the user's behalf.

ARC stages data itself: inputs given by URL (http, https) are listed in the description
and downloaded by the CE, so the session never touches them.  Local inputs, the notebook
and the job script are uploaded into the job's session directory after the job is
created; the CE starts the job once they are all there.  One ``action=status`` request
answers for all jobs of the backend at each poll.
"""

from __future__ import annotations

import json
import math
import posixpath
import threading
import time
from pathlib import Path
from typing import Any

from ..core.errors import CloudTikError, ConfigError, NotFoundError, ProviderError
from . import script
from .base import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    UNKNOWN,
    BackendUnavailable,
    HPCBackend,
    JobRef,
    JobStatus,
    Limits,
    LogChunk,
    OutputFile,
    Submission,
)
from .oidc import ClientCredentials

QUEUED_STATES = {"ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING",
                 "HELD", "OTHER"}
RUNNING_STATES = {"RUNNING", "EXITINGLRMS", "EXECUTED", "FINISHING"}
LIMITS_TTL = 60.0
INPUTS_FILE = ".cloudtik-inputs"


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
    if native in ("KILLING", "KILLED"):
        return CANCELLED
    return UNKNOWN


def xrsl_quote(value: str) -> str:
    return '"' + str(value).replace('"', '""') + '"'


class ArcBackend(HPCBackend):
    kind = "arc"
    description = "an ARC Compute Element (REST interface)"
    direct_schemes = ("http", "https")
    config_schema = {
        "type": "object",
        "required": ["url"],
        "properties": {
            "type": {"const": "arc"},
            "url": {"type": "string", "description": "the CE, e.g. https://arc.example.org"},
            "token_uri": {"type": "string"},
            "client_id": {"type": "string"},
            "scope": {"type": "string"},
            "queue": {"type": "string"},
            "timeout": {"type": "number", "exclusiveMinimum": 0},
            "reaches": {"type": "array", "items": {"type": "string"}},
            "environment": {"type": "object"},
            "limits": {"type": "object"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        self._creds: ClientCredentials | None = None
        self._delegation: str | None = None
        self._limits: tuple[float, Limits] | None = None
        self._lock = threading.Lock()

    # talking to the CE -----------------------------------------------------------------------
    def _token(self) -> str:
        fixed = self.context.secret("token")
        if fixed:
            return fixed
        if self._creds is None:
            if not self.config.get("token_uri") or not self.config.get("client_id"):
                raise ConfigError(
                    f"backend '{self.name}' needs a token: set token_uri and client_id (and "
                    f"the client_secret secret), or the token secret", field="token_uri")
            secret = self.context.secret("client_secret")
            if not secret:
                raise ConfigError(
                    f"backend '{self.name}' has no client secret; set it with `jupyter "
                    f"cloudtik jobs secret {self.name} client_secret`", field="client_secret")
            self._creds = ClientCredentials(self.config["token_uri"], self.config["client_id"],
                                            secret, self.config.get("scope"),
                                            float(self.config.get("timeout", 30)))
        return self._creds.token()

    def _client(self):
        from pyarcrest.arc import ARCRest_1_1
        from pyarcrest.http import HTTPClient

        http = HTTPClient(url=self.config["url"], timeout=float(self.config.get("timeout", 30)))
        http.conn.set_debuglevel(0)
        return ARCRest_1_1(http, token=self._token())

    def _call(self, fn):
        """``fn(client)`` with ARC's failures turned into ours; one retry on a refused token."""
        from pyarcrest.errors import ARCError, ARCHTTPError, MissingResultFile

        for attempt in (1, 2):
            client = self._client()
            try:
                return fn(client)
            except ARCHTTPError as e:
                if e.status == 401 and attempt == 1:
                    if self._creds is not None:
                        self._creds.invalidate()
                    self._delegation = None
                    continue
                if e.status >= 500 or e.status == 429:
                    raise BackendUnavailable(f"the CE answered {e.status}: {_text(e.text)}") \
                        from None
                if e.status == 404:
                    raise NotFoundError(f"ARC: {_text(e.text)}", field="job") from None
                raise ProviderError(f"the CE refused the request ({e.status}): "
                                    f"{_text(e.text)}") from None
            except (OSError, TimeoutError) as e:
                raise BackendUnavailable(f"cannot reach {self.config['url']}: {e}") from None
            except MissingResultFile as e:
                raise NotFoundError(f"ARC: {e}", field="name") from None
            except ARCError as e:
                raise ProviderError(f"ARC: {e}") from None
            finally:
                try:
                    client.close()
                except Exception:
                    pass
        raise AssertionError("unreachable")  # pragma: no cover

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["where"] = self.config["url"]
        return d

    # limits ------------------------------------------------------------------------------------
    def limits(self) -> Limits:
        now = time.monotonic()
        if self._limits and now - self._limits[0] < LIMITS_TTL:
            return self._limits[1]
        lim = super().limits()
        info = self._call(lambda c: c.getCEInfo())
        shares = info.get("Domains", {}).get("AdminDomain", {}).get("Services", {}) \
            .get("ComputingService", {}).get("ComputingShare", [])
        if isinstance(shares, dict):
            shares = [shares]
        names = []
        for share in shares:
            if "MappingPolicy" in share or not share.get("Name"):
                continue
            name = share["Name"]
            names.append(name)
            q = lim.per_queue.get(name) or Limits()
            if share.get("MaxWallTime"):
                q.max_duration = _min(q.max_duration, float(share["MaxWallTime"]),
                                      lim.max_duration)
            else:
                q.max_duration = _min(q.max_duration, lim.max_duration)
            if share.get("MaxSlotsPerJob"):
                q.max_cpus_per_node = _min(q.max_cpus_per_node, int(share["MaxSlotsPerJob"]),
                                           lim.max_cpus_per_node)
            q.max_nodes = _min(q.max_nodes, lim.max_nodes)
            lim.per_queue[name] = q
        if names:
            lim.queues = names
            lim.default_queue = self.config.get("queue") or names[0]
        self._limits = (now, lim)
        return lim

    # submitting ---------------------------------------------------------------------------------
    def _delegation_id(self) -> str:
        if self._delegation is None:
            token = self._token()
            self._delegation = self._call(lambda c: c.createDelegation(token=token))
        return self._delegation

    def xrsl(self, sub: Submission) -> str:
        r, a = sub.spec.resources, sub.spec.attributes
        inputs = [(script.SCRIPT_NAME, ""), (script.PARAMETERS_NAME, ""), (INPUTS_FILE, "")]
        inputs += [(name, "") for name in sub.files]
        for item in sub.inputs:
            inputs.append((item.name, item.source if item.mode == "direct" else ""))
        rel = [f"(executable={xrsl_quote(script.SCRIPT_NAME)})",
               f"(jobname={xrsl_quote(f'{sub.name} [{sub.job_id}]')})",
               f"(stdout={xrsl_quote(script.LOG_NAME)})", "(join=\"yes\")",
               "(inputfiles=" + "".join(f"({xrsl_quote(n)} {xrsl_quote(s)})"
                                        for n, s in inputs) + ")",
               f"(count={r.node_count * r.processes_per_node * (r.cpu_cores_per_process or 1)})"]
        if a.duration:
            rel.append(f"(walltime={xrsl_quote(str(math.ceil(a.duration / 60)))})")
        if r.memory:
            rel.append(f"(memory={math.ceil(r.memory / (1024 * 1024))})")
        queue = a.queue_name or self.config.get("queue")
        if queue:
            rel.append(f"(queue={xrsl_quote(queue)})")
        return "&" + "".join(rel)

    def _session_uploads(self, sub: Submission) -> list[tuple[str, bytes | Path]]:
        text = script.render(sub, job_dir=None, stage_in_direct=False)  # the CE fetches them
        out: list[tuple[str, bytes | Path]] = [
            (script.SCRIPT_NAME, text.encode()),
            (script.PARAMETERS_NAME, script.parameters_json(sub).encode()),
            (INPUTS_FILE, json.dumps(sorted(set(sub.files) | {i.name for i in sub.inputs}))
             .encode())]
        out += [(name, Path(local)) for name, local in sub.files.items()]
        out += [(i.name, Path(i.source)) for i in sub.inputs if i.mode == "upload"]
        return out

    def submit(self, sub: Submission) -> str:
        found = self._find_job(sub.job_id)
        if found is not None:
            jid, state = found
            if state == "ACCEPTING":  # created earlier, inputs not all there: finish that
                self._upload(jid, sub)
            return jid
        desc = self.xrsl(sub)
        queue = sub.spec.attributes.queue_name or self.config.get("queue")
        delegation = self._delegation_id()
        results = self._call(lambda c: c.createJobs(desc, queue, delegation, isADL=False))
        res = results[0]
        if res.error:
            raise ProviderError(f"the CE refused the job: {res.value}")
        jid, _state = res.value
        self._upload(jid, sub)
        return jid

    def _upload(self, jid: str, sub: Submission) -> None:
        for name, content in self._session_uploads(sub):
            if isinstance(content, Path) and content.is_dir():
                for child in sorted(content.rglob("*")):
                    if child.is_file():
                        rel = f"{name}/{child.relative_to(content).as_posix()}"
                        self._put(jid, rel, child.read_bytes())
                continue
            data = content.read_bytes() if isinstance(content, Path) else content
            self._put(jid, name, data)

    def _put(self, jid: str, name: str, data: bytes) -> None:
        def go(c):
            resp = c._request("PUT", f"/jobs/{jid}/session/{name}", data=data)
            text = resp.read().decode(errors="replace")
            if resp.status != 200:
                from pyarcrest.errors import ARCHTTPError

                raise ARCHTTPError(resp.status, text)

        self._call(go)

    def _find_job(self, job_id: str) -> tuple[str, str] | None:
        ids = self._call(lambda c: c.getJobsList())
        if not ids:
            return None
        infos = self._call(lambda c: c.getJobsInfo(ids))
        for jid, res in zip(ids, infos, strict=False):
            if not res.error and res.value.get("Name", "").endswith(f"[{job_id}]"):
                return jid, res.value.get("state", "")
        return None

    def find(self, token: str, job_id: str) -> str | None:
        found = self._find_job(job_id)
        if found is None or found[1] == "ACCEPTING":
            return None  # not there, or its inputs are incomplete: submit() finishes it
        return found[0]

    # watching ------------------------------------------------------------------------------------
    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        ids = [j.native_id for j in jobs]
        results = self._call(lambda c: c.getJobsStatus(ids))
        out: dict[str, JobStatus] = {}
        need_info = []
        for jid, res in zip(ids, results, strict=True):
            if res.error:
                status = getattr(res.value, "status", None)
                if status == 404:
                    out[jid] = JobStatus(FAILED, "WIPED", "the CE no longer knows the job "
                                                          "(cleaned?)")
                else:
                    raise BackendUnavailable(f"status of {jid}: {res.value}")
                continue
            native = res.value
            state = common_state(native)
            out[jid] = JobStatus(state, native)
            if state in (SUCCEEDED, FAILED):
                need_info.append(jid)
        if need_info:
            infos = self._call(lambda c: c.getJobsInfo(need_info))
            for jid, res in zip(need_info, infos, strict=False):
                if res.error:
                    continue
                info = res.value
                st = out[jid]
                if info.get("ExitCode") is not None:
                    st.exit_code = int(info["ExitCode"])
                if info.get("Error"):
                    st.message = "; ".join(str(x) for x in info["Error"])[:1000]
        return out

    def cancel(self, job: JobRef) -> None:
        results = self._call(lambda c: c.killJobs([job.native_id]))
        if results and results[0].error and getattr(results[0].value, "status", 0) != 404:
            raise ProviderError(f"the CE did not kill the job: {results[0].value}")

    def _get(self, job: JobRef, rel: str, offset: int = 0, limit: int | None = None) -> bytes:
        def go(c):
            headers = {"Range": f"bytes={offset}-"} if offset else {}
            resp = c._request("GET", f"/jobs/{job.native_id}/session/{rel}", headers=headers)
            if resp.status == 416:
                resp.read()
                return b""
            if resp.status not in (200, 206):
                from pyarcrest.errors import ARCHTTPError

                raise ARCHTTPError(resp.status, resp.read().decode(errors="replace"))
            return resp.read() if limit is None else resp.read(limit)

        return self._call(go)

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        try:
            data = self._get(job, script.LOG_NAME, offset, limit)
        except NotFoundError:
            return LogChunk("", offset, eof=True)
        return LogChunk(data.decode("utf-8", errors="replace"), offset + len(data),
                        eof=len(data) < limit)

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        skip = set(script.SCAFFOLDING) | {script.LOG_NAME, INPUTS_FILE}
        try:
            skip |= set(json.loads(self._get(job, INPUTS_FILE)))
        except (NotFoundError, ValueError):
            pass
        out: list[OutputFile] = []

        def walk(rel: str) -> None:
            listing = self._call(lambda c: c.downloadListing(job.native_id, rel))
            for f in listing["file"]:
                name = f"{rel}{f}"
                if name not in skip and name.split("/", 1)[0] not in skip:
                    out.append(OutputFile(name))
            for d in listing["dirs"]:
                if d not in skip and not d.startswith("."):
                    walk(f"{rel}{d}/")

        walk("")
        return sorted(out, key=lambda o: o.name)

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        return self._get(job, self._inside(name), 0, limit)

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        out = []
        for name in names:
            target = dest / name
            rel = self._inside(name)
            self._call(lambda c, r=rel, t=target: c.downloadFile(job.native_id, r, str(t)))
            out.append(target)
        return out

    @staticmethod
    def _inside(name: str) -> str:
        rel = posixpath.normpath(name)
        if rel.startswith("/") or rel.startswith(".."):
            raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
        return rel

    def clean(self, job: JobRef) -> None:
        try:
            self._call(lambda c: c.cleanJobs([job.native_id]))
        except CloudTikError:
            pass


def _text(text: str) -> str:
    try:
        data = json.loads(text)
        return str(data.get("message") or data)[:500]
    except (ValueError, AttributeError):
        return (text or "")[:500]


def _min(*values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None
