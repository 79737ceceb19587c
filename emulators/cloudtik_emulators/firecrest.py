"""A FirecREST v2 API emulator that runs the submitted jobs on this machine.

For tests and demos of the ``firecrest`` backend; the official client (pyfirecrest) talks
to it over HTTP at the real paths::

    python -m cloudtik_emulators.firecrest --root /tmp/f7t --client-id me \\
        --client-secret s3cret        # prints the URL, the token URL and the admin token

What it does like the real service (checked against FirecREST v2 run from its public
repository over SSH to a real Slurm with accounting; the table is in docs/hpc.md): OIDC
client-credentials tokens (RS256 JWTs, checked on every call: signature, expiry, audience;
a token with less than 30 s left is refused, as FirecREST's ``min_token_ttl`` does),
``/status/systems|partitions|userinfo``,
``/compute/{system}/jobs`` (submit a script with ``#SBATCH`` directives, list, get, cancel,
metadata; jobs really run as processes, PENDING → RUNNING → COMPLETED/FAILED/CANCELLED/
TIMEOUT), ``/filesystem/{system}/ops/*`` (ls, head, tail, view, stat, checksum, mkdir, rm,
small upload/download) and ``/filesystem/{system}/transfer/upload|download`` with the
staged path for large files (multipart upload to presigned URLs of an S3-like stage, moved
into place by a transfer job; parts under 5 MiB but the last are refused at completion,
as S3 does).  Paths outside the system's root are refused (400); the root itself is not
writable, only ``<root>/<user name>`` (403 "Permission denied", as ``mkdir`` says).

Slurm as FirecREST shows it: job ids are strings; an sbatch refusal (unknown partition,
memory no node has, an unknown ``#SBATCH`` option) is HTTP 500 with FirecREST's
"Unexpected Slurm command response. exit_status:1 std_err:sbatch: error: ..." text, and
a memory refusal is recorded by accounting as a FAILED job that never had a node; a job
over the partition's time or node limit is accepted and stays PENDING forever, as with
Slurm's default ``EnforcePartLimits=NO`` — it reads ``PartitionConfig`` first (for the
first answer and the first second) and ``PartitionTimeLimit`` (``PartitionNodeLimit``)
after, as the real server did (a provisional answer, then Slurm's settled one); more CPUs than the
whole partition has stays PENDING (``PartitionConfig``, for good), more per node than a
node has but within the partition is sbatch's "Requested node configuration is not
available" (500); an account the user has no
association with (``--accounts``) is a 500 with sbatch's "Invalid account" words, for
jobs and transfer jobs alike; system names match in any case (the URL's spelling is
accepted, answers carry the server's); ``view`` reads two blocks of ``size`` and is a 413
when they reach ``max_ops_file_size`` (a whole file of 5 MiB or more), its answer cut in
characters, and a direct ``download`` is a 413 when its base64 reaches that limit (from
3.75 MiB); a new job waits ``SCHEDULE_SECONDS`` for the scheduler (PENDING, reason
``None``), then runs with sacct's exit code 0 and its batch step in ``tasks`` while it
runs; a missing working folder is accepted, PENDING (``Priority``) as long, and then
FAILS (exit 0, signal 53); cancelling a finished or unknown job is a 500 with scancel's words;
states read ``CANCELLED by <uid>``; time limits are seconds; the partition model is
``{name, cpus (of the whole partition), totalNodes, partition (the state)}``.

Limits (issue 29, read from the firecrest-v2 source, each cited where it is applied): a
submit over a QOS limit (``--qos``) is FirecREST's SlurmQuotaError, 403; ``ls`` answers 413
when its ``ls -l`` text reaches ``max_ops_file_size`` and 408 when it runs over
``ssh.timeout.command_execution`` (``firecrest_files``); the job listing shows finished
jobs of its ``time_window`` only (1h ... 7d, 24h by default), ``GET /jobs/{id}`` any job.

Faults (``POST /_emulator/faults``, see ``_service.py``): down (503), failing routes,
throttling (429), short-lived or revoked tokens, a queue delay; ``POST /_emulator/slurm
{"down": true}``: Slurm's controller does not answer (FirecREST's 500s with Slurm's text).
Job records persist in ``<root>/.f7t/jobs.json``, so a restarted emulator still knows its
jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tornado import httpserver, web

from ._service import (
    AdminHandler,
    CertsHandler,
    DetachedJobs,
    Faults,
    TokenHandler,
    TokenIssuer,
    job_environment,
)
from .firecrest_files import OpsHandler, StageHandler, TransferHandler
from .firecrest_model import (
    APP_VERSION,
    CLUSTER_NAME,
    COMMAND_TIMEOUT,
    DEFAULT_ACCOUNTS,
    DEFAULT_TIME_WINDOW,
    FINAL,
    INVALID_ACCOUNT,
    KNOWN_SBATCH,
    OPS_SIZE_LIMIT,
    PROVISIONAL_SECONDS,
    SCHEDULE_SECONDS,
    SLURM_DOWN,
    SLURM_ERROR,
    TIME_WINDOWS,
    Handler,
    OutsideError,
    QuotaRefusal,
    SlurmRefusal,
    _duration,
    _memory_mb,
    _mtime,
    format_indices,
    parse_array,
    sbatch_directives,
)
from .firecrest_status import (
    PartitionsHandler,
    SlurmFaultHandler,
    SystemConfigHandler,
    SystemsHandler,
    UserinfoHandler,
)

#: seconds after submit before ``GET /jobs/<array id>`` shows the pending tasks in Slurm's
#: combined form: the real server showed only the bare id for about a second
#: (``scripts/firecrest_beside.py``)
ARRAY_SPLIT_SECONDS = 1.0


class FirecrestService:
    def __init__(self, root: Path, system: str, clients: dict[str, str], admin_token: str,
                 partitions: dict[str, dict[str, Any]] | None = None,
                 base_url: str = "", staging: bool = True,
                 accounts: list[str] | None = None,
                 qos: dict[str, Any] | None = None) -> None:
        self.root = root.resolve()
        # the user's QOS limits (sacctmgr's MaxSubmitJobsPerUser as max_submit_jobs,
        # MaxWallDurationPerJob with DenyOnLimit as max_wall seconds); none by default
        self.qos: dict[str, Any] = dict(qos or {})
        # the system's data_operation.max_ops_file_size and ssh.timeout.command_execution
        # (FirecREST's config; their defaults), and a slow file system's extra seconds per
        # ls (POST /_emulator/system): see firecrest_files.OpsHandler._ls
        self.ops_limit = OPS_SIZE_LIMIT
        self.command_timeout = COMMAND_TIMEOUT
        self.fs_delay = 0.0
        self.age = 0.0  # see listed
        self.schedule_delay = SCHEDULE_SECONDS
        self.accounts = set(DEFAULT_ACCOUNTS if accounts is None else accounts)
        # sacctmgr's default account: the first given (userinfo's ``default``)
        self.default_account = next(iter(DEFAULT_ACCOUNTS if accounts is None else accounts),
                                    None)
        self.system = system
        self.state_dir = self.root / ".f7t"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.issuer = TokenIssuer(clients, issuer="cloudtik-f7t-emulator", audience="firecrest",
                                  key_file=self.state_dir / "signing-key.pem")
        self.faults = Faults()
        self.admin_token = admin_token
        # Slurm's partition config (what FirecREST does not show: MaxTime, Default, memory)
        self.partitions = partitions or {"normal": {"max_time": 3600, "cpus": os.cpu_count() or 2,
                                                    "nodes": 1, "default": True}}
        self.staging = staging
        self.slurm_down = False  # slurmctld not answering (POST /_emulator/slurm)
        self.runner = DetachedJobs(self.state_dir / "run")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: deque = deque(maxlen=5000)
        self.lock = threading.Lock()
        self.base_url = base_url
        self.secret = secrets.token_bytes(32)
        self._load()
        threading.Thread(target=self._arrays_loop, daemon=True).start()

    # bookkeeping --------------------------------------------------------------------------
    def record(self, method: str, path: str, query: str = "") -> None:
        self.requests.append({"t": time.time(), "method": method, "path": path,
                              "query": query})

    def error_body(self, status: int, message: str, **extra: Any) -> dict[str, Any]:
        return {"errorType": "error", "message": message, "causedBy": None, "data": None,
                "user": None, **extra}

    def user_dir(self, user: str) -> Path:
        """``<root>/<user>``: where the user may write (a site makes it for each user)."""
        d = self.root / user
        d.mkdir(exist_ok=True)
        return d

    def writable(self, p: Path, user: str) -> bool:
        home = self.user_dir(user)
        return p == home or home in p.parents

    def _load(self) -> None:
        path = self.state_dir / "jobs.json"
        if path.exists():
            self.jobs = json.loads(path.read_text())

    def _save(self) -> None:
        tmp = self.state_dir / "jobs.json.tmp"
        tmp.write_text(json.dumps(self.jobs))
        tmp.replace(self.state_dir / "jobs.json")

    def next_id(self) -> int:
        return max([int(k) for k in self.jobs] or [0]) + 1

    def path(self, raw: str | None) -> Path:
        """A path on the system; refused (400) if it is on none of its file systems."""
        if not raw or not raw.startswith("/"):
            raise web.HTTPError(400, reason=f"'{raw}' is not an absolute path")
        p = Path(os.path.normpath(raw))
        if p != self.root and self.root not in p.parents:
            raise OutsideError(
                f"The provided path ({raw}) does not match any of the defined filesystem "
                f"paths for the requested system ({self.system}).")
        return p

    # jobs -----------------------------------------------------------------------------------
    def submit(self, desc: dict[str, Any], user: str, name_hint: str = "") -> str:
        script = desc.get("script")
        if not script and (desc.get("script_path") or desc.get("scriptPath")):
            script = self.path(desc.get("script_path") or desc.get("scriptPath")).read_text()
        if not script:
            raise ValueError("job.script or job.scriptPath is required")
        d = sbatch_directives(script)
        for k in d:
            if k not in KNOWN_SBATCH:
                # quoted without its value (seen beside the real server)
                raise SlurmRefusal(f"sbatch: unrecognized option '--{k}'\nTry "
                                   '"sbatch --help" for more information\n', rc=255)
        wd = desc.get("working_directory") or desc.get("workingDirectory") or \
            desc.get("current_working_directory") or d.get("chdir")
        wd_path = self.path(wd)
        part = desc.get("partition") or d.get("partition") or next(
            (k for k, v in self.partitions.items() if v.get("default")), None)
        if part not in self.partitions:
            raise SlurmRefusal(f"sbatch: error: invalid partition specified: {part}\n"
                               "sbatch: error: Batch job submission failed: Invalid partition"
                               " name specified\n")
        account = desc.get("account") or d.get("account")
        if account and account not in self.accounts:  # accounting enforces associations
            raise SlurmRefusal(INVALID_ACCOUNT)
        plim = self.partitions[part]
        limit = _duration(d["time"]) if d.get("time") else None
        self._check_qos(user, limit, parse_array(d["array"]) if d.get("array") else None)
        nodes = int(d.get("nodes", 1) or 1)
        cpus = int(d.get("ntasks-per-node") or 1) * int(d.get("cpus-per-task") or 1)
        part_nodes = int(plim.get("nodes", 1))
        pending_reason = None  # EnforcePartLimits=NO: accepted, and never started
        if limit and plim.get("max_time") and limit > plim["max_time"]:
            pending_reason = "PartitionTimeLimit"  # after PartitionConfig: see job_model
        elif nodes > part_nodes:  # job_limits_check: ESLURM_INVALID_NODE_COUNT
            pending_reason = "PartitionNodeLimit"  # after PartitionConfig, as above
        elif plim.get("cpus") and nodes * cpus > int(plim["cpus"]) * part_nodes:
            # more CPUs than the whole partition has: Slurm's _part_access_check says
            # ESLURM_TOO_MANY_REQUESTED_CPUS, which job_limits_check turns into
            # WAIT_PART_CONFIG (there is no CPU-limit reason), and with EnforcePartLimits=NO
            # job_allocate keeps the job queued — for good (job_mgr.c)
            pending_reason = "PartitionConfig"
        mem = _memory_mb(d["mem"]) if d.get("mem") else None
        refused = mem is not None and plim.get("memory_mb") and mem > plim["memory_mb"]
        # within the partition's CPUs but more per node than a node has: select_nodes finds
        # no node (ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE), which job_allocate refuses
        cpu_refused = not pending_reason and plim.get("cpus") and cpus > int(plim["cpus"])
        refused = refused or cpu_refused
        with self.lock:
            jid = self.next_id()
            name = desc.get("name") or d.get("job-name") or name_hint or "job"
            out = desc.get("standard_output") or desc.get("standardOutput") or d.get("output") \
                or f"slurm-{jid}.out"
            err = desc.get("standard_error") or desc.get("standardError") or d.get("error") or out
            out_p = self._rel(wd_path, out.replace("%j", str(jid)))
            err_p = self._rel(wd_path, err.replace("%j", str(jid)))
            env = desc.get("env") or desc.get("environment") or {}
            if isinstance(env, list):
                env = dict(e.split("=", 1) for e in env if "=" in e)
            env = job_environment({**{k: str(v) for k, v in env.items()},
                                   "SLURM_JOB_ID": str(jid), "SLURM_JOB_NAME": name,
                                   "SLURM_SUBMIT_DIR": str(wd_path)})
            self.jobs[str(jid)] = {
                "jobId": jid, "name": name, "user": user, "partition": part,
                "account": account,
                "workingDirectory": str(wd_path), "standardOutput": str(out_p),
                "standardError": str(err_p), "standardInput": "/dev/null", "script": script,
                "limit": limit or (plim.get("max_time") or 3600), "submitted": time.time(),
                "nodes": nodes, "pending": pending_reason,
            }
            if d.get("array") is not None:  # its tasks start from schedule_arrays
                self.jobs[str(jid)].update(array=parse_array(d["array"]), env=env,
                                           out_t=out, err_t=err, tasks={})
            if refused:  # slurmctld made the record, then refused: accounting keeps it
                self.jobs[str(jid)].update(refused=True, ended=time.time())
            elif not wd_path.is_dir():  # slurmd cannot chdir: the batch step ends as soon as
                # the scheduler starts it (pending until then, see SCHEDULE_SECONDS)
                self.jobs[str(jid)].update(no_workdir=True,
                                           ended=time.time() + self.schedule_delay)
            self._save()
        if cpu_refused:
            raise SlurmRefusal("sbatch: error: Batch job submission failed: Requested node "
                               "configuration is not available\n")
        if refused:
            raise SlurmRefusal("sbatch: error: Memory specification can not be satisfied\n"
                               "sbatch: error: Batch job submission failed: Requested node "
                               "configuration is not available\n")
        if pending_reason or not wd_path.is_dir():
            return str(jid)
        if d.get("array") is not None:
            self.schedule_arrays()
            return str(jid)
        self.runner.start(str(jid), script, wd_path, env, out_p, err_p, time_limit=limit,
                          delay=max(self.faults.queue_delay, self.schedule_delay))
        return str(jid)

    def _check_qos(self, user: str, limit: int | None, arr: dict[str, Any] | None) -> None:
        """Slurm's acct_policy_validate at submit (with AccountingStorageEnforce=limits,qos):
        MaxSubmitJobsPerUser counts the user's pending and running jobs, each array task
        as one (acct_policy.c, _validate_tres_usage_limits_for_qos / max_submit_jobs_pu);
        MaxWallDurationPerJob refuses only with the QOS flag DenyOnLimit (else the job
        waits, which is not modelled here)."""
        most = self.qos.get("max_submit_jobs")
        if most is not None:
            asked = len(arr["indices"]) if arr else 1
            if self._active_jobs(user) + asked > int(most):
                raise QuotaRefusal("QOSMaxSubmitJobPerUserLimit")
        wall = self.qos.get("max_wall")
        if wall is not None and limit and limit > int(wall):
            raise QuotaRefusal("QOSMaxWallDurationPerJobLimit")

    def _active_jobs(self, user: str) -> int:
        """The user's jobs Slurm still holds (pending or running), array tasks one each."""
        n = 0
        for jid in list(self.jobs):
            if self.jobs[jid]["user"] != user:
                continue
            for m in self.job_models(jid):
                if m["status"]["state"] not in ("PENDING", "RUNNING"):
                    continue
                key = str(m["jobId"])
                if "[" in key:  # the combined entry of an array's waiting tasks
                    n += len(parse_array(key.split("[", 1)[1].rstrip("]"))["indices"])
                else:
                    n += 1
        return n

    # job arrays -----------------------------------------------------------------------------
    def schedule_arrays(self) -> None:
        """Start the pending tasks of every array while fewer than its ``%`` limit run (and
        as many as it has when there is none), lowest index first, as Slurm does."""
        with self.lock:
            changed = False
            for jid, j in self.jobs.items():
                arr = j.get("array")
                if not arr or j.get("cancelled_at") or j.get("pending") or \
                        j.get("refused") or j.get("no_workdir") or \
                        time.time() - j["submitted"] < self.schedule_delay:
                    continue
                tasks = j["tasks"]
                running = sum(1 for i in tasks
                              if self.runner.state(f"{jid}_{i}")[0] in ("PENDING", "RUNNING"))
                room = (arr["limit"] or len(arr["indices"])) - running
                for i in [i for i in arr["indices"] if str(i) not in tasks][:max(0, room)]:
                    self._start_task(jid, j, i)
                    changed = True
            if changed:
                self._save()

    def _start_task(self, jid: str, j: dict[str, Any], i: int) -> None:
        wd = Path(j["workingDirectory"])

        def name(t: str) -> Path:
            t = t.replace("%A", jid).replace("%a", str(i)).replace("%j", f"{jid}_{i}")
            return self._rel(wd, t)

        env = {**j["env"], "SLURM_ARRAY_JOB_ID": jid, "SLURM_ARRAY_TASK_ID": str(i),
               "SLURM_ARRAY_TASK_COUNT": str(len(j["array"]["indices"]))}
        out, err = name(j["out_t"]), name(j["err_t"])
        j["tasks"][str(i)] = {"standardOutput": str(out), "started_at": time.time()}
        self.runner.start(f"{jid}_{i}", j["script"], wd, env, out, err,
                          time_limit=j.get("limit"), delay=self.faults.queue_delay)

    def _arrays_loop(self) -> None:
        while True:
            time.sleep(0.2)
            try:
                self.schedule_arrays()
            except Exception:  # a job record being written: the next turn sees it
                pass

    def job_models(self, jid: str, shown: bool = False,
                   listing: bool = False) -> list[dict[str, Any]]:
        """What sacct and squeue say of a job: one entry; for an array, as the real
        FirecREST v2 showed it beside this emulator (``scripts/firecrest_beside.py``,
        docs/hpc.md "Run beside the emulator"):

        * the listing (``GET /jobs``, ``listing``): each task Slurm has started as
          ``<id>_<i>`` (sacct), and the tasks still pending as one entry under the bare
          id ``<id>`` (squeue's ``--Format=JobID`` prints Slurm's raw id; the listing's
          sacct, run with ``--starttime``, shows no pending array entry); once none is
          pending, the bare id is the last task started (its own record), until it ends;
        * one job (``GET /jobs/<id>``: ``sacct --jobs``, no start time): the started tasks
          and the pending rest in Slurm's combined form ``<id>_[2-5%2]`` — but only from
          about a second after submit (``ARRAY_SPLIT_SECONDS``), before which, as for an
          array Slurm has not split yet, only the bare ``<id>`` pending.

        Not modelled: squeue also lists a started task under its own job id (``127``)."""
        j = self.jobs[jid]
        arr = j.get("array")
        if not arr:
            return [self.job_model(jid, shown)]
        base = self.job_model(jid, shown)
        split = not listing and time.time() - j["submitted"] >= ARRAY_SPLIT_SECONDS
        limit = f"%{arr['limit']}" if arr["limit"] else ""
        if j.get("pending") or j.get("refused") or j.get("no_workdir"):
            # never started: one entry, with the whole job's state and reason
            key = f"{jid}_[{format_indices(arr['indices'])}{limit}]" if split else jid
            return [{**base, "jobId": key}]
        with self.lock:  # the scheduler thread adds tasks
            tasks = dict(j["tasks"])
        out = [self._task_model(base, f"{jid}_{i}") for i in sorted(tasks, key=int)]
        waiting = [i for i in arr["indices"] if str(i) not in tasks]
        if not waiting and listing and out:
            last = max(tasks, key=lambda i: (tasks[i].get("started_at", 0), int(i)))
            mine = next(m for m in out if m["jobId"] == f"{jid}_{last}")
            if mine["status"]["state"].split()[0] not in FINAL:
                out.append({**copy.deepcopy(mine), "jobId": jid})
        if waiting:
            m = copy.deepcopy(base)
            m["jobId"] = f"{jid}_[{format_indices(waiting)}{limit}]" if split else jid
            if j.get("cancelled_at"):
                m["status"].update(state="CANCELLED by 1000", stateReason="None", exitCode=0,
                                   interruptSignal=0)
                m["time"]["end"] = int(j["cancelled_at"])
            else:
                full = arr["limit"] and sum(1 for x in out if x["status"]["state"] in
                                            ("PENDING", "RUNNING")) >= arr["limit"]
                m["status"].update(state="PENDING", exitCode=None, interruptSignal=None,
                                   stateReason="JobArrayTaskLimit" if full else "Priority")
                m["time"].update(start=None, end=None, elapsed=0)
            m["nodes"], m["allocationNodes"] = "None assigned", 0
            out.append(m)
        return out

    def _task_model(self, base: dict[str, Any], key: str) -> dict[str, Any]:
        m = copy.deepcopy(base)
        m["jobId"] = key
        state, rc, reason, signal_, started, ended = self._ran(key)
        final = state.split()[0] in FINAL
        m["status"] = {"state": state, "stateReason": reason, "exitCode": rc,
                       "interruptSignal": signal_}
        m["time"].update(start=int(started) if started else None,
                         end=int(ended) if ended else None,
                         elapsed=int(((ended if final else None) or time.time()) - started)
                         if started else 0)
        m["nodes"] = "localhost" if started else ""
        m["tasks"] = _steps(key, state, rc, signal_, started, ended)
        m["time"]["suspended"] = None if state == "PENDING" else 0
        return m

    def _ran(self, key: str) -> tuple[str, int | None, str, int | None, float | None,
                                      float | None]:
        """What Slurm says of a job or array task the runner started: its state (``LOST``
        is FAILED with NodeFail; a cancel reads ``CANCELLED by <uid>``), exit code,
        reason, signal, start and end — one reading for whole jobs and array tasks."""
        state, rc = self.runner.state(key)
        reason, signal_ = "None", 0
        if state == "LOST":
            state, reason = "FAILED", "NodeFail"
        bk = self.runner.job_folder(key)
        started = _mtime(bk / "started")
        ended = _mtime(bk / "exitcode") or (_mtime(bk / "cancelled")
                                            if state == "CANCELLED" else None)
        if state == "CANCELLED":
            state, rc = "CANCELLED by 1000", 0
        elif state == "PENDING":  # squeue's record (it wins for PENDING): no exit code
            rc = signal_ = None
            reason = "Priority"
        elif state == "RUNNING":
            # sacct's record wins over squeue's for any state but PENDING
            # (slurm_cli_client.py, SlurmCliClient.get_job/get_jobs: "sacct has
            # precedence"), and sacct's ExitCode of a running job is "0:0": exit code 0
            # and signal 0 while it runs (seen beside the real server) — not a result
            rc, signal_, reason = 0, 0, "None"
        return state, rc, reason, signal_, started, ended

    def cancel(self, jid: str) -> None:
        """scancel: a finished or unknown job is an error (FirecREST: 500)."""
        if not jid.isdigit():  # scancel refuses the id itself (seen beside the real server)
            raise SlurmRefusal(f"scancel: error: Invalid job id {jid}\n", rc=1)
        j = self.jobs.get(jid)
        if j is None:
            raise SlurmRefusal(f"scancel: Terminating job {jid}\nscancel: error: Kill job "
                               f"error on job id {jid}: Invalid job id specified\n", rc=0)
        if j.get("array"):  # scancel <array id>: every task, pending and running
            live = [i for i in j["tasks"] if self.runner.state(f"{jid}_{i}")[0]
                    in ("PENDING", "RUNNING")]
            pending = len(j["tasks"]) < len(j["array"]["indices"])
            if not live and (not pending or j.get("cancelled_at")):
                raise SlurmRefusal(f"scancel: Terminating job {jid}\nscancel: error: Kill "
                                   f"job error on job id {jid}: Job/step already completing "
                                   "or completed\n", rc=0)
            with self.lock:
                j.setdefault("cancelled_at", time.time())
                self._save()
            for i in live:
                self.runner.cancel(f"{jid}_{i}")
            return
        waiting = j.get("pending") or (j.get("no_workdir") and time.time() < j["ended"])
        if waiting and not j.get("cancelled_at"):
            with self.lock:
                j["cancelled_at"] = time.time()
                self._save()
            return
        state, _ = self.runner.state(jid) if not (j.get("refused") or j.get("no_workdir")
                                                  or j.get("pending")) else ("FAILED", 0)
        if state in FINAL or state == "LOST":
            raise SlurmRefusal(f"scancel: Terminating job {jid}\nscancel: error: Kill job "
                               f"error on job id {jid}: Job/step already completing or "
                               "completed\n", rc=0)
        self.runner.cancel(jid)

    def _rel(self, wd: Path, p: str) -> Path:
        return self.path(p if p.startswith("/") else str(wd / p))

    def job_model(self, jid: str, shown: bool = False) -> dict[str, Any]:
        """A job as FirecREST shows it (sacct merged with squeue); ``shown``: the answer
        goes to a client (a provisional reason then counts as seen)."""
        j = self.jobs[jid]
        now = time.time()
        limit = int(j["limit"]) if j.get("limit") else None  # seconds
        signal_ = 0
        nodes, alloc = "localhost", j.get("nodes", 1)
        steps: list[dict[str, Any]] = []
        if j.get("refused"):
            state, reason, rc, started, ended = "FAILED", "None", 1, j["ended"], j["ended"]
            nodes, alloc = "None assigned", 0
        elif j.get("no_workdir") and j.get("cancelled_at"):  # cancelled while pending
            state, reason, rc, started, ended = "CANCELLED by 1000", "None", 0, None, \
                j["cancelled_at"]
            nodes, alloc = "None assigned", 0
        elif j.get("no_workdir") and now < j["ended"]:  # not scheduled yet
            state, reason, rc, started, ended, nodes = "PENDING", "Priority", None, None, \
                None, ""
            signal_ = None
        elif j.get("no_workdir"):
            state, reason, rc, started, ended = "FAILED", "None", 0, j["ended"], j["ended"]
            signal_ = 53
        elif j.get("pending"):
            started = None
            if j.get("cancelled_at"):
                state, reason, rc, ended = "CANCELLED by 1000", "PartitionConfig", 0, \
                    j["cancelled_at"]
                nodes, alloc = "None assigned", 0
            else:
                state, reason, rc, ended, nodes = "PENDING", j["pending"], None, None, ""
                signal_ = None
                if reason != "PartitionConfig" and not (
                        j.get("provisional_shown")
                        and now - j["submitted"] >= PROVISIONAL_SECONDS):
                    reason = "PartitionConfig"  # not settled yet (see PROVISIONAL_SECONDS)
                    if shown:
                        j["provisional_shown"] = True
        else:
            state, rc, reason, signal_, started, ended = self._ran(jid)
            if state == "PENDING":
                nodes = ""
                if now - j["submitted"] < self.schedule_delay:
                    reason = "None"  # the scheduler has not looked at it yet
            steps = _steps(jid, state, rc, signal_, started, ended)
            if state == "RUNNING" and started and limit:
                ended = started + limit  # squeue's EndTime: when the limit is reached
        elapsed = int(((ended if state in FINAL or state.startswith("CANCELLED") else None)
                       or now) - started) if started else 0
        return {
            "jobId": jid, "name": j["name"],
            "status": {"state": state, "stateReason": reason, "exitCode": rc,
                       "interruptSignal": signal_},
            "tasks": steps,
            # squeue's record (PENDING) has no Suspended column: null; sacct's says 0
            "time": {"elapsed": elapsed, "start": int(started) if started else None,
                     "end": int(ended) if ended else None,
                     "suspended": None if state == "PENDING" else 0, "limit": limit},
            "account": j.get("account") or "", "allocationNodes": alloc,
            "cluster": CLUSTER_NAME, "group": j["user"], "nodes": nodes,
            "partition": j["partition"], "killRequestUser": None, "user": j["user"],
            "workingDirectory": j["workingDirectory"], "priority": 4294901759 - int(jid),
        }

    def listed(self, m: dict[str, Any], window: str = DEFAULT_TIME_WINDOW) -> bool:
        """GET /jobs: running and pending jobs, and finished ones that ended within the
        ``time_window`` (``age``: the seconds the clock is ahead for finished jobs, set
        over /_emulator/slurm to show a job that ended days ago)."""
        end = m["time"]["end"]
        final = m["status"]["state"].split()[0] in FINAL
        return not final or not end or time.time() + self.age - end < TIME_WINDOWS[window]

    def visible(self, jid: str, user: str) -> bool:
        return jid in self.jobs and self.jobs[jid]["user"] == user

    # presigned URLs for the S3-like stage --------------------------------------------------
    def presign(self, method: str, path: str, ttl: int = 3600, **params: Any) -> str:
        expires = int(time.time()) + ttl
        params = {**{k: str(v) for k, v in params.items()}, "X-Amz-Expires": str(expires)}
        payload = f"{method}:{path}:{urlencode(sorted(params.items()))}".encode()
        params["X-Amz-Signature"] = hmac.new(self.secret, payload, hashlib.sha256).hexdigest()
        return f"{self.base_url}{path}?{urlencode(params)}"

    def check_signature(self, method: str, path: str, args: dict[str, str]) -> bool:
        sig = args.pop("X-Amz-Signature", "")
        payload = f"{method}:{path}:{urlencode(sorted(args.items()))}".encode()
        good = hmac.new(self.secret, payload, hashlib.sha256).hexdigest()
        return hmac.compare_digest(sig, good) and int(args.get("X-Amz-Expires", 0)) > time.time()

    def stage_dir(self, bucket: str, key: str) -> Path:
        return self.state_dir / "s3" / bucket / key

    def transfer_job(self, user: str, script: str, name: str) -> dict[str, Any]:
        wd = self.root / ".f7t" / "transfers" / user
        wd.mkdir(parents=True, exist_ok=True)
        uid = uuid.uuid4().hex
        out, err = wd / f".f7t_file_handling_job_{uid}.log", wd / \
            f".f7t_file_handling_job_error_{uid}.log"
        jid = self.submit({"name": name, "working_directory": str(wd), "script": script,
                           "standard_output": str(out), "standard_error": str(err)}, user)
        jid = int(jid)
        return {"jobId": jid, "system": self.system, "workingDirectory": str(wd),
                "logs": {"outputLog": str(out), "errorLog": str(err)}}


def _steps(key: str, state: str, rc: int | None, signal_: int | None,
           started: float | None, ended: float | None) -> list[dict[str, Any]]:
    """``tasks``: the job's steps as sacct lists them (``<id>.batch``), which FirecREST
    turns into ``{id, name, status, time}`` (sacct_job_info_command.py,
    ``SacctCommand._parse_step``; models.py, ``JobTaskSlurm``: ``stateReason`` null).
    squeue has no steps, so a PENDING job has none; a started one has its batch step —
    running, then ended as the job did, except that a cancel or time-out ends the batch
    step by signal 15 (``CANCELLED``, exit ``0:15``) as slurmstepd does.  A step's
    ``TimelimitRaw`` is blank: ``limit`` null.  Not modelled: the ``extern`` step (only
    with ``PrologFlags=Contain``) and ``srun`` steps (``<id>.0``)."""
    if not started:
        return []
    word = state.split()[0]
    step_state, code, sig = word, rc, signal_
    if word in ("CANCELLED", "TIMEOUT"):
        step_state, code, sig = "CANCELLED", 0, 15
    final = word in FINAL
    return [{"id": f"{key}.batch", "name": "batch",
             "status": {"state": step_state, "stateReason": None, "exitCode": code,
                        "interruptSignal": sig},
             "time": {"elapsed": int(((ended if final else None) or time.time()) - started),
                      "start": int(started), "end": int(ended) if final and ended else None,
                      "suspended": 0, "limit": None}}]


class JobsHandler(Handler):
    def prepare(self) -> None:
        super().prepare()
        if not self._finished and self.svc.slurm_down:
            msg, cause = SLURM_DOWN["submit" if self.request.method == "POST" else "jobs"]
            self.fail(500, msg, causedBy=cause)

    def get(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        s = self.svc
        if jid is None:
            window = self.get_argument("time_window", None) or DEFAULT_TIME_WINDOW
            if window not in TIME_WINDOWS:  # the JobsTimeWindow enum: FastAPI's 400
                msg = "Input should be " + ", ".join(f"'{w}'" for w in TIME_WINDOWS)
                self.fail(400, f"1 validation error: {msg}", errorType="validation",
                          data={"fields": [{"location": "query", "name": "time_window",
                                            "message": msg}]})
                return
            self.reply({"jobs": [m for k in sorted(s.jobs, key=int) if s.visible(k, self.user)
                                 for m in s.job_models(k, shown=True, listing=True)
                                 if s.listed(m, window)]})
            return
        if not self.job_id_ok(jid):
            return
        if not jid.isdigit():  # sacct: fatal: Bad job/step specified
            self.fail(500, "Error executing Slurm command.",
                      causedBy=[SLURM_ERROR.format(rc=1, err=f"sacct: fatal: Bad job/step "
                                                           f"specified: {jid}\n")])
            return
        if not s.visible(jid, self.user):
            self.fail(404, "Job not found.")
            return
        if what == "metadata":
            j = s.jobs[jid]
            self.reply({"jobs": [{"jobId": jid, "script": j["script"],
                                  "standardInput": j["standardInput"],
                                  "standardOutput": j["standardOutput"],
                                  "standardError": j["standardError"]}]})
            return
        self.reply({"jobs": s.job_models(jid, shown=True)})

    def job_id_ok(self, jid: str) -> bool:
        """FirecREST's ``{job_id}`` path parameter is ``pattern="^[a-zA-Z0-9]+$"``
        (compute/router.py: get_job, get_job_metadata, delete_job_cancel): an array
        task's ``123_4`` is a validation error, which its handler answers with 400
        (api_response_model.py, build_http_error_from_exception)."""
        if re.fullmatch(r"[a-zA-Z0-9]+", jid):
            return True
        msg = "String should match pattern '^[a-zA-Z0-9]+$'"
        self.fail(400, f"1 validation error: {msg}", errorType="validation",
                  data={"fields": [{"location": "path", "name": "job_id", "message": msg}]})
        return False

    def post(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        body = self.json_body()
        if not isinstance(body, dict) or not isinstance(body.get("job"), dict):
            self.fail(400, "Field required: job", errorType="validation")
            return
        job = body["job"]
        if not (job.get("workingDirectory") or job.get("working_directory")):
            self.fail(400, "1 validation error: field required: body.job.workingDirectory",
                      errorType="validation", data={"fields": [
                          {"location": "body", "name": "job", "message": "Field required"}]})
            return
        try:
            new = self.svc.submit(job, self.user)
        except OutsideError as e:
            self.fail(400, str(e))
            return
        except SlurmRefusal as e:
            self.fail(500, str(e))
            return
        except QuotaRefusal as e:  # SlurmQuotaError: 403 (see firecrest_model)
            self.fail(403, str(e))
            return
        except ValueError as e:
            self.fail(400, str(e))
            return
        self.reply({"jobId": new}, 201)

    def delete(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        if jid is None:
            self.fail(405, "Method Not Allowed")
            return
        if not self.job_id_ok(jid):
            return
        try:
            if jid in self.svc.jobs and not self.svc.visible(jid, self.user):
                raise SlurmRefusal(f"scancel: error: Kill job error on job id {jid}: "
                                   "Access/permission denied\n", rc=0)
            self.svc.cancel(jid)
        except SlurmRefusal as e:
            self.fail(500, str(e))
            return
        self.reply(None, 204)



def make_app(service: FirecrestService) -> web.Application:
    sysre = r"([A-Za-z0-9_-]+)"
    return web.Application([
        (r"/auth/token", TokenHandler),
        (r"/auth/certs", CertsHandler),
        (r"/_emulator/(slurm)", SlurmFaultHandler),
        (r"/_emulator/(system)", SystemConfigHandler),
        (r"/_emulator/(\w+)", AdminHandler),
        (r"/status/systems", SystemsHandler),
        (rf"/status/{sysre}/partitions", PartitionsHandler),
        (rf"/status/{sysre}/userinfo", UserinfoHandler),
        (rf"/compute/{sysre}/jobs", JobsHandler),
        (rf"/compute/{sysre}/jobs/([^/]+)", JobsHandler),
        (rf"/compute/{sysre}/jobs/([^/]+)/(metadata)", JobsHandler),
        (rf"/filesystem/{sysre}/ops/(\w+)", OpsHandler),
        (rf"/filesystem/{sysre}/transfer/(\w+)", TransferHandler),
        (r"/s3/([^/]+)/(.+)", StageHandler),
    ], service=service, app_version=APP_VERSION)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FirecREST v2 API emulator")
    parser.add_argument("--root", required=True, help="the system's filesystem root")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--system", default="cluster")
    parser.add_argument("--client-id", default="cloudtik")
    parser.add_argument("--client-secret", default=os.environ.get("EMULATOR_CLIENT_SECRET"))
    parser.add_argument("--admin-token", default=os.environ.get("EMULATOR_ADMIN_TOKEN"))
    parser.add_argument("--partitions", help="JSON {name: {max_time, cpus (per node), "
                                             "nodes, memory_mb, default, state}}")
    parser.add_argument("--accounts", help="comma-separated accounts the user may charge "
                                           f"(default: {','.join(DEFAULT_ACCOUNTS)})")
    parser.add_argument("--qos", help="JSON {max_submit_jobs, max_wall (seconds)}: the "
                                      "user's QOS limits, refused at submit with a 403")
    parser.add_argument("--max-ops-file-size", type=int, default=OPS_SIZE_LIMIT,
                        help="data_operation.max_ops_file_size: the direct limit and the "
                             "SSH output buffer (bytes)")
    parser.add_argument("--command-timeout", type=float, default=COMMAND_TIMEOUT,
                        help="ssh.timeout.command_execution (seconds)")
    parser.add_argument("--schedule-delay", type=float, default=SCHEDULE_SECONDS,
                        help="seconds a new job stays PENDING (reason None) before Slurm's "
                             "scheduler starts it")
    parser.add_argument("--no-staging", action="store_true",
                        help="no staged transfer (data_transfer not configured)")
    args = parser.parse_args(argv)
    if not args.client_secret:
        parser.error("--client-secret (or $EMULATOR_CLIENT_SECRET) is required")
    admin = args.admin_token or secrets.token_urlsafe(16)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    svc = FirecrestService(root, args.system, {args.client_id: args.client_secret}, admin,
                           json.loads(args.partitions) if args.partitions else None,
                           staging=not args.no_staging,
                           accounts=args.accounts.split(",") if args.accounts is not None
                           else None,
                           qos=json.loads(args.qos) if args.qos else None)
    svc.ops_limit, svc.command_timeout = args.max_ops_file_size, args.command_timeout
    svc.schedule_delay = args.schedule_delay
    app = make_app(svc)

    async def run() -> None:
        server = httpserver.HTTPServer(app, max_buffer_size=1 << 30)
        sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(
            args.port, "127.0.0.1")
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        svc.base_url = f"http://127.0.0.1:{port}"
        print(json.dumps({"url": svc.base_url, "token_uri": f"{svc.base_url}/auth/token",
                          "system": args.system, "root": str(svc.root), "admin_token": admin}),
              flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()

    try:
        asyncio.run(run())
    finally:
        if os.environ.get("EMULATOR_KEEP_JOBS") != "1":
            svc.runner.kill_all()


if __name__ == "__main__":
    sys.exit(main())
