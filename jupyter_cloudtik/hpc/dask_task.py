"""What runs on a Dask worker for the ``dask`` backend (and on its scheduler, for polls).

The task runs papermill (or the command) in a private folder on the worker, as a child
process in its own session so a cancel can end it and everything it started.  It reports
through the scheduler, which outlives the kernel that submitted the job: its state and log
go to the structured event log (topic ``cloudtik-job-<id>``), its results are published
as a dataset of the same name, and a ``distributed.Event`` named ``cloudtik-cancel-<id>``
asks it to stop.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..core.process_groups import signal_child
from . import papermill_runner  # the job script's papermill run, kernel on IPC

PREFIX = "cloudtik-job-"
CANCEL_PREFIX = "cloudtik-cancel-"
LOG_FLUSH_SECONDS = 0.5


def topic(job_id: str) -> str:
    return f"{PREFIX}{job_id}"


def run_job(job_id: str, files: dict[str, bytes], direct: list[tuple[str, str]],
            parameters: dict[str, Any], notebook: str | None, output_notebook: str | None,
            command: list[str] | None, kernel: str, patterns: list[str],
            variables: dict[str, str], max_output_bytes: int) -> int:
    from distributed import Event, get_client, get_worker

    worker = get_worker()
    name = topic(job_id)

    def emit(msg: dict[str, Any]) -> None:
        worker.log_event(name, msg)

    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        for fname, data in files.items():
            target = folder / fname
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        for fname, source in direct:
            emit({"log": f"jupyter_cloudtik: staging in {fname}\n"})
            if source.startswith(("http://", "https://")):
                urllib.request.urlretrieve(source, folder / fname)
            else:
                src = Path(source[len("file://"):] if source.startswith("file://") else source)
                if src.is_dir():
                    shutil.copytree(src, folder / fname)
                else:
                    shutil.copyfile(src, folder / fname)
        (folder / "parameters.json").write_text(json.dumps(parameters))
        before = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        emit({"state": "running", "worker": worker.address, "time": time.time()})
        if notebook:
            argv = papermill_runner.argv(sys.executable, notebook, output_notebook,
                                         "parameters.json", kernel, str(folder))
        else:
            argv = list(command or ["true"])
        env = {**os.environ, **variables}
        proc = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        buf: list[str] = []
        lock = threading.Lock()

        def read() -> None:
            for raw in iter(proc.stdout.readline, b""):
                with lock:
                    buf.append(raw.decode(errors="replace"))

        def flush() -> None:
            with lock:
                text, buf[:] = "".join(buf), []
            if text:
                emit({"log": text})

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        cancel = Event(f"{CANCEL_PREFIX}{job_id}", client=get_client())
        cancelled = False
        while proc.poll() is None:
            if cancel.is_set():
                cancelled = True
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if not signal_child(proc, sig):
                        break
                    try:
                        proc.wait(2)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                break
            flush()
            time.sleep(LOG_FLUSH_SECONDS)
        rc = proc.wait()
        reader.join(5)
        flush()
        outputs: dict[str, bytes] = {}
        total = 0
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder).as_posix()
            if not p.is_file() or rel in before:
                continue
            if patterns and rel != output_notebook and not any(
                    fnmatch.fnmatch(rel, pat) for pat in patterns):
                continue
            size = p.stat().st_size
            if total + size > max_output_bytes:
                emit({"log": f"jupyter_cloudtik: {rel} not kept: the job's results are over "
                             f"{max_output_bytes} bytes (give an output location instead)\n"})
                continue
            total += size
            outputs[rel] = p.read_bytes()
        get_client().publish_dataset(override=True, **{name: {"files": outputs,
                                                                "exit_code": rc}})
        state = "cancelled" if cancelled else ("succeeded" if rc == 0 else "failed")
        emit({"state": state, "exit_code": rc, "time": time.time()})
        return rc
    except BaseException as e:
        emit({"state": "failed", "error": f"{type(e).__name__}: {e}", "time": time.time()})
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scheduler_report(dask_scheduler, job_ids: list[str]) -> dict[str, Any]:
    """Runs on the scheduler: the last reported state of each job and its task's state."""
    publish = dask_scheduler.extensions.get("publish")
    datasets = getattr(publish, "datasets", {}) if publish else {}
    out = {}
    for jid in job_ids:
        name = topic(jid)
        ts = dask_scheduler.tasks.get(name)
        last = None
        for _t, msg in dask_scheduler.get_events(name):
            if isinstance(msg, dict) and "state" in msg:
                last = msg
        out[jid] = {"task": ts.state if ts is not None else None, "last": last,
                    "published": name in datasets,
                    "error": str(ts.exception_blame.exception_text)
                    if ts is not None and ts.state == "erred" and ts.exception_blame
                    and getattr(ts.exception_blame, "exception_text", None) else None}
    return out
