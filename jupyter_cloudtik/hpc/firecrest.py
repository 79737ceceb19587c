"""``firecrest``: jobs on a system behind a FirecREST v2 API, through pyfirecrest.

Authentication is OIDC client credentials (``client_id`` in the config, the client secret
in the secret store as ``client_secret``); pyfirecrest renews the token — early enough for
FirecREST, which refuses a token with less than 30 s left — and a token the service stops
accepting (key rotation, revocation) is dropped and fetched again once.

Each job gets a folder ``<workdir>/<job id>`` on the system: the notebook, parameters and
inputs are uploaded there (small files directly, large ones through FirecREST's staged
transfer: a multipart upload to its object store, moved into place by a transfer job),
the rendered batch script is submitted with ``working_dir`` set to it, and results are
listed and downloaded from it (again staged when large).  One ``GET /compute/{system}/
jobs`` answers for all jobs of the backend at each poll.

What the real FirecREST v2 server does and this backend relies on (see the table in
docs/hpc.md): the default work folder is ``<defaultWorkDir mount>/<user name>`` — the
mount itself is not writable by users; partitions carry no default and no time limit
(``{name, cpus (all of the partition's), totalNodes, partition (its state)}``), so time
limits come from the config and a job Slurm will never start (``PartitionTimeLimit``...)
is cancelled and failed with Slurm's reason instead of waiting forever — but only on a
reason that is final: the first answers may be provisional (``PartitionConfig`` before
``PartitionTimeLimit``), and those keep the job queued with the reason shown as such,
until a ``PartitionConfig`` has lasted ``settle_time`` (then it is Slurm's final word);
system names match in any case there (our calls use the server's spelling); an account
the user may not charge is a 500 (said in one line naming the account); ``view`` reads
two blocks of ``size`` and answers 413 when they reach the direct limit, and cuts its
answer in characters (we read aligned blocks of under half the limit, and larger files
through the download path); a direct download is base64 through the same limit, so files
over 3/4 of it are downloaded staged; Slurm's refusals
(sbatch, scancel) come back as HTTP 500 with Slurm's own text — a refused submit is a
permanent failure, not "backend down" — and Slurm's accounting records a refused
submission as a FAILED job that never got a node, which ``find`` must not adopt.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

from ..core.errors import (
    BackendUnavailable,
    CloudTikError,
    ConfigError,
    NotFoundError,
    ProviderError,
)
from ..core.units import parse_duration
from ..transport.slurm import UNREACHABLE
from . import script
from .base import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    HPCBackend,
    JobRef,
    JobStatus,
    Limits,
    Submission,
)
from .files import INPUTS_LIST, input_names
from .firecrest_array import FirecrestArrays, expand_listing, never_ran
from .firecrest_env import FirecrestEnvShell
from .firecrest_files import DEFAULT_OPS_LIMIT, FirecrestFiles, _int
from .slurm import FAILURE_TEXT, common_state, first_word, slurm_time
from .slurm_reasons import NEVER_STARTS, PROVISIONAL, SETTLE_TIME, SETTLES, TIME_REASONS

LIMITS_TTL = 60.0
# FirecREST refuses tokens with less than this left (OIDCTokenAuth.min_token_ttl = 30 s);
# renew before that, with a margin for the request itself
MIN_TOKEN_VALIDITY = 45
# the widest time_window of FirecREST's job listing (see _history)
HISTORY_WINDOW = "7d"
# FirecREST answers 403 (SlurmQuotaError) when sbatch's stderr names a limit of this shape
# (QUOTA_ERROR_PATTERN in scheduler_clients/slurm/cli_commands/sbatch_command.py)
QUOTA_PATTERN = re.compile(r"\b(?:QOS|Assoc)(?:Max|Min)\w*Limit\b", re.IGNORECASE)
# what the common ones bound (Slurm's job_reason strings, slurm.h / sacctmgr's QOS options)
QUOTA_LIMITS = {
    "QOSMaxSubmitJobPerUserLimit": "MaxSubmitJobsPerUser: the most jobs you may have queued "
                                   "or running under the QOS",
    "AssocMaxSubmitJobLimit": "MaxSubmitJobs: the most jobs the account may have queued or "
                              "running",
    "QOSMaxWallDurationPerJobLimit": "MaxWall: the longest time limit a job may ask for",
    "AssocMaxWallDurationPerJobLimit": "MaxWall of the account: the longest time limit a "
                                       "job may ask for",
    "QOSMaxCpuPerUserLimit": "MaxTRESPerUser cpu: the most CPUs you may use at once",
    "QOSMaxNodePerJobLimit": "MaxTRESPerJob node: the most nodes a job may ask for",
}


class _ServerError(BackendUnavailable):
    """A 5xx from FirecREST: usually "try later", but Slurm's refusals come as 500 too."""

    def __init__(self, message: str, status: int | None, detail: str) -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


def _slurm_text(detail: str) -> str:
    """Slurm's own words from FirecREST's "Unexpected Slurm command response.
    exit_status:1 std_err:sbatch: error: ..." message."""
    text = detail.split("std_err:", 1)[-1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return "; ".join(lines) or detail


def _slurm_refused(detail: str) -> bool:
    """Did sbatch run and say no (vs. FirecREST or Slurm being unreachable)?"""
    if any(s in detail for s in UNREACHABLE):
        return False
    return "std_err:sbatch" in detail or "Batch job submission failed" in detail \
        or "sbatch: error" in detail or "sbatch: unrecognized option" in detail


class FirecrestBackend(FirecrestArrays, FirecrestFiles, HPCBackend):
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
            "settle_time": {"type": "number", "minimum": 0,
                            "description": "seconds a provisional pending reason "
                                           "(PartitionConfig) must last to count as final"},
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
        self._system_info: dict[str, Any] | None = None
        self._dl_client = None  # downloads: see _download_client
        # job id -> (provisional reason, when first seen): a reason that lasts settles
        self._provisional: dict[str, tuple[str, float]] = {}
        self._element_cancels: set[str] = set()  # array tasks cancelled while pending

    # the client ------------------------------------------------------------------------------
    @property
    def system(self) -> str:
        """The system's name as the server spells it: FirecREST matches system names in any
        case (issue 29's outside check), so ``TestSys`` in the config is its ``testsys``."""
        return self.system_info().get("name") or self.config["system"]

    def client(self):
        if self._client is None:
            import firecrest as f7t

            secret = self.context.secret("client_secret")
            if not secret:
                raise ConfigError(
                    f"backend '{self.name}' has no client secret; set it with `jupyter cloudtik"
                    f" jobs secret {self.name} client_secret`", field="client_secret")
            self._auth = f7t.ClientCredentialsAuth(self.config["client_id"], secret,
                                                   self.config["token_uri"],
                                                   min_token_validity=MIN_TOKEN_VALIDITY)
            self._auth.timeout = float(self.config.get("timeout", 30))
            self._auth.disable_client_logging = True
            self._client = self._new_client()
            self._apply_direct_limit()
        return self._client

    def _new_client(self):
        import firecrest as f7t

        client = f7t.v2.Firecrest(self.config["url"], authorization=self._auth,
                                  verify=self.config.get("verify", True))
        client.timeout = float(self.config.get("timeout", 30))
        client.num_retries_rate_limit = 2
        client.disable_client_logging = True
        return client

    def _download_client(self):
        """A second client, on the same token, for downloads: FirecREST sends a direct
        download as ``base64 --wrap=0`` over SSH (ops/router.py get_download,
        Base64Command), and that output — 4/3 of the file — must stay under
        ``max_ops_file_size`` (SSHClient.execute: 413 "Command output exceeded buffer
        limit."), so pyfirecrest's threshold for downloads is lower than for uploads."""
        self.client()
        if self._dl_client is None:
            self._dl_client = self._new_client()
        self._dl_client.MAX_DIRECT_UPLOAD_SIZE = self.direct_download_max + 1
        return self._dl_client

    @property
    def direct_download_max(self) -> int:
        """The largest file FirecREST sends directly: its base64 (4 bytes per 3) under
        the limit."""
        limit = self.max_direct_size or DEFAULT_OPS_LIMIT
        return 3 * ((limit - 1) // 4)

    def _download_with(self, path: str, target: str, account: str | None) -> None:
        self._download_client().download(self.system, path, target, account=account)

    def _call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """A pyfirecrest call with FirecREST's failures turned into ours."""
        import firecrest as f7t
        import httpx
        import requests
        from firecrest.FirecrestException import (
            MultipartUploadException,
            TransferJobFailedException,
        )

        for attempt in (1, 2):
            client = self.client()
            try:
                if fn_name.startswith("_"):  # our own request helpers
                    return getattr(self, fn_name)(*args, **kwargs)
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
                if "Invalid account" in message:
                    # sbatch (of the job, or of a transfer job) refused the account: the
                    # real server answers 500, which is no outage
                    account = kwargs.get("account") or self.config.get("account")
                    raise ProviderError(
                        f"Slurm on '{self.config['system']}' refused account '{account}': "
                        f"{_slurm_text(message).split('failed: ')[-1]}; check the job's "
                        f"account or backends.{self.name}.account"
                        f"{self._chargeable()}") from None
                if status == 403 and _quota_limit(message):
                    raise ProviderError(self._quota_refusal(message)) from None
                if status == 401 and attempt == 1:
                    self._auth._access_token = None  # rotated or revoked: fetch a new one
                    continue
                # 424: FirecREST could not reach the system over SSH; 408: the command on
                # it timed out — both "try again later", as 5xx and 429 are
                if status is None or status >= 500 or status in (408, 424, 429):
                    raise _ServerError(f"FirecREST answered {status}: {message}", status,
                                       message) from None
                if status == 404:
                    raise NotFoundError(f"FirecREST: {message}", field="job") from None
                if status in (401, 403):
                    raise ProviderError(f"FirecREST refused the request ({status}): "
                                        f"{message}") from None
                raise ProviderError(f"FirecREST refused the request ({status}): {message}",
                                    status=status) from None
            except MultipartUploadException:
                # a part's PUT to the stage broke off: the submit is done again from the
                # start.  Not str(e): it holds the presigned URLs
                raise BackendUnavailable("FirecREST's staged upload broke off "
                                         "(MultipartUploadException); will try again") \
                    from None
            except TransferJobFailedException as e:
                # the transfer job ran on the system and failed: its error log says why
                raise ProviderError(self._transfer_failure(e)) from None
            except (httpx.TransportError, requests.ConnectionError, requests.Timeout) as e:
                raise BackendUnavailable(f"cannot reach {self.config['url']}: "
                                         f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _quota_refusal(self, message: str) -> str:
        """One line for FirecREST's 403 SlurmQuotaError: which limit, what it bounds, what
        to do — not an outage, so the submit is not tried again."""
        limit = _quota_limit(message)
        what = QUOTA_LIMITS.get(limit, "a limit of the account's QOS or association")
        submit = "Submit" in limit
        advice = ("wait for some of your jobs on it to finish (or cancel some), or ask the "
                  "site for a higher limit" if submit else
                  "ask for less, or use an account/QOS that allows it")
        return (f"Slurm on '{self.config['system']}' refused the job over a QOS limit: "
                f"{limit} ({what}); {advice}")

    def system_info(self) -> dict[str, Any]:
        """The system's entry of ``GET /status/systems`` (file systems, data operations)."""
        if self._system_info is None:
            systems = self._call("systems")
            wanted = str(self.config["system"]).lower()  # matched in any case, as FirecREST does
            mine = next((s for s in systems if str(s.get("name")).lower() == wanted), None)
            if mine is None:
                names = ", ".join(sorted(str(s.get("name")) for s in systems)) or "none"
                raise ConfigError(f"backends.{self.name}.system: FirecREST has no system "
                                  f"'{self.config['system']}' (it has: {names})",
                                  field=f"backends.{self.name}.system")
            self._system_info = mine
            self._apply_direct_limit()
        return self._system_info

    def _apply_direct_limit(self) -> None:
        """pyfirecrest moves files under 1 MiB directly, the rest staged; the server says
        what it takes directly (``dataOperation.max_ops_file_size``, 5 MiB by default)."""
        ops = (self._system_info or {}).get("dataOperation") or {}
        limit = _int(ops.get("max_ops_file_size") or ops.get("maxOpsFileSize"))
        if limit and self._client is not None:
            self._client.MAX_DIRECT_UPLOAD_SIZE = limit

    @property
    def max_direct_size(self) -> int | None:
        ops = self.system_info().get("dataOperation") or {}
        return _int(ops.get("max_ops_file_size") or ops.get("maxOpsFileSize"))

    @property
    def staged_transfers(self) -> bool:
        """The system has a staged transfer (``data_transfer`` set); without it FirecREST
        answers 500 to ``/transfer/*``."""
        ops = self.system_info().get("dataOperation")
        if ops is None:  # an older server that does not say: assume it has one
            return True
        return bool(ops.get("data_transfer") or ops.get("dataTransfer"))

    def _chargeable(self) -> str:
        """``; you may charge: a (default), b`` from userinfo's ``accounts`` (sacctmgr's
        associations of the user, firecrest-v2 ``get_accounts``), to put in a refusal;
        empty when the server does not say (no associations: ``null``) or cannot be
        asked — the refusal stands either way."""
        try:
            info = self._call("userinfo", self.system) or {}
        except CloudTikError:
            return ""
        names = [f"{a['name']} (default)" if a.get("default") else str(a["name"])
                 for a in info.get("accounts") or [] if isinstance(a, dict) and a.get("name")]
        return f"; you may charge: {', '.join(names)}" if names else ""

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            wd = self.config.get("workdir")
            if not wd:
                fs = [f for f in self.system_info().get("fileSystems") or []
                      if f.get("defaultWorkDir")]
                if not fs:
                    raise ConfigError(f"backends.{self.name}.workdir: the system has no "
                                      "default work folder; set workdir",
                                      field=f"backends.{self.name}.workdir")
                # the mount is not writable by users; FirecREST's own transfer jobs run
                # in <mount>/<user name>, and so do ours
                info = self._call("userinfo", self.system)
                user = ((info or {}).get("user") or {}).get("name")
                if not user:
                    raise ConfigError(f"backends.{self.name}.workdir: FirecREST did not say "
                                      "the user's name; set workdir",
                                      field=f"backends.{self.name}.workdir")
                wd = f"{fs[0]['path'].rstrip('/')}/{user}/cloudtik-jobs"
            self._workdir = wd.rstrip("/")
        return self._workdir

    def folder(self, job_id: str) -> str:
        if "/" in job_id or job_id in ("", ".", ".."):
            raise ConfigError(f"job: {job_id!r} is not a job id", field="job")
        return f"{self.workdir}/{job_id}"

    # the session's environment (hpc/environment.py): staged with FirecREST's file API
    # (large wheels through its staged transfer), built by the first job that needs it in
    # <workdir>/.cloudtik-envs, which every later job of the user sees
    def builds_environment(self) -> bool:
        """FirecREST runs jobs as the token's Unix account on the system's nodes, which
        have never seen this session's interpreter: its environment is built there unless
        the backend or the job names a Python (``environment.python``/``venv``)."""
        return True

    def environment_root(self) -> str:
        # deferred: start-up (hpc.environment ~14 ms, loads importlib.metadata)
        from .environment import ENVS_DIR

        return f"{self.workdir}/{ENVS_DIR}"

    def environment_shell(self):
        return FirecrestEnvShell(self)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["where"] = f"{self.config['url']} ({self.config['system']})"
        return d

    # limits ------------------------------------------------------------------------------------
    def limits(self) -> Limits:
        now = time.monotonic()
        if self._limits and now - self._limits[0] < LIMITS_TTL:
            return self._limits[1]
        lim = super().limits()
        # FirecREST's partition model: {name, cpus (TotalCPUs of the whole partition),
        # totalNodes, partition (its state, e.g. "UP")}: no default, no time limit — those
        # come from the config (limits.max_time, limits.queues.NAME.max_time, partition)
        parts = self._call("partitions", self.system) or []
        names = []
        for p in parts:
            name = p.get("name")
            if not name:
                continue
            names.append(name)
            q = lim.per_queue.get(name) or Limits()
            nodes = _int(p.get("totalNodes"))
            if nodes:
                q.max_nodes = _min(q.max_nodes, nodes, lim.max_nodes)
            cpus = _int(p.get("cpus"))
            if cpus:
                per_node = cpus // nodes if nodes else cpus
                q.max_cpus_per_node = _min(q.max_cpus_per_node, per_node,
                                           lim.max_cpus_per_node)
            q.max_duration = _min(q.max_duration, lim.max_duration)
            q.max_memory_per_node = _min(q.max_memory_per_node, lim.max_memory_per_node)
            lim.per_queue[name] = q
        if names:
            lim.queues = sorted(set(names) | set(lim.queues or []))
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
        text = self._prepare(sub)
        return self._sbatch(self.folder(sub.job_id), text, sub)

    def _prepare(self, sub: Submission) -> str:
        """The job's folder on the system (files, inputs, parameters, script); its script."""
        folder = self.folder(sub.job_id)
        self._check_sizes(sub)
        try:
            self._call("mkdir", self.system, f"{folder}/{script.MARKER_DIR}",
                       create_parents=True)
        except ProviderError as e:
            if isinstance(e, BackendUnavailable) or "Permission denied" not in str(e):
                raise
            raise ProviderError(f"{e}; set backends.{self.name}.workdir to a folder you "
                                "may write (e.g. <scratch>/<user>/cloudtik-jobs)") from None
        self.stage_environment(sub)  # a built environment's wheels and build script
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
        return text

    def _sbatch(self, folder: str, text: str, sub: Submission) -> str:
        a = sub.spec.attributes
        try:
            res = self._call("submit", self.system, folder, script_str=text,
                             account=a.account or self.config.get("account"),
                             partition=a.queue_name or self.config.get("partition"))
        except _ServerError as e:
            # FirecREST answers 500 when sbatch says no: that is Slurm's final word (a retry
            # would be refused again — and leave one more FAILED record in accounting)
            if _slurm_refused(e.detail):
                raise ProviderError(f"Slurm refused the job: {_slurm_text(e.detail)}") \
                    from None
            raise
        return str(res["jobId"])

    def _check_sizes(self, sub: Submission) -> None:
        """Without a staged transfer, files over the direct limit cannot be moved: say so
        before anything is uploaded (FirecREST would answer 413, then 500)."""
        if self.staged_transfers:
            return
        limit = self.max_direct_size
        if not limit:
            return
        locals_ = [Path(p) for p in sub.files.values()] + [
            Path(i.source) for i in sub.inputs if i.mode == "upload"]
        for path in locals_:
            files = [path] if path.is_file() else [c for c in path.rglob("*") if c.is_file()]
            for f in files:
                size = f.stat().st_size
                if size >= limit:
                    raise ProviderError(
                        f"inputs: {f.name} is {size} bytes; FirecREST on '{self.system}' "
                        f"moves files under {limit} bytes directly and offers no staged "
                        "transfer; put the file on the system and give its path "
                        f"({self.name}:/path) instead")

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
        """The job a previous submit attempt made, if any.  FirecREST lists finished jobs
        only within its ``time_window`` (24 h unless asked; at most 7 d), so an attempt
        whose job ended before that is not listed: its id is then read from the job's
        folder (the script writes ``.cloudtik/native_id`` when it starts), rather than
        taking "not listed" for "never submitted" and running the job a second time."""
        folder = self.folder(job_id)
        for job in self._history():
            if (job.get("workingDirectory") or "").rstrip("/") != folder:
                continue
            if never_ran(job):
                continue  # a refused submission that accounting recorded as FAILED
            return str(job["jobId"])
        try:
            ran = self._view(f"{folder}/{script.MARKER_DIR}/native_id").strip()
        except NotFoundError:
            return None  # never started: pending jobs are always listed, so none was made
        return ran if ran.isdigit() else None

    def _history(self) -> list[dict[str, Any]]:
        """``GET /compute/{system}/jobs`` with the widest ``time_window`` it takes
        (JobsTimeWindow, scheduler_clients/models.py: 1h, 8h, 24h, 3d, 7d; default 24h);
        a server before 2.6.0 has no such parameter (pyfirecrest refuses it): its default
        then, and ``find`` falls back on the job's folder."""
        from firecrest.FirecrestException import NotImplementedOnAPIversion

        try:
            return self._call("job_info", self.system, time_window=HISTORY_WINDOW) or []
        except NotImplementedOnAPIversion:
            return self._call("job_info", self.system) or []

    # watching ------------------------------------------------------------------------------------
    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        listed = expand_listing(self._call("job_info", self.system) or [])
        out = {}
        for job in jobs:
            info = listed.get(job.native_id)
            if info is None and "_" in job.native_id:  # an array's task (firecrest_array)
                info = self._array_task(job.native_id, listed)
            elif info is None:
                try:
                    found = self._call("job_info", self.system, job.native_id)
                    info = found[0] if found else None
                except NotFoundError:
                    info = None
            out[job.native_id] = self._status(job, info) if info else self._forgotten(job)
        return out

    def _status(self, job: JobRef, info: dict[str, Any]) -> JobStatus:
        if "_" in job.native_id:
            return self._element_status(job, self._job_status(job, info))
        return self._job_status(job, info)

    def _job_status(self, job: JobRef, info: dict[str, Any]) -> JobStatus:
        st = info.get("status") or {}
        native = st.get("state") or ""
        if isinstance(native, list):
            native = native[0] if native else ""
        state = common_state(native)
        native = first_word(native)  # "CANCELLED by 1001"
        reason = st.get("stateReason")
        message = None if reason in (None, "None", "", "(null)") else reason
        if native == "PENDING" and reason in NEVER_STARTS:
            self._provisional.pop(job.native_id, None)
            return self._never_starts(job, reason, info)
        if native == "PENDING" and reason in PROVISIONAL:
            seen, since = self._provisional.get(job.native_id, (None, 0.0))
            if seen != reason:
                since = time.monotonic()
                self._provisional[job.native_id] = (reason, since)
            waited = time.monotonic() - since
            if reason in SETTLES and waited >= self._settle_time:
                self._provisional.pop(job.native_id, None)
                return self._never_starts(job, reason, info, waited)
            return JobStatus(state, native, f"pending: {reason} (may change; "
                                            f"{PROVISIONAL[reason]})")
        self._provisional.pop(job.native_id, None)
        if state == FAILED:
            message = FAILURE_TEXT.get(native, message or native.lower())
        status = JobStatus(state, native, message)
        if status.final:
            code, signal = _int(st.get("exitCode")), _int(st.get("interruptSignal"))
            status.exit_code = code
            if state == SUCCEEDED and status.exit_code:
                status.state, status.message = FAILED, f"exit code {status.exit_code}"
            elif state == FAILED and not code and signal:
                # e.g. a working folder that is not there: Slurm ends the batch step at once
                status.message = f"{status.message}; the job script was ended by signal " \
                                 f"{signal} (is the job's folder there?)"
        return status

    def _partition_max_time(self, partition: str) -> float | None:
        """The partition's time limit as the config gives it (FirecREST does not say)."""
        try:
            lim = self.limits()
        except CloudTikError:
            return None
        q = lim.per_queue.get(partition)
        return (q.max_duration if q else None) or lim.max_duration

    @property
    def _settle_time(self) -> float:
        value = self.config.get("settle_time")
        return SETTLE_TIME if value is None else float(value)

    def _never_starts(self, job: JobRef, reason: str, info: dict[str, Any],
                      waited: float | None = None) -> JobStatus:
        """Slurm keeps such a job pending forever: cancel it and say why, in Slurm's word
        (and with the job's time limit when that is what is too long)."""
        try:
            # an array's tasks share its resources: none will start, so all of it goes
            self.cancel(JobRef(job.id, job.native_id.split("_", 1)[0]))
        except ProviderError:
            pass  # it is failed for us either way; the next poll tries again if it stays
        if waited is not None:
            why = f"{SETTLES[reason]}; Slurm kept this reason for {waited:.0f} s"
        else:
            why = NEVER_STARTS[reason]
        if reason in TIME_REASONS:
            limit = _int((info.get("time") or {}).get("limit"))  # seconds, as FirecREST says
            asked = slurm_time(limit) if limit else "(not said)"
            if reason == "PartitionTimeLimit":
                part = info.get("partition") or self.config.get("partition") or "?"
                why = f"its time limit {asked} is longer than partition '{part}' allows"
                allowed = self._partition_max_time(part)
                if allowed:
                    why += f" ({slurm_time(allowed)} in backends.{self.name}.limits)"
            else:
                why = f"{why}: {asked}"
        return JobStatus(FAILED, "PENDING", f"Slurm will never start it: {reason} ({why})")

    def _forgotten(self, job: JobRef) -> JobStatus:
        if "_" in job.native_id and self._element_cancelled(job):
            return JobStatus(CANCELLED, "CANCELLED", "cancelled (its cancel marker)")
        try:
            code = self._view(f"{self.folder(job.id)}/{script.MARKER_DIR}/exitcode").strip()
        except NotFoundError:
            return JobStatus(FAILED, "UNKNOWN", "FirecREST no longer knows the job and it left "
                                                "no exit code")
        rc = int(code) if code.lstrip("-").isdigit() else -1
        if rc == 0:
            return JobStatus(SUCCEEDED, "COMPLETED", exit_code=0)
        return JobStatus(FAILED, "FAILED", f"exit code {rc}", exit_code=rc)

    def cancel(self, job: JobRef) -> None:
        if "_" in job.native_id:  # one task of an array: see firecrest_array
            self._cancel_element(job)
            return
        try:
            self._call("cancel_job", self.system, job.native_id)
        except NotFoundError:
            pass
        except _ServerError as e:
            # scancel's "already completing or completed" / "Invalid job id" come back as
            # 500: the job is over (or gone), which is what cancelling wants
            if "already completing or completed" in e.detail or \
                    "Invalid job id" in e.detail:
                return
            raise

    def _transfer_failure(self, e: Exception) -> str:
        info = (getattr(e, "_transfer_job_info", None) or {}).get("transferJob") or {}
        text = ""
        err = (info.get("logs") or {}).get("errorLog")
        if err:
            try:
                text = self._view_part(err, 0, 4096).strip()
            except Exception:  # the log is a courtesy; the failure is the news
                text = ""
        return (f"FirecREST's transfer job {info.get('jobId', '?')} failed"
                + (f": {text[-500:]}" if text else " (no error log)"))

    def clean(self, job: JobRef) -> None:
        try:
            self._call("rm", self.system, self.folder(job.id))
        except CloudTikError:
            pass

    def close(self) -> None:
        for client in (self._client, self._dl_client):
            if client is not None:
                try:
                    client.close_session()
                except Exception:
                    pass
        self._client = self._dl_client = None


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


def _quota_limit(message: str) -> str:
    """The limit's name in FirecREST's SlurmQuotaError (sbatch_command.py matches the same
    pattern in sbatch's stderr); '' if the message names none."""
    m = QUOTA_PATTERN.search(message)
    return m.group(0) if m else ""


def _min(*values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


__all__ = ["FirecrestBackend", "parse_duration"]
