"""The FirecREST v2 emulator's model of the real service: Slurm's words and limits as
FirecREST passes them on, the parsing of ``#SBATCH`` directives, and the HTTP conventions
every route shares (the error body, "Remote process failed ..." answers, system names in
any case, the token's 30 s minimum).  Split from ``firecrest.py`` (issue 29) so each module
stays under 800 lines; the sources of each rule are cited where it is applied.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

from ._service import BaseHandler

APP_VERSION = "2.6.0"
OPS_SIZE_LIMIT = 5 * 1024 * 1024  # FirecREST's data_operation.max_ops_file_size default
COMMAND_TIMEOUT = 5.0  # its ssh.timeout.command_execution default (config.py, SSHTimeouts)
MAX_PART_SIZE = 5 * 1024 * 1024  # the stage's multipart part size
MIN_PART_SIZE = 5 * 1024 * 1024  # S3: every part but the last (EntityTooSmall)
MIN_TOKEN_TTL = 30  # FirecREST's OIDCTokenAuth.min_token_ttl
# a job over the partition's time limit: the real server (FirecREST v2 beside Slurm 22.05
# with accounting, issue 29's outside check) answered PartitionConfig first, Slurm's settled
# PartitionTimeLimit a moment later.  In Slurm's source the first is the submit's reason
# (job_mgr.c, _select_nodes_parts: ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE), the second the
# scheduler's (job_scheduler.c, _job_runnable_test2 -> job_limits_check), which also turns
# a node count over the partition's into PartitionNodeLimit.  We answer PartitionConfig
# until it has been shown once and this long has passed since the submit
PROVISIONAL_SECONDS = 1.0
# the accounts the user has an association with (the outside check: an unknown account is
# a 500 on the real server, Slurm with accounting enforced); --accounts replaces them
DEFAULT_ACCOUNTS = ("default",)
#: seconds a new job waits for Slurm's scheduler: beside the real server every job read
#: ``PENDING`` (reason ``None``: not yet looked at) for 1-2 s before ``RUNNING``, and a job
#: whose working folder is missing read ``PENDING`` (``Priority``) before ``FAILED``
#: (``scripts/firecrest_beside.py``; in Slurm, sbatch's job is scheduled by the main
#: loop's next pass or the backfill, not at submit: slurm.conf ``batch_sched_delay``,
#: ``sched_min_interval``).  ``POST /_emulator/system {"schedule_delay": s}`` changes it
SCHEDULE_SECONDS = 1.0
#: Slurm's ``ClusterName``: FirecREST's ``cluster`` field is sacct's/squeue's ``Cluster``
#: column, not the FirecREST system's name (seen beside the real server)
CLUSTER_NAME = "cluster"
INVALID_ACCOUNT = ("sbatch: error: Batch job submission failed: Invalid account or "
                   "account/partition combination specified\n")
# GET /compute/{system}/jobs lists pending and running jobs (squeue) and, from sacct
# --starttime=now-<window>, the finished ones of the query's time_window: one of these,
# 24h by default (JobsTimeWindow and TIME_WINDOW_DURATIONS in scheduler_clients/models.py,
# get_jobs in compute/router.py, SacctCommandBase.get_command in cli_commands/
# sacct_base.py); any other value is a validation error (400).  GET /jobs/{id} asks sacct
# --jobs=<id>, which has no start time: a job that ended long ago is still found there
TIME_WINDOWS = {"1h": 3600, "8h": 8 * 3600, "24h": 24 * 3600, "3d": 3 * 86400,
                "7d": 7 * 86400}
DEFAULT_TIME_WINDOW = "24h"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
SLURM_ERROR = "Unexpected Slurm command response. exit_status:{rc} std_err:{err}"
KNOWN_SBATCH = {"job-name", "output", "error", "nodes", "ntasks-per-node", "cpus-per-task",
                "mem", "time", "reservation", "partition", "account", "chdir", "comment",
                "ntasks", "qos", "gpus-per-node", "constraint", "export", "input",
                "mem-per-cpu", "exclusive", "signal", "mail-type", "mail-user", "array",
                "dependency", "hold", "requeue", "no-requeue", "wait", "parsable"}


def parse_array(text: str) -> dict[str, Any]:
    """``--array=0-9%2`` / ``1,3,5-7``: the task indices and the ``%`` limit (None: all
    at once)."""
    spec, _, limit = text.partition("%")
    indices: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        b, _, step = b.partition(":")
        indices += range(int(a), int(b or a) + 1, int(step or 1))
    return {"indices": sorted(set(indices)), "limit": int(limit) if limit else None}


def format_indices(indices: list[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``2-4,7``, as Slurm prints a combined array record."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


class SlurmRefusal(Exception):
    """sbatch or scancel said no: FirecREST answers 500 with Slurm's text."""

    def __init__(self, err: str, rc: int = 1) -> None:
        super().__init__(SLURM_ERROR.format(rc=rc, err=err))


# sbatch over a QOS or association limit (Slurm's acct_policy_validate refuses the job with
# ESLURM_ACCOUNTING_POLICY and the limit's reason, e.g. QOSMaxSubmitJobPerUserLimit, which
# sbatch prints first).  FirecREST's SbatchCommand.parse_output (scheduler_clients/slurm/
# cli_commands/sbatch_command.py) matches QUOTA_ERROR_PATTERN "(QOS|Assoc)(Max|Min)...Limit"
# in sbatch's stderr and raises SlurmQuotaError with the words below, which
# ApiResponseError.build_http_error_from_exception (lib/models/apis/api_response_model.py)
# answers with 403 instead of the 500 of every other sbatch refusal
ACCOUNTING_POLICY = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS "
                     "policy (job submit limit, user's size and/or time limits)")
QUOTA_ERROR = "Job submission rejected: accounting/QOS policy limit exceeded. {err}"


class QuotaRefusal(Exception):
    """sbatch refused the job over a QOS/association limit: FirecREST answers 403."""

    def __init__(self, limit: str) -> None:
        super().__init__(QUOTA_ERROR.format(err=f"sbatch: error: {limit}\n{ACCOUNTING_POLICY}"))


def _memory_mb(text: str) -> int | None:
    m = re.match(r"^(\d+)([KMGT]?)B?$", text.strip().upper())
    if not m:
        return None
    n, unit = int(m.group(1)), m.group(2) or "M"
    return {"K": n // 1024, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]


def _duration(text: str) -> int | None:
    """Seconds of a Slurm --time value."""
    m = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", text.strip())
    if not m:
        return None
    d, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if d is not None:
        parts += [0] * (3 - len(parts))
        return int(d) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def sbatch_directives(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        for tok in shlex.split(line[len("#SBATCH"):]):
            if tok.startswith("--"):
                k, _, v = tok[2:].partition("=")
                out[k] = v
    return out


SLURM_DOWN = {
    "jobs": ("Error executing Slurm command.", ["Command execution timeout limit exceeded."]),
    "submit": (SLURM_ERROR.format(rc=1, err="sbatch: error: Batch job submission failed: "
                                            "Unable to contact slurm controller (connect "
                                            "failure)\n"), None),
    "partitions": (SLURM_ERROR.format(rc=1, err="slurm_load_partitions error: Unable to "
                                                "contact slurm controller (connect "
                                                "failure)\n"), None),
}


class OutsideError(Exception):
    """A path on none of the system's file systems (FirecREST: 400)."""


def _mtime(p: Path) -> float | None:
    try:
        return p.stat().st_mtime
    except OSError:
        return None



class Handler(BaseHandler):
    # FastAPI's HTTPBearer (FirecREST's auth dependency) without credentials: "Not
    # authenticated" (seen beside the real server)
    missing_token_message = "Not authenticated"
    def prepare(self) -> None:
        super().prepare()
        if self._finished or not self.needs_auth:
            return
        exp = (getattr(self, "claims", None) or {}).get("exp")
        if exp is not None and exp - time.time() < MIN_TOKEN_TTL:
            self.fail(401, f"Access token expires too soon (less than {MIN_TOKEN_TTL}s "
                           "remaining).")

    def fail(self, status: int, message: str, **extra: Any) -> None:
        extra.setdefault("user", getattr(self, "user", None))
        super().fail(status, message, **extra)

    def system_ok(self, system: str) -> bool:
        # the real server matches system names in any case (issue 29's outside check:
        # "TestSys" reached "testsys"); answers carry its own spelling
        if system.lower() != self.svc.system.lower():
            self.fail(404, "System not found")
            return False
        return True

    def remote_failed(self, status: int, err: str, rc: int = 1) -> None:
        """How FirecREST reports a command that failed on the system."""
        self.fail(status, f"Remote process failed with exit status:{rc} and error "
                          f"message:{err}")

    def may_write(self, p: Path, what: str) -> bool:
        if self.svc.writable(p, self.user):
            return True
        self.remote_failed(403, f"{what}: Permission denied")
        return False

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "reason", None) or getattr(exc, "log_message", None) or \
            self._reason
        self.finish(json.dumps(self.svc.error_body(status_code, str(message))))

    def sys_path(self, raw: str | None) -> Path | None:
        try:
            return self.svc.path(raw)
        except OutsideError as e:
            self.fail(400, str(e))
            return None

