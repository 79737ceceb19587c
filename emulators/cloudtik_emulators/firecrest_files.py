"""The FirecREST v2 emulator's file routes: ``/filesystem/{system}/ops/*`` (ls, head, tail,
view, stat, checksum, mkdir, rm, small upload/download), ``/filesystem/{system}/transfer/*``
(the staged path through an S3-like stage) and the stage itself.  Split from
``firecrest.py`` (issue 29); the behaviour and its sources are described there and where
each rule is applied.
"""

from __future__ import annotations

import asyncio
import functools
import grp
import hashlib
import os
import pwd
import re
import shutil
import stat as statmod
import time
import uuid
from pathlib import Path
from typing import Any

from ._service import BaseHandler, q
from .firecrest_model import (
    INVALID_ACCOUNT,
    MAX_PART_SIZE,
    MIN_PART_SIZE,
    SLURM_ERROR,
    Handler,
    QuotaRefusal,
    SlurmRefusal,
)


@functools.lru_cache(maxsize=256)
def _owner(uid: int, gid: int) -> tuple[str, str]:
    """``ls -l``'s owner and group names (the Unix user's on the real server, not fixed
    words: seen beside it); a number when the id has no name, as ls prints it.  Cached:
    a listing of thousands of files has a handful of owners (ls caches them too)."""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return user, group


def _file_entry(p: Path, name: str) -> dict[str, Any]:
    st = p.lstat()
    kind = "d" if statmod.S_ISDIR(st.st_mode) else "l" if statmod.S_ISLNK(st.st_mode) else "-"
    user, group = _owner(st.st_uid, st.st_gid)
    return {"name": name, "type": kind,
            "linkTarget": os.readlink(p) if kind == "l" else None, "user": user,
            "group": group, "permissions": statmod.filemode(st.st_mode)[1:],
            "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(st.st_mtime)),
            "size": str(st.st_size)}



def _ls_text_size(entries: list[dict[str, Any]], recursive: bool) -> int:
    """The bytes of ``ls -l --quoting-style=c --time-style=+%Y-%m-%dT%H:%M:%S`` for these
    entries: a line each (``-rw-r--r-- 1 user group 12 2024-01-01T00:00:00 "name"``,
    names without their folder), and with ``-R`` a ``"./folder":`` and ``total N`` line
    for each folder — what FirecREST's SSH reader counts against max_ops_file_size."""
    n = 0
    folders = {"."}
    for e in entries:
        folder, _, name = e["name"].rpartition("/")
        folders.add(folder or ".")
        n += len(f"{e['type']}{e['permissions']} 1 {e['user']} {e['group']} {e['size']} "
                 f"{e['lastModified']} \"{name}\"\n".encode())
    if recursive:
        n += sum(len(f'"./{f}":\ntotal 0\n\n'.encode()) for f in folders)
    return n


class OpsHandler(Handler):
    async def _ls(self, p: Path) -> None:
        """FirecREST's get_ls (filesystem/ops/router.py) runs ``timeout <command_execution>
        ls -l --quoting-style=c ... [-R] [-A]`` (LsBaseCommand, BaseCommandWithTimeout)
        through SSHClient.execute (lib/ssh_clients/ssh_client.py), which gives up after
        ``ssh.timeout.command_execution`` seconds (5 by default; TimeoutLimitExceeded) and
        stops reading at ``max_ops_file_size`` bytes of output (OutputLimitExceeded):
        build_http_error_from_exception answers 408 and 413.  So a folder has no entry
        limit of its own, but a listing whose ``ls -l`` text reaches the buffer (here:
        the same text, measured) or that runs over the timeout (here: the walk plus the
        ``fs_delay`` of a slow file system, set over /_emulator/system) is refused."""
        svc = self.svc
        recursive = self.get_argument("recursive", "false") == "true"
        hidden = self.get_argument("showHidden", "false") == "true"
        t0 = time.monotonic()
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
        took = time.monotonic() - t0 + svc.fs_delay
        if _ls_text_size(entries, recursive) >= svc.ops_limit:
            self.fail(413, "Command output exceeded buffer limit.")
            return
        if took >= svc.command_timeout:
            await asyncio.sleep(max(0.0, svc.command_timeout - (time.monotonic() - t0)))
            self.fail(408, "Command execution timeout limit exceeded.")
            return
        if svc.fs_delay:
            await asyncio.sleep(svc.fs_delay)
        self.reply({"output": entries})

    async def get(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        p = self.sys_path(self.get_argument("path", None))
        if p is None:
            return
        if op == "download":
            if not p.is_file():
                self.remote_failed(404, f"base64: {p}: No such file or directory")
                return
            if 4 * -(-p.stat().st_size // 3) >= self.svc.ops_limit:
                # get_download runs `base64 --wrap=0` (Base64Command) over SSH, whose reader
                # stops at max_ops_file_size: the encoded file (4 bytes per 3) reaching it
                # is OutputLimitExceeded, 413 (ssh_client.py, SSHClient.execute) — before
                # the router's own "File to download is too large." check could run
                self.fail(413, "Command output exceeded buffer limit.")
                return
            self.set_header("Content-Type", "application/octet-stream")
            self.finish(p.read_bytes())
            return
        if not p.exists():
            if op == "ls":
                self.remote_failed(404, f"ls: cannot access '{p}': No such file or directory",
                                   rc=2)
            elif op == "view":
                self.remote_failed(404, f"dd: failed to open '{p}': No such file or directory")
            elif op == "stat":  # coreutils' stat uses statx (seen beside the real server)
                self.remote_failed(404, f"stat: cannot statx '{p}': No such file or directory")
            else:
                self.remote_failed(404, f"{op}: cannot open '{p}' for reading: No such file "
                                        "or directory")
            return
        if op == "ls":
            await self._ls(p)
        elif op == "stat":
            st = p.stat()
            self.reply({"output": {"mode": st.st_mode, "ino": st.st_ino, "dev": st.st_dev,
                                   "nlink": st.st_nlink, "uid": st.st_uid, "gid": st.st_gid,
                                   "size": st.st_size, "atime": int(st.st_atime),
                                   "ctime": int(st.st_ctime), "mtime": int(st.st_mtime)}})
        elif op == "view":
            if p.is_dir():
                # dd's statistics follow its error (seen beside the real server)
                self.remote_failed(500, f"dd: error reading '{p}': Is a directory\n"
                                        "0+0 records in\n0+0 records out\n0 bytes copied, "
                                        "5.1e-05 s, 0.0 kB/s\n")
                return
            try:  # FirecREST's query default for size is 5 MiB (ops/router.py, get_view)
                size = int(self.get_argument("size", str(5 * 1024 * 1024)))
                offset = int(self.get_argument("offset", "0"))
            except ValueError:
                self.fail(400, "size and offset must be integers", errorType="validation")
                return
            if offset < 0:
                self.fail(400, "`offset` value must be an integer value equal or greater "
                               "than 0")
                return
            if size <= 0:
                self.fail(400, "`size` value must be an integer value greater than 0")
                return
            if size > self.svc.ops_limit:
                self.fail(400, f"`size` value must be less than {self.svc.ops_limit} bytes")
                return
            # DdCommand: dd bs=size skip=offset//size count=2 — two blocks come back over
            # SSH, whose reader stops at max_ops_file_size: an output that reaches it is
            # OutputLimitExceeded, a 413 (ssh_client.py, SSHClient.execute;
            # api_response_model.py, build_http_error_from_exception).  So a whole file
            # (no size: 5 MiB blocks) of 5 MiB or more is a 413, and so is any read whose
            # two blocks reach the limit
            skip = offset // size
            with open(p, "rb") as f:
                f.seek(skip * size)
                block = f.read(2 * size)
            if len(block) >= self.svc.ops_limit:
                self.fail(413, "Command output exceeded buffer limit.")
                return
            # DdCommand.parse_output: the output is decoded, then cut in characters
            i = offset % size
            self.reply({"output": block.decode(errors="replace")[i:i + size]})
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
                    start, end = (n, -1) if skip else (-n, -1)
                else:
                    out = data[:-n] if skip else data[:n]
                    start, end = (0, -n) if skip else (0, n)
            else:
                n = int(lines or 10)
                rows = data.splitlines(keepends=True)
                if op == "tail":
                    out = b"".join(rows[max(0, n - 1):] if skip else rows[-n:])
                    start, end = (n, -1) if skip else (-n, -1)
                else:
                    out = b"".join(rows[:-n] if skip else rows[:n])
                    start, end = (0, -n) if skip else (0, n)
            if len(out) > self.svc.ops_limit:  # the SSH client's output buffer
                self.fail(413, "Command output exceeded buffer limit.")
                return
            self.reply({"output": {"content": out.decode(errors="replace"),
                                   "contentType": "bytes" if nbytes else "lines",
                                   "startPosition": start, "endPosition": end}})
        elif op == "checksum":
            self.reply({"output": {"algorithm": "SHA256",
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
                self.remote_failed(500, f"mkdir: cannot create directory '{p}': File exists")
                return
            if not p.exists():
                first = p  # the first folder mkdir has to make
                while not first.parent.exists():
                    first = first.parent
                if not body.get("parent") and first != p:
                    self.remote_failed(404, f"mkdir: cannot create directory '{p}': No such "
                                            "file or directory")
                    return
                if not self.may_write(first, f"mkdir: cannot create directory '{first}'"):
                    return
            p.mkdir(parents=True, exist_ok=True)
            # mkdir_command.py lists the new folder with ls: name is the whole path
            self.reply({"output": _file_entry(p, str(p))}, 201)
        elif op == "upload":
            folder = self.sys_path(self.get_argument("path", None))
            if folder is None:
                return
            files = self.request.files.get("file")
            if not files:
                self.fail(400, "Field required: file", errorType="validation")
                return
            f = files[0]
            if len(f["body"]) > self.svc.ops_limit:
                self.fail(413, "File to upload is too large.")
                return
            target = self.sys_path(str(folder / f["filename"]))
            if target is None:
                return
            if not folder.is_dir():  # the path is the folder; the file keeps its name
                self.remote_failed(404, f"bash: line 1: {target}: No such file or directory")
                return
            if not self.may_write(target, f"bash: line 1: {target}"):
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
            self.remote_failed(404, f"rm: cannot remove '{p}': No such file or directory")
            return
        if not self.may_write(p, f"rm: cannot remove '{p}'"):
            return
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        self.reply(None, 204)


class TransferHandler(Handler):
    def post(self, system: str, op: str) -> None:
        """The transfer job is an sbatch like any other (FirecREST submits it through the
        same scheduler client): its refusals answer as a job's do."""
        try:
            self._post(system, op)
        except QuotaRefusal as e:  # SlurmQuotaError: 403
            self.fail(403, str(e))
        except SlurmRefusal as e:
            self.fail(500, str(e))

    def _post(self, system: str, op: str) -> None:
        if not self.system_ok(system):
            return
        if not self.svc.staging:  # FirecREST without data_transfer configured
            self.fail(500, "(\"'NoneType' object has no attribute 'service_type'\",)")
            return
        body = self.json_body() or {}
        directives = body.get("transfer_directives") or body.get("transferDirectives") or {}
        method = directives.get("transfer_method") or directives.get("transferMethod") or "s3"
        if method != "s3":
            self.fail(400, "Requested transfer method is not available.")
            return
        s = self.svc
        account = body.get("account")
        if account and account not in s.accounts:  # the transfer job's sbatch says no
            self.fail(500, SLURM_ERROR.format(rc=1, err=INVALID_ACCOUNT))
            return
        bucket = re.sub(r"[^A-Za-z0-9._-]", "_", self.user)
        if op == "upload":
            target = self.sys_path(body.get("path") or body.get("sourcePath"))
            if target is None:
                return
            if not self.may_write(target, f"cp: cannot create regular file '{target}'"):
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
        small = [p for p in parts[:-1] if p.stat().st_size < MIN_PART_SIZE]
        if small:  # S3: every part but the last must be at least 5 MiB
            self.set_status(400)
            self.set_header("Content-Type", "application/xml")
            self.finish("<Error><Code>EntityTooSmall</Code><Message>Your proposed upload is "
                        "smaller than the minimum allowed object size.</Message></Error>")
            return
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

