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

__all__ = ["READ_APART_BYTES", "notebook_view"]

#: a notebook this large (bytes) is read in a process of its own
READ_APART_BYTES = 8 << 20
_ERRORS: dict[str, type[CloudTikError]] = {"NotFoundError": NotFoundError,
                                           "ConfigError": ConfigError}


def _view_here(source: str | bytes) -> dict[str, Any]:
    from .job_content import _notebook_json

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
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c",
            "from jupyter_cloudtik.hpc.notebook_reader import _main; _main()",
            "-" if isinstance(source, bytes) else str(source),
            stdin=asyncio.subprocess.PIPE if isinstance(source, bytes)
            else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(source if isinstance(source, bytes) else None)
    except OSError as e:
        raise ConfigError(f"notebook: {name} could not be read for the parameter check "
                          f"(its reader did not start: {e})", field="notebook") from None
    try:
        answer = json.loads(out) if proc.returncode == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not ({"view", "error"} & answer.keys()):
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"notebook: {name} could not be read for the parameter check "
                          f"(its reader exited {proc.returncode}: {last[:300]})",
                          field="notebook")
    if "error" in answer:
        e = answer["error"]
        raise _ERRORS.get(e.get("kind"), ConfigError)(str(e.get("message")),
                                                      field=e.get("field") or "notebook")
    return answer["view"]


def _main() -> None:
    """The reader process: argv[1] is a path, or ``-`` for the bytes on stdin; one JSON
    object on stdout, ``{"view": ...}`` or ``{"error": {kind, message, field}}``."""
    where = sys.argv[1]
    source: str | bytes = sys.stdin.buffer.read() if where == "-" else where
    try:
        answer: dict[str, Any] = {"view": _view_here(source)}
    except (NotFoundError, ConfigError) as e:
        answer = {"error": {"kind": type(e).__name__, "message": e.message,
                            "field": e.field}}
    sys.stdout.write(json.dumps(answer))
