"""A FirecREST v2 API emulator that runs the submitted jobs on this machine.

For tests and demos of the ``firecrest`` backend; the official client (pyfirecrest) talks
to it over HTTP at the real paths::

    python -m jupyter_cloudtik.testing.firecrest --root /tmp/f7t --client-id me \\
        --client-secret s3cret        # prints the URL, the token URL and the admin token

What it does like the real service: OIDC client-credentials tokens (RS256 JWTs, checked on
every call: signature, expiry, audience), ``/status/systems|partitions|userinfo``,
``/compute/{system}/jobs`` (submit a script with ``#SBATCH`` directives, list, get, cancel,
metadata; jobs really run as processes, PENDING → RUNNING → COMPLETED/FAILED/CANCELLED/
TIMEOUT), ``/filesystem/{system}/ops/*`` (ls, head, tail, view, stat, checksum, mkdir, rm,
small upload/download) and ``/filesystem/{system}/transfer/upload|download`` with the
staged path for large files (multipart upload to presigned URLs of an S3-like stage, moved
into place by a transfer job).  Paths outside the system's root are refused.

Faults (``POST /_emulator/faults``, see ``_service.py``): down (503), failing routes,
throttling (429), short-lived or revoked tokens, a queue delay.  Job records persist in
``<root>/.f7t/jobs.json``, so a restarted emulator still knows its jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat as statmod
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
    BaseHandler,
    CertsHandler,
    DetachedJobs,
    Faults,
    TokenHandler,
    TokenIssuer,
    job_environment,
    q,
)

APP_VERSION = "2.6.0"
OPS_SIZE_LIMIT = 5 * 1024 * 1024
MAX_PART_SIZE = 1024 * 1024
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


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


class FirecrestService:
    def __init__(self, root: Path, system: str, clients: dict[str, str], admin_token: str,
                 partitions: dict[str, dict[str, Any]] | None = None,
                 base_url: str = "") -> None:
        self.root = root.resolve()
        self.system = system
        self.state_dir = self.root / ".f7t"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.issuer = TokenIssuer(clients, issuer="cloudtik-f7t-emulator", audience="firecrest",
                                  key_file=self.state_dir / "signing-key.pem")
        self.faults = Faults()
        self.admin_token = admin_token
        self.partitions = partitions or {"normal": {"max_time": 3600, "cpus": os.cpu_count() or 2,
                                                    "nodes": 1, "default": True}}
        self.runner = DetachedJobs(self.state_dir / "run")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: deque = deque(maxlen=5000)
        self.lock = threading.Lock()
        self.base_url = base_url
        self.secret = secrets.token_bytes(32)
        self._load()

    # bookkeeping --------------------------------------------------------------------------
    def record(self, method: str, path: str, query: str = "") -> None:
        self.requests.append({"t": time.time(), "method": method, "path": path,
                              "query": query})

    def error_body(self, status: int, message: str, **extra: Any) -> dict[str, Any]:
        return {"errorType": "error", "message": message, **extra}

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
        """A path on the system; refused if it leaves the system's root."""
        if not raw or not raw.startswith("/"):
            raise web.HTTPError(400, reason=f"'{raw}' is not an absolute path")
        p = Path(os.path.normpath(raw))
        if p != self.root and self.root not in p.parents:
            raise PermissionError(f"Permission denied: '{raw}'")
        return p

    # jobs -----------------------------------------------------------------------------------
    def submit(self, desc: dict[str, Any], user: str, name_hint: str = "") -> int:
        script = desc.get("script")
        if not script and (desc.get("script_path") or desc.get("scriptPath")):
            script = self.path(desc.get("script_path") or desc.get("scriptPath")).read_text()
        if not script:
            raise ValueError("job.script or job.scriptPath is required")
        d = sbatch_directives(script)
        wd = desc.get("working_directory") or desc.get("workingDirectory") or \
            desc.get("current_working_directory") or d.get("chdir")
        wd_path = self.path(wd)
        if not wd_path.is_dir():
            raise ValueError(f"sbatch: error: chdir to {wd} failed: No such file or directory")
        part = desc.get("partition") or d.get("partition") or next(
            (k for k, v in self.partitions.items() if v.get("default")), None)
        if part not in self.partitions:
            raise ValueError("sbatch: error: Batch job submission failed: Invalid partition "
                             f"name specified ({part})")
        plim = self.partitions[part]
        limit = _duration(d["time"]) if d.get("time") else None
        if limit and plim.get("max_time") and limit > plim["max_time"]:
            raise ValueError("sbatch: error: Batch job submission failed: Requested time "
                             "limit is invalid (missing or exceeds some limit)")
        nodes = int(d.get("nodes", 1) or 1)
        if nodes > int(plim.get("nodes", 1)):
            raise ValueError("sbatch: error: Batch job submission failed: Node count "
                             "specification invalid")
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
                "account": desc.get("account") or d.get("account"),
                "workingDirectory": str(wd_path), "standardOutput": str(out_p),
                "standardError": str(err_p), "standardInput": "/dev/null", "script": script,
                "limit": limit, "submitted": time.time(), "nodes": nodes,
            }
            self._save()
        self.runner.start(str(jid), script, wd_path, env, out_p, err_p, time_limit=limit,
                          delay=self.faults.queue_delay)
        return jid

    def _rel(self, wd: Path, p: str) -> Path:
        return self.path(p if p.startswith("/") else str(wd / p))

    def job_model(self, jid: str) -> dict[str, Any]:
        j = self.jobs[jid]
        state, rc = self.runner.state(jid)
        reason = "None"
        if state == "LOST":
            state, reason = "FAILED", "NodeFail"
        if state == "PENDING":
            reason = "Priority"
        bk = self.runner.job_folder(jid)
        started = _mtime(bk / "started")
        ended = _mtime(bk / "exitcode") or (_mtime(bk / "cancelled") if state == "CANCELLED"
                                            else None)
        now = time.time()
        elapsed = int((ended or now) - started) if started else 0
        return {
            "jobId": int(jid), "name": j["name"],
            "status": {"state": state, "stateReason": reason, "exitCode": rc or 0,
                       "interruptSignal": None},
            "tasks": [],
            "time": {"elapsed": elapsed, "start": int(started) if started else None,
                     "end": int(ended) if ended else None, "suspended": 0,
                     "limit": int(j["limit"] / 60) if j.get("limit") else None},
            "account": j.get("account"), "allocationNodes": j.get("nodes", 1),
            "cluster": self.system, "group": "users", "nodes": "localhost",
            "partition": j["partition"], "killRequestUser": None, "user": j["user"],
            "workingDirectory": j["workingDirectory"], "priority": 1,
        }

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
        return {"jobId": jid, "system": self.system, "workingDirectory": str(wd),
                "logs": {"outputLog": str(out), "errorLog": str(err)}}


def _mtime(p: Path) -> float | None:
    try:
        return p.stat().st_mtime
    except OSError:
        return None


def _file_entry(p: Path, name: str) -> dict[str, Any]:
    st = p.lstat()
    kind = "d" if statmod.S_ISDIR(st.st_mode) else "l" if statmod.S_ISLNK(st.st_mode) else "-"
    return {"name": name, "type": kind,
            "linkTarget": os.readlink(p) if kind == "l" else None, "user": "user",
            "group": "users", "permissions": statmod.filemode(st.st_mode)[1:],
            "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(st.st_mtime)),
            "size": str(st.st_size)}


class Handler(BaseHandler):
    def system_ok(self, system: str) -> bool:
        if system != self.svc.system:
            self.fail(404, f"System '{system}' does not exist")
            return False
        return True

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "reason", None) or getattr(exc, "log_message", None) or \
            self._reason
        self.finish(json.dumps(self.svc.error_body(status_code, str(message))))

    def sys_path(self, raw: str | None) -> Path | None:
        try:
            return self.svc.path(raw)
        except PermissionError as e:
            self.fail(403, str(e))
            return None


class SystemsHandler(Handler):
    def get(self) -> None:
        s = self.svc
        self.reply({"systems": [{
            "name": s.system, "host": "localhost", "sshPort": 22,
            "scheduler": {"type": "slurm", "version": "22.05", "apiUrl": None},
            "servicesHealth": [{"serviceType": t, "healthy": True} for t in
                               ("scheduler", "ssh", "filesystem")],
            "fileSystems": [{"path": str(s.root), "dataType": "scratch",
                             "defaultWorkDir": True}],
            "datatransferJobsDirectives": [],
        }]})


class PartitionsHandler(Handler):
    def get(self, system: str) -> None:
        if not self.system_ok(system):
            return
        self.reply({"partitions": [
            {"name": k, "cpus": v.get("cpus"), "totalNodes": v.get("nodes", 1), "partition": k,
             "maxTime": v.get("max_time"), "default": bool(v.get("default"))}
            for k, v in self.svc.partitions.items()]})


class UserinfoHandler(Handler):
    def get(self, system: str) -> None:
        if not self.system_ok(system):
            return
        self.reply({"user": {"id": "1000", "name": self.user}, "group": {"id": "100",
                    "name": "users"}, "groups": [{"id": "100", "name": "users"}]})


class JobsHandler(Handler):
    def get(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        s = self.svc
        if jid is None:
            self.reply({"jobs": [s.job_model(k) for k in sorted(s.jobs, key=int)
                                 if s.visible(k, self.user)]})
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
        self.reply({"jobs": [s.job_model(jid)]})

    def post(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        body = self.json_body()
        if not isinstance(body, dict) or not isinstance(body.get("job"), dict):
            self.fail(400, "Field required: job", errorType="validation")
            return
        try:
            new = self.svc.submit(body["job"], self.user)
        except PermissionError as e:
            self.fail(403, str(e))
            return
        except ValueError as e:
            self.fail(400, str(e))
            return
        self.reply({"jobId": new}, 201)

    def delete(self, system: str, jid: str | None = None, what: str | None = None) -> None:
        if not self.system_ok(system):
            return
        if jid is None or not self.svc.visible(jid, self.user):
            self.fail(404, "Job not found")
            return
        self.svc.runner.cancel(jid)
        self.reply(None, 204)


class OpsHandler(Handler):
    def get(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        p = self.sys_path(self.get_argument("path", None))
        if p is None:
            return
        if op == "download":
            if not p.is_file():
                self.fail(404, f"{p}: No such file or directory")
                return
            if p.stat().st_size > OPS_SIZE_LIMIT:
                self.fail(413, "File is too large for a direct download; use the transfer")
                return
            self.set_header("Content-Type", "application/octet-stream")
            self.finish(p.read_bytes())
            return
        if not p.exists():
            self.fail(404, f"ls: cannot access '{p}': No such file or directory"
                      if op == "ls" else f"{p}: No such file or directory")
            return
        if op == "ls":
            recursive = self.get_argument("recursive", "false") == "true"
            hidden = self.get_argument("showHidden", "false") == "true"
            entries = []
            if p.is_dir():
                walker = sorted(p.rglob("*")) if recursive else sorted(p.iterdir())
                for c in walker:
                    rel = c.relative_to(p).as_posix()
                    if not hidden and any(part.startswith(".") for part in rel.split("/")):
                        continue
                    entries.append(_file_entry(c, rel))
            else:
                entries.append(_file_entry(p, p.name))
            self.reply({"output": entries})
        elif op == "stat":
            st = p.stat()
            self.reply({"output": {"mode": st.st_mode, "ino": st.st_ino, "dev": st.st_dev,
                                   "nlink": st.st_nlink, "uid": st.st_uid, "gid": st.st_gid,
                                   "size": st.st_size, "atime": int(st.st_atime),
                                   "ctime": int(st.st_ctime), "mtime": int(st.st_mtime)}})
        elif op == "view":
            data = p.read_bytes()
            if len(data) > OPS_SIZE_LIMIT:
                self.fail(400, f"`size` value must be less than {OPS_SIZE_LIMIT} bytes")
                return
            self.reply({"output": data.decode(errors="replace")})
        elif op in ("head", "tail"):
            nbytes, lines = self.get_argument("bytes", None), self.get_argument("lines", None)
            skip = self.get_argument("skipHeading" if op == "tail" else "skipTrailing",
                                     "false") == "true"
            data = p.read_bytes()
            if nbytes and lines:
                self.fail(400, "Only one of `bytes` or `lines` can be specified.")
                return
            if nbytes is not None:
                n = int(nbytes)
                if op == "tail":
                    out = data[max(0, n - 1):] if skip else data[-n:] if n else b""
                else:
                    out = data[:-n] if skip else data[:n]
            else:
                n = int(lines or 10)
                rows = data.splitlines(keepends=True)
                if op == "tail":
                    out = b"".join(rows[max(0, n - 1):] if skip else rows[-n:])
                else:
                    out = b"".join(rows[:-n] if skip else rows[:n])
            self.reply({"output": {"content": out.decode(errors="replace"),
                                   "contentType": "bytes" if nbytes else "lines",
                                   "startPosition": 0, "endPosition": -1}})
        elif op == "checksum":
            self.reply({"output": {"algorithm": "SHA-256",
                                   "checksum": hashlib.sha256(p.read_bytes()).hexdigest()}})
        elif op == "file":
            self.reply({"output": "directory" if p.is_dir() else "ASCII text"})
        else:
            self.fail(404, f"no operation '{op}'")

    def post(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        if op == "mkdir":
            body = self.json_body() or {}
            p = self.sys_path(body.get("path") or body.get("sourcePath"))
            if p is None:
                return
            if p.exists() and not p.is_dir():
                self.fail(400, f"mkdir: cannot create directory '{p}': File exists")
                return
            if not body.get("parent") and not p.parent.exists():
                self.fail(400, f"mkdir: cannot create directory '{p}': No such file or "
                               "directory")
                return
            p.mkdir(parents=True, exist_ok=True)
            self.reply({"output": _file_entry(p, p.name)}, 201)
        elif op == "upload":
            folder = self.sys_path(self.get_argument("path", None))
            if folder is None:
                return
            files = self.request.files.get("file")
            if not files:
                self.fail(400, "Field required: file", errorType="validation")
                return
            f = files[0]
            if len(f["body"]) > OPS_SIZE_LIMIT:
                self.fail(413, "Uploaded file is too large.")
                return
            if not folder.is_dir():
                self.fail(400, f"{folder}: No such file or directory")
                return
            target = self.sys_path(str(folder / f["filename"]))
            if target is None:
                return
            target.write_bytes(f["body"])
            self.reply(None, 204)
        else:
            self.fail(404, f"no operation '{op}'")

    def delete(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        if op != "rm":
            self.fail(404, f"no operation '{op}'")
            return
        p = self.sys_path(self.get_argument("path", None))
        if p is None:
            return
        if not p.exists():
            self.fail(404, f"rm: cannot remove '{p}': No such file or directory")
            return
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        self.reply(None, 204)


class TransferHandler(Handler):
    def post(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        body = self.json_body() or {}
        directives = body.get("transfer_directives") or body.get("transferDirectives") or {}
        method = directives.get("transfer_method") or directives.get("transferMethod") or "s3"
        if method != "s3":
            self.fail(400, "Requested transfer method is not available.")
            return
        s = self.svc
        bucket = re.sub(r"[^A-Za-z0-9._-]", "_", self.user)
        if op == "upload":
            target = self.sys_path(body.get("path") or body.get("sourcePath"))
            if target is None:
                return
            size = directives.get("file_size") or directives.get("fileSize") or \
                body.get("fileSize") or body.get("file_size")
            if size is None:
                self.fail(400, "Field required: file_size", errorType="validation")
                return
            key = f"{uuid.uuid4()}/{target.name}"
            upload_id = uuid.uuid4().hex
            stage = s.stage_dir(bucket, key)
            stage.mkdir(parents=True, exist_ok=True)
            parts = max(1, -(-int(size) // MAX_PART_SIZE))
            path = f"/s3/{bucket}/{key}"
            urls = [s.presign("PUT", path, uploadId=upload_id, partNumber=i + 1)
                    for i in range(parts)]
            complete = s.presign("POST", path, uploadId=upload_id)
            script = (f"#!/bin/bash\nfor i in $(seq 600); do [ -f {q(stage / 'complete')} ] "
                      f"&& break; sleep 0.1; done\n[ -f {q(stage / 'complete')} ] || "
                      f"{{ echo 'upload never completed' >&2; exit 1; }}\n"
                      f"mkdir -p {q(target.parent)} && cp {q(stage / 'object')} {q(target)} && "
                      f"echo 'File was successfully uploaded to {target}'\n")
            tj = s.transfer_job(self.user, script, "IngressFileTransfer")
            self.reply({"transferJob": tj, "transferDirectives": {
                "transferMethod": "s3", "partsUploadUrls": urls, "completeUploadUrl": complete,
                "maxPartSize": MAX_PART_SIZE}}, 201)
        elif op == "download":
            src = self.sys_path(body.get("source_path") or body.get("sourcePath")
                                or body.get("path"))
            if src is None:
                return
            if not src.is_file():
                self.fail(404, f"{src}: No such file or directory")
                return
            key = f"{src.name}_{uuid.uuid4()}"
            stage = s.stage_dir(bucket, key)
            stage.mkdir(parents=True, exist_ok=True)
            script = (f"#!/bin/bash\ncp {q(src)} {q(stage / 'object.tmp')} && mv "
                      f"{q(stage / 'object.tmp')} {q(stage / 'object')} && "
                      "echo 'Multipart file upload successfully completed'\n")
            tj = s.transfer_job(self.user, script, "OutgressFileTransfer")
            self.reply({"transferJob": tj, "transferDirectives": {
                "transferMethod": "s3",
                "downloadUrl": s.presign("GET", f"/s3/{bucket}/{key}")}}, 201)
        else:
            self.fail(404, f"no transfer '{op}'")


class StageHandler(BaseHandler):
    """The S3-like stage behind presigned URLs (no bearer token: the URL is the grant)."""

    needs_auth = False

    def _check(self, bucket: str, key: str) -> Path | None:
        args = {k: self.get_argument(k) for k in self.request.arguments}
        if not self.svc.check_signature(self.request.method, f"/s3/{bucket}/{key}", args):
            self.set_status(403)
            self.set_header("Content-Type", "application/xml")
            self.finish("<Error><Code>SignatureDoesNotMatch</Code></Error>")
            return None
        return self.svc.stage_dir(bucket, key)

    def put(self, bucket: str, key: str) -> None:
        stage = self._check(bucket, key)
        if stage is None:
            return
        n = int(self.get_argument("partNumber"))
        (stage / f"part.{n:05d}").write_bytes(self.request.body)
        self.set_header("ETag", '"' + hashlib.md5(self.request.body).hexdigest() + '"')
        self.finish()

    def post(self, bucket: str, key: str) -> None:
        stage = self._check(bucket, key)
        if stage is None:
            return
        parts = sorted(stage.glob("part.*"))
        with open(stage / "object.tmp", "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
                part.unlink()
        (stage / "object.tmp").replace(stage / "object")
        (stage / "complete").write_text("1\n")
        self.set_header("Content-Type", "application/xml")
        self.finish("<CompleteMultipartUploadResult/>")

    def get(self, bucket: str, key: str) -> None:
        stage = self._check(bucket, key)
        if stage is None:
            return
        obj = stage / "object"
        if not obj.exists():
            self.set_status(404)
            self.finish("<Error><Code>NoSuchKey</Code></Error>")
            return
        self.set_header("Content-Type", "application/octet-stream")
        with open(obj, "rb") as f:
            while chunk := f.read(1 << 20):
                self.write(chunk)
        self.finish()


def make_app(service: FirecrestService) -> web.Application:
    sysre = r"([A-Za-z0-9_-]+)"
    return web.Application([
        (r"/auth/token", TokenHandler),
        (r"/auth/certs", CertsHandler),
        (r"/_emulator/(\w+)", AdminHandler),
        (r"/status/systems", SystemsHandler),
        (rf"/status/{sysre}/partitions", PartitionsHandler),
        (rf"/status/{sysre}/userinfo", UserinfoHandler),
        (rf"/compute/{sysre}/jobs", JobsHandler),
        (rf"/compute/{sysre}/jobs/([A-Za-z0-9]+)", JobsHandler),
        (rf"/compute/{sysre}/jobs/([A-Za-z0-9]+)/(metadata)", JobsHandler),
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
    parser.add_argument("--partitions", help="JSON {name: {max_time, cpus, nodes, default}}")
    args = parser.parse_args(argv)
    if not args.client_secret:
        parser.error("--client-secret (or $EMULATOR_CLIENT_SECRET) is required")
    admin = args.admin_token or secrets.token_urlsafe(16)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    svc = FirecrestService(root, args.system, {args.client_id: args.client_secret}, admin,
                           json.loads(args.partitions) if args.partitions else None)
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
