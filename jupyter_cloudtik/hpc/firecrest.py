"""``firecrest``: jobs on a system behind a FirecREST v2 API, through pyfirecrest.

Authentication is OIDC client credentials (``client_id`` in the config, the client secret
in the secret store as ``client_secret``); pyfirecrest renews the token, and a token the
service stops accepting (key rotation, revocation) is dropped and fetched again once.

Each job gets a folder ``<workdir>/<job id>`` on the system: the notebook, parameters and
inputs are uploaded there (small files directly, large ones through FirecREST's staged
transfer: a multipart upload to its object store, moved into place by a transfer job),
the rendered batch script is submitted with ``working_dir`` set to it, and results are
listed and downloaded from it (again staged when large).  One ``GET /compute/{system}/
jobs`` answers for all jobs of the backend at each poll.
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path
from typing import Any

from ..core.errors import CloudTikError, ConfigError, NotFoundError, ProviderError
from . import script
from .base import (
    FAILED,
    SUCCEEDED,
    BackendUnavailable,
    HPCBackend,
    JobRef,
    JobStatus,
    Limits,
    LogChunk,
    OutputFile,
    Submission,
    parse_duration,
)
from .files import INPUTS_LIST, input_names
from .slurm import FAILURE_TEXT, common_state, slurm_time

LIMITS_TTL = 60.0


class FirecrestBackend(HPCBackend):
    kind = "firecrest"
    description = "an HPC system behind a FirecREST v2 API"
    config_schema = {
        "type": "object",
        "required": ["url", "system"],
        "properties": {
            "type": {"const": "firecrest"},
            "url": {"type": "string", "description": "FirecREST API base URL"},
            "system": {"type": "string", "description": "the system's name in FirecREST"},
            "token_uri": {"type": "string", "description": "OIDC token endpoint"},
            "client_id": {"type": "string"},
            "workdir": {"type": "string", "description": "folder of the jobs' folders"},
            "partition": {"type": "string"},
            "account": {"type": "string"},
            "verify": {"type": ["boolean", "string"]},
            "timeout": {"type": "number", "exclusiveMinimum": 0},
            "reaches": {"type": "array", "items": {"type": "string"}},
            "environment": {"type": "object"},
            "limits": {"type": "object"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        if not self.config.get("token_uri") or not self.config.get("client_id"):
            raise ConfigError(f"backends.{name}: token_uri and client_id are required "
                              "(OIDC client credentials)", field=f"backends.{name}.token_uri")
        self._client = None
        self._auth = None
        self._workdir: str | None = None
        self._limits: tuple[float, Limits] | None = None

    # the client ------------------------------------------------------------------------------
    @property
    def system(self) -> str:
        return self.config["system"]

    def client(self):
        if self._client is None:
            import firecrest as f7t

            secret = self.context.secret("client_secret")
            if not secret:
                raise ConfigError(
                    f"backend '{self.name}' has no client secret; set it with `jupyter cloudtik"
                    f" jobs secret {self.name} client_secret`", field="client_secret")
            self._auth = f7t.ClientCredentialsAuth(self.config["client_id"], secret,
                                                   self.config["token_uri"])
            self._auth.timeout = float(self.config.get("timeout", 30))
            self._auth.disable_client_logging = True
            self._client = f7t.v2.Firecrest(self.config["url"], authorization=self._auth,
                                            verify=self.config.get("verify", True))
            self._client.timeout = float(self.config.get("timeout", 30))
            self._client.num_retries_rate_limit = 2
            self._client.disable_client_logging = True
        return self._client

    def _call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """A pyfirecrest call with FirecREST's failures turned into ours."""
        import firecrest as f7t
        import httpx
        import requests

        for attempt in (1, 2):
            client = self.client()
            try:
                return getattr(client, fn_name)(*args, **kwargs)
            except f7t.ClientsCredentialsException as e:
                status = _status(e)
                if status is None or status >= 500 or status == 429:
                    raise BackendUnavailable(f"the token service did not answer ({status})") \
                        from None
                raise ProviderError(
                    f"the token service refused the client credentials of backend "
                    f"'{self.name}' (HTTP {status}); check client_id and the client_secret "
                    "secret") from None
            except f7t.FirecrestException as e:
                status, message = _status(e), _message(e)
                if status == 401 and attempt == 1:
                    self._auth._access_token = None  # rotated or revoked: fetch a new one
                    continue
                if status is None or status >= 500 or status == 429:
                    raise BackendUnavailable(f"FirecREST answered {status}: {message}") \
                        from None
                if status == 404:
                    raise NotFoundError(f"FirecREST: {message}", field="job") from None
                if status in (401, 403):
                    raise ProviderError(f"FirecREST refused the request ({status}): "
                                        f"{message}") from None
                raise ProviderError(f"FirecREST refused the request ({status}): {message}") \
                    from None
            except (httpx.TransportError, requests.ConnectionError, requests.Timeout) as e:
                raise BackendUnavailable(f"cannot reach {self.config['url']}: "
                                         f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            wd = self.config.get("workdir")
            if not wd:
                systems = self._call("systems")
                mine = next((s for s in systems if s.get("name") == self.system), None)
                if mine is None:
                    raise ConfigError(f"backends.{self.name}.system: FirecREST has no system "
                                      f"'{self.system}'", field=f"backends.{self.name}.system")
                fs = [f for f in mine.get("fileSystems") or [] if f.get("defaultWorkDir")]
                if not fs:
                    raise ConfigError(f"backends.{self.name}.workdir: the system has no "
                                      "default work folder; set workdir",
                                      field=f"backends.{self.name}.workdir")
                wd = fs[0]["path"].rstrip("/") + "/cloudtik-jobs"
            self._workdir = wd.rstrip("/")
        return self._workdir

    def folder(self, job_id: str) -> str:
        if "/" in job_id or job_id in ("", ".", ".."):
            raise ConfigError(f"job: {job_id!r} is not a job id", field="job")
        return f"{self.workdir}/{job_id}"

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["where"] = f"{self.config['url']} ({self.system})"
        return d

    # limits ------------------------------------------------------------------------------------
    def limits(self) -> Limits:
        now = time.monotonic()
        if self._limits and now - self._limits[0] < LIMITS_TTL:
            return self._limits[1]
        lim = super().limits()
        parts = self._call("partitions", self.system)
        names = []
        for p in parts:
            name = p.get("name")
            if not name:
                continue
            names.append(name)
            q = lim.per_queue.get(name) or Limits()
            if p.get("totalNodes"):
                q.max_nodes = _min(q.max_nodes, int(p["totalNodes"]), lim.max_nodes)
            if p.get("cpus"):
                q.max_cpus_per_node = _min(q.max_cpus_per_node, int(p["cpus"]),
                                           lim.max_cpus_per_node)
            max_time = p.get("maxTime")
            q.max_duration = _min(q.max_duration, float(max_time) if max_time else None,
                                  lim.max_duration)
            q.max_memory_per_node = _min(q.max_memory_per_node, lim.max_memory_per_node)
            lim.per_queue[name] = q
            if p.get("default") and not lim.default_queue:
                lim.default_queue = name
        if names:
            lim.queues = names
        lim.default_queue = self.config.get("partition") or lim.default_queue
        self._limits = (now, lim)
        return lim

    # submitting --------------------------------------------------------------------------------
    def directives(self, sub: Submission, folder: str) -> list[str]:
        r, a = sub.spec.resources, sub.spec.attributes
        d = [f"--job-name={sub.name}", f"--output={folder}/{script.LOG_NAME}",
             f"--nodes={r.node_count}", f"--ntasks-per-node={r.processes_per_node}"]
        if r.cpu_cores_per_process:
            d.append(f"--cpus-per-task={r.cpu_cores_per_process}")
        if r.memory:
            d.append(f"--mem={-(-r.memory // (1024 * 1024))}M")
        if a.duration:
            d.append(f"--time={slurm_time(a.duration)}")
        if a.reservation_id:
            d.append(f"--reservation={a.reservation_id}")
        return [f"#SBATCH {x}" for x in d]

    def _upload_bytes(self, folder: str, name: str, data: bytes) -> None:
        self._call("upload", self.system, io.BytesIO(data), folder, name,
                   file_size=len(data), account=self.config.get("account"))

    def submit(self, sub: Submission) -> str:
        folder = self.folder(sub.job_id)
        self._call("mkdir", self.system, f"{folder}/{script.MARKER_DIR}", create_parents=True)
        for name, local in sub.files.items():
            self._upload_path(Path(local), folder, name)
        for item in sub.inputs:
            if item.mode == "upload":
                self._upload_path(Path(item.source), folder, item.name)
        self._upload_bytes(folder, script.PARAMETERS_NAME, script.parameters_json(sub).encode())
        self._upload_bytes(f"{folder}/{script.MARKER_DIR}", INPUTS_LIST,
                           ("\n".join(input_names(sub)) + "\n").encode())
        text = script.render(sub, directives=self.directives(sub, folder), job_dir=folder)
        self._upload_bytes(folder, script.SCRIPT_NAME, text.encode())
        a = sub.spec.attributes
        res = self._call("submit", self.system, folder, script_str=text,
                         account=a.account or self.config.get("account"),
                         partition=a.queue_name or self.config.get("partition"))
        return str(res["jobId"])

    def _upload_path(self, local: Path, folder: str, name: str) -> None:
        if local.is_dir():
            self._call("mkdir", self.system, f"{folder}/{name}", create_parents=True)
            for child in sorted(local.rglob("*")):
                rel = child.relative_to(local).as_posix()
                target = f"{folder}/{name}/{rel}"
                if child.is_dir():
                    self._call("mkdir", self.system, target, create_parents=True)
                else:
                    parent, _, fname = target.rpartition("/")
                    self._call("upload", self.system, str(child), parent, fname,
                               account=self.config.get("account"))
            return
        self._call("upload", self.system, str(local), folder, name,
                   account=self.config.get("account"))

    def find(self, token: str, job_id: str) -> str | None:
        folder = self.folder(job_id)
        for job in self._call("job_info", self.system):
            if (job.get("workingDirectory") or "").rstrip("/") == folder:
                return str(job["jobId"])
        return None

    # watching ------------------------------------------------------------------------------------
    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        listed = {str(j["jobId"]): j for j in self._call("job_info", self.system)}
        out = {}
        for job in jobs:
            info = listed.get(job.native_id)
            if info is None:
                try:
                    found = self._call("job_info", self.system, job.native_id)
                    info = found[0] if found else None
                except NotFoundError:
                    info = None
            out[job.native_id] = self._status(job, info) if info else self._forgotten(job)
        return out

    def _status(self, job: JobRef, info: dict[str, Any]) -> JobStatus:
        st = info.get("status") or {}
        native = st.get("state") or ""
        if isinstance(native, list):
            native = ",".join(native)
        state = common_state(native)
        reason = st.get("stateReason")
        message = None if reason in (None, "None", "") else reason
        if state == FAILED:
            message = FAILURE_TEXT.get(native, message or native.lower())
        status = JobStatus(state, native, message)
        if status.final:
            code = st.get("exitCode")
            status.exit_code = int(code) if code is not None else None
            if state == SUCCEEDED and status.exit_code:
                status.state, status.message = FAILED, f"exit code {status.exit_code}"
        return status

    def _forgotten(self, job: JobRef) -> JobStatus:
        try:
            code = self._view(f"{self.folder(job.id)}/{script.MARKER_DIR}/exitcode").strip()
        except NotFoundError:
            return JobStatus(FAILED, "UNKNOWN", "FirecREST no longer knows the job and it left "
                                                "no exit code")
        rc = int(code) if code.lstrip("-").isdigit() else -1
        if rc == 0:
            return JobStatus(SUCCEEDED, "COMPLETED", exit_code=0)
        return JobStatus(FAILED, "FAILED", f"exit code {rc}", exit_code=rc)

    def _view(self, path: str) -> str:
        out = self._call("view", self.system, path)
        return out if isinstance(out, str) else (out or {}).get("content", "")

    def cancel(self, job: JobRef) -> None:
        try:
            self._call("cancel_job", self.system, job.native_id)
        except NotFoundError:
            pass

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        path = f"{self.folder(job.id)}/{script.LOG_NAME}"
        try:
            out = self._call("tail", self.system, path, num_bytes=offset + 1,
                             exclude_beginning=True)
        except NotFoundError:
            return LogChunk("", offset, eof=True)
        content = out.get("content", "") if isinstance(out, dict) else str(out)
        data = content.encode()[:limit]
        return LogChunk(data.decode(errors="replace"), offset + len(data),
                        eof=len(data) < limit)

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        folder = self.folder(job.id)
        skip = set(script.SCAFFOLDING) | {script.LOG_NAME}
        try:
            skip |= set(self._view(f"{folder}/{script.MARKER_DIR}/{INPUTS_LIST}").splitlines())
        except NotFoundError:
            pass
        out = []
        for f in self._call("list_files", self.system, folder, recursive=True):
            name = f.get("name", "")
            if f.get("type") == "d" or name.split("/", 1)[0] in skip or name in skip:
                continue
            size = f.get("size")
            out.append(OutputFile(name, int(size) if str(size).isdigit() else None))
        return sorted(out, key=lambda o: o.name)

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        path = self._inside(job, name)
        with tempfile.TemporaryDirectory(prefix="cloudtik-f7t-") as tmp:
            target = Path(tmp) / "file"
            self._download(path, target)
            with open(target, "rb") as f:
                return f.read(limit)

    def _download(self, path: str, target: Path) -> None:
        try:
            self._call("download", self.system, path, str(target),
                       account=self.config.get("account"))
        except FileNotFoundError:
            raise NotFoundError(f"the job has no file {path}", field="name") from None

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        out = []
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            self._download(self._inside(job, name), target)
            out.append(target)
        return out

    def _inside(self, job: JobRef, name: str) -> str:
        import posixpath

        folder = self.folder(job.id)
        path = posixpath.normpath(f"{folder}/{name}")
        if not path.startswith(folder + "/"):
            raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
        return path

    def clean(self, job: JobRef) -> None:
        try:
            self._call("rm", self.system, self.folder(job.id))
        except CloudTikError:
            pass

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close_session()
            except Exception:
                pass
            self._client = None


def _status(e: Exception) -> int | None:
    responses = getattr(e, "responses", None) or []
    return responses[-1].status_code if responses else None


def _message(e: Exception) -> str:
    responses = getattr(e, "responses", None) or []
    if not responses:
        return str(e)
    try:
        body = responses[-1].json()
        return str(body.get("message") or body.get("detail") or body)[:500]
    except Exception:
        return responses[-1].text[:500]


def _min(*values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


__all__ = ["FirecrestBackend", "parse_duration"]
