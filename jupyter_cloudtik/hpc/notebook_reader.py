"""Reading a notebook for the checks before a submit without holding the server's loop.

Why a module of its own: a job's or a sweep's parameters are checked against the
notebook's cell tagged ``parameters`` before anything is submitted, and a notebook can be
hundreds of megabytes of outputs.  ``json.loads`` of 200 MB holds the GIL for seconds, so
even in a worker thread the loop every job, request and kernel call shares stood still
(0.6-1.3 s measured).  A notebook over ``READ_APART_BYTES`` is read by a process of its
own, which hands back only what the checks read (``notebook.parameters_view``: the
metadata and the parameters cell).  The reader fails closed: if it cannot run or dies,
the submit is refused with why, never passed unchecked.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..core.errors import CloudTikError, ConfigError, NotFoundError
from . import notebook as nbtools
from .job_content import _notebook_json
from .recording import read_recorded

__all__ = ["READ_APART_BYTES", "RECORDED_APART_BYTES", "notebook_view", "recorded_values"]

#: a notebook this large (bytes) is read in a process of its own
READ_APART_BYTES = 8 << 20
#: an executed notebook this large is read for a sweep's results table in a process of
#: its own: the table reads up to 16 MiB per element and 64 MiB in all, and json.loads
#: holds the GIL ~0.1 s per 16 MiB of ordinary outputs, longer for many small cells, so
#: each element stalled the loop (a worker thread does not help: sweep_results)
RECORDED_APART_BYTES = 1 << 20
_ERRORS: dict[str, type[CloudTikError]] = {"NotFoundError": NotFoundError,
                                           "ConfigError": ConfigError}


def _view_here(source: str | bytes) -> dict[str, Any]:
    nb = _notebook_json(source) if isinstance(source, bytes) else nbtools.check_notebook(source)
    return nbtools.parameters_view(nb)


def _size(source: str | bytes) -> int:
    if isinstance(source, bytes):
        return len(source)
    try:
        return os.stat(Path(source).expanduser()).st_size
    except OSError:
        return 0  # check_notebook says what is wrong with it


async def notebook_view(source: str | bytes) -> dict[str, Any]:
    """The notebook at ``source`` (a local path, or its bytes as sent), checked as a
    version-4 notebook, as much of it as the parameter checks read."""
    if _size(source) < READ_APART_BYTES:
        return await asyncio.to_thread(_view_here, source)
    name = "the sent notebook" if isinstance(source, bytes) else repr(str(source))
    return await _apart("view", source, f"notebook: {name} could not be read for the "
                                        "parameter check")


async def recorded_values(data: bytes) -> dict[str, Any]:
    """The values an executed notebook recorded (``recording.read_recorded``), read
    in a worker thread when small and in a process of its own from
    ``RECORDED_APART_BYTES`` on.  A reader that cannot run raises ConfigError (the row
    then says its values were not read), never an empty answer."""
    if len(data) < RECORDED_APART_BYTES:
        return await asyncio.to_thread(read_recorded, data)
    return await _apart("recorded", data, "values not read: its executed notebook could "
                                          "not be parsed here")


async def _apart(kind: str, source: str | bytes, failed: str) -> Any:
    """Run ``_main`` in a new interpreter on ``source`` and return its ``kind`` answer;
    its error is raised as the error it was; a reader that did not start, died or said
    nothing is a ConfigError starting with ``failed`` (fail closed)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c",
            "from jupyter_cloudtik.hpc.notebook_reader import _main; _main()",
            "-" if isinstance(source, bytes) else str(source), kind,
            stdin=asyncio.subprocess.PIPE if isinstance(source, bytes)
            else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(source if isinstance(source, bytes) else None)
    except OSError as e:
        raise ConfigError(f"{failed} (its reader did not start: {e})",
                          field="notebook") from None
    try:
        answer = json.loads(out) if proc.returncode == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not ({kind, "error"} & answer.keys()):
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"{failed} (its reader exited {proc.returncode}: {last[:300]})",
                          field="notebook")
    if "error" in answer:
        e = answer["error"]
        raise _ERRORS.get(e.get("kind"), ConfigError)(str(e.get("message")),
                                                      field=e.get("field") or "notebook")
    return answer[kind]


def _main() -> None:
    """The reader process: argv[1] is a path, or ``-`` for the bytes on stdin, argv[2]
    what to read (``view``: the parameter checks' view, the default; ``recorded``: the
    values an executed notebook recorded); one JSON object on stdout, ``{kind: ...}`` or
    ``{"error": {kind, message, field}}``."""
    where = sys.argv[1]
    kind = sys.argv[2] if len(sys.argv) > 2 else "view"
    source: str | bytes = sys.stdin.buffer.read() if where == "-" else where
    try:
        if kind == "recorded":
            answer: dict[str, Any] = {kind: read_recorded(source)}
        else:
            answer = {kind: _view_here(source)}
    except (NotFoundError, ConfigError) as e:
        answer = {"error": {"kind": type(e).__name__, "message": e.message,
                            "field": e.field}}
    sys.stdout.write(json.dumps(answer))
