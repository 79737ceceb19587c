"""The files of a job on a FirecREST system: its log, its outputs' listing, reads and
downloads (a part of ``FirecrestBackend``, split from ``firecrest.py``).

What the real FirecREST v2 does here (its source, eth-cscs/firecrest-v2):

* ``view`` runs ``dd bs=size skip=offset/size count=2`` (``DdCommand``) and its SSH reader
  stops at ``max_ops_file_size``: two blocks must stay under it, else 413.
* ``ls`` runs ``timeout <commandExecution> ls -l ...`` (``LsBaseCommand``,
  ``BaseCommandWithTimeout``) through the same SSH reader (``SSHClient.execute``): a
  listing that runs longer than ``ssh.timeout.command_execution`` (5 s by default) is a 408
  ("Command execution timeout limit exceeded.", or exit status 124 of ``timeout``), one
  whose output reaches ``max_ops_file_size`` (so many entries) is a 413 ("Command output
  exceeded buffer limit.") — ``build_http_error_from_exception`` in
  ``lib/models/apis/api_response_model.py``.  Neither is an empty folder nor an outage:
  the listing is told as too large/slow in one line, naming the folder and the limit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..core.errors import NotFoundError, ProviderError
from . import script
from .base import JobRef, LogChunk, OutputFile, remote_inside
from .files import INPUTS_LIST

# data_operation.max_ops_file_size when the server does not say (FirecREST's default)
DEFAULT_OPS_LIMIT = 5 * 1024 * 1024


class ListingTooLarge(ProviderError):
    """``ops/ls`` over FirecREST's output or time limit (413, 408): the folder is there,
    its listing cannot be had in one call."""


class FirecrestFiles:
    """Reading a job's folder through ``ops/view``, ``ops/ls`` and downloads."""

    def _view(self, path: str) -> str:
        """A whole (small) file, never asking ``view`` for more than it may answer: one
        block under the limit (see ``_read_block``); a file that fills it is read through
        the download path instead (staged when over the direct limit)."""
        data, eof = self._read_block(path, 0, self.view_block)
        if eof:
            return data.decode(errors="replace")
        if not self.staged_transfers and \
                (self._stat_size(path) or 0) > self.direct_download_max:
            raise ProviderError(
                f"cannot read {path}: it is over what FirecREST sends directly "
                f"({self.direct_download_max} bytes) and '{self.system}' offers no staged "
                "transfer")
        with tempfile.TemporaryDirectory(prefix="cloudtik-f7t-") as tmp:
            target = Path(tmp) / "file"
            self._download(path, target)
            return target.read_bytes().decode(errors="replace")

    def _stat_size(self, path: str) -> int | None:
        return _int((self._call("stat", self.system, path) or {}).get("size"))

    @property
    def view_block(self) -> int:
        """The largest ``size`` a ``view`` may ask for.  FirecREST's view runs ``dd
        bs=size skip=offset/size count=2`` (DdCommand) and its SSH reader stops at
        ``max_ops_file_size``: an output that reaches it is a 413 (SSHClient.execute,
        "Command output exceeded buffer limit.").  Two blocks must stay under it."""
        return max(1, ((self.max_direct_size or DEFAULT_OPS_LIMIT) - 1) // 2)

    def _read_block(self, path: str, offset: int, block: int) -> tuple[bytes, bool]:
        """The file's bytes from ``offset`` to the end of the ``block``-aligned block it
        is in (a little past it, to the end of a character cut there), and whether the
        file ends there.

        FirecREST's view decodes dd's output and cuts it in *characters*
        (DdCommand.parse_output: ``stdout[offset % size:][:size]``), so an offset inside
        a block would be counted in characters; reading whole aligned blocks keeps our
        offsets in bytes.  A block starting inside a character begins with one U+FFFD
        per byte of it, counted back as one byte each."""
        start = offset - offset % block
        text = self._call("_view_part", path, start, block)
        lead = 0  # (at 0 the file itself starts there: nothing is cut)
        while start and lead < min(3, len(text)) and text[lead] == "\ufffd":
            lead += 1
        raw = b"\0" * lead + text[lead:].encode()
        eof = len(raw) < block
        end = len(raw)
        if not eof:  # to the first character boundary at or after the block's end
            pos = lead
            for ch in text[lead:]:
                if pos >= block:
                    break
                pos += len(ch.encode())
            end = pos
        return raw[offset - start:end], eof

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        """``ops/view`` of one aligned block from ``offset`` (see ``_read_block``): a
        bounded read under the server's output limit (a larger read answers 413)."""
        path = f"{self.folder(job.id)}/{script.LOG_NAME}"
        try:
            data, eof = self._read_block(path, offset, min(limit, self.view_block))
        except NotFoundError:
            return LogChunk("", offset, eof=True)
        return LogChunk(data.decode(errors="replace"), offset + len(data), eof=eof)

    def _view_part(self, path: str, offset: int, size: int) -> str:
        """GET ops/view?offset&size (pyfirecrest's ``view`` has no offset)."""
        client = self.client()
        resp = client._get_request(endpoint=f"/filesystem/{self.system}/ops/view",
                                   params={"path": path, "offset": offset, "size": size})
        return client._check_response(resp, 200)["output"]

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        folder = self.folder(job.id)
        skip = set(script.SCAFFOLDING) | {script.LOG_NAME}
        try:
            skip |= set(self._view(f"{folder}/{script.MARKER_DIR}/{INPUTS_LIST}").splitlines())
        except NotFoundError:
            pass
        out = []
        try:
            entries = self._ls(folder, recursive=True)
        except ListingTooLarge:  # one listing of all is over a limit: folder by folder
            entries = self._walk(folder)
        for f in entries:
            name = f.get("name", "")
            if f.get("type") == "d" or name.split("/", 1)[0] in skip or name in skip:
                continue
            size = f.get("size")
            out.append(OutputFile(name, int(size) if str(size).isdigit() else None))
        return sorted(out, key=lambda o: o.name)

    def _ls(self, path: str, recursive: bool = False) -> list[dict[str, Any]]:
        """``ops/ls`` with its limits told (see the module's docstring): a 408 or 413 is
        ``ListingTooLarge`` naming the folder and the limit — not an empty folder, and
        not an outage to wait for (the same listing would meet the same limit)."""
        try:
            return self._call("list_files", self.system, path, recursive=recursive) or []
        except ProviderError as e:
            status = getattr(e, "status", None) or e.details.get("status")
            if status not in (408, 413):
                raise
            raise ListingTooLarge(self._listing_refusal(path, status, e.message)) from None

    def _walk(self, folder: str, prefix: str = "") -> list[dict[str, Any]]:
        """The recursive listing one folder at a time (each ``ls`` under the limits that
        the whole tree's output or time was over); a single folder still over them is
        told in one line."""
        out = []
        for f in self._ls(f"{folder}/{prefix}".rstrip("/")):
            name = f"{prefix}{f.get('name', '')}"
            out.append({**f, "name": name})
            if f.get("type") == "d":
                out += self._walk(folder, f"{name}/")
        return out

    def _listing_refusal(self, path: str, status: int, message: str) -> str:
        info = self.system_info()
        if status == 413:
            limit = self.max_direct_size or DEFAULT_OPS_LIMIT
            return (f"cannot list {path} on '{self.system}': FirecREST answered 413, its "
                    f"'ls -l' output reached the {limit}-byte limit "
                    "(dataOperation.max_ops_file_size): too many entries in one folder; "
                    "fetch the files by name, or keep fewer files in a folder")
        timeout = ((info.get("ssh") or {}).get("timeout") or {}).get("commandExecution")
        limit = f"{timeout} s" if timeout else "its"
        detail = message.split(": ", 1)[-1]
        return (f"cannot list {path} on '{self.system}': FirecREST answered 408, its 'ls' "
                f"ran over the {limit} command limit (ssh.timeout.commandExecution; "
                f"{detail}): the file system is slow or the folder too large; fetch the "
                "files by name, or try again later")

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        path = remote_inside(self.folder(job.id), name)
        with tempfile.TemporaryDirectory(prefix="cloudtik-f7t-") as tmp:
            target = Path(tmp) / "file"
            self._download(path, target)
            with open(target, "rb") as f:
                return f.read(limit)

    def _download(self, path: str, target: Path) -> None:
        self.system_info()  # the direct-transfer limit
        try:
            self._call("_download_with", path, str(target), self.config.get("account"))
        except FileNotFoundError:
            raise NotFoundError(f"the job has no file {path}", field="name") from None

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        out = []
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            self._download(remote_inside(self.folder(job.id), name), target)
            out.append(target)
        return out



def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None
