"""``local``: the embedded default backend — the job is a process on this machine.

The job script runs detached (its own session), so it outlives the kernel or server that
started it; its pid, start time and exit code are kept in the job's folder, so any later
process can tell how it ended.  Needs nothing but bash and papermill in the session's
environment.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil

from ..core import env as envnames
from ..core.errors import NotFoundError, ProviderError
from ..core.process_groups import GroupRef, terminate_group, writes_under
from ..core.sandbox import sandbox_for
from ..providers.local import processes
from . import files, script
from .base import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    HPCBackend,
    JobRef,
    JobStatus,
    Limits,
    LogChunk,
    OutputFile,
    Submission,
)

CANCELLED_MARKER = "cancelled"


class LocalBackend(HPCBackend):
    kind = "local"
    description = "runs jobs as processes on this machine"
    shares_local_filesystem = True
    direct_schemes = ("http", "https")
    config_schema = {
        "type": "object",
        "properties": {
            "type": {"const": "local"},
            "workdir": {"type": "string", "description": "folder holding the jobs' folders"},
            "environment": {"type": "object"},
            "limits": {"type": "object"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        wd = self.config.get("workdir")
        self.workdir = Path(wd).expanduser() if wd else context.state_dir / "hpc" / "jobs" / name

    def folder(self, job_id: str) -> Path:
        return files.inside(self.workdir, job_id)

    def environment_root(self) -> str:
        # deferred: start-up (hpc.environment ~20 ms, loads importlib.metadata)
        from .environment import ENVS_DIR

        return str(self.workdir / ENVS_DIR)

    def environment_shell(self):
        # deferred: start-up (transport.shell ~29 ms, loads asyncio, ssl)
        from ..transport.shell import LocalShell

        return LocalShell()

    def limits(self) -> Limits:
        lim = super().limits()
        lim.max_nodes = 1 if lim.max_nodes is None else min(lim.max_nodes, 1)
        cpus = os.cpu_count() or 1
        lim.max_cpus_per_node = min(lim.max_cpus_per_node or cpus, cpus)
        mem = psutil.virtual_memory().total
        lim.max_memory_per_node = min(lim.max_memory_per_node or mem, mem)
        return lim

    # jobs ---------------------------------------------------------------------------------
    def submit(self, sub: Submission) -> str:
        """Start the job; its native id is its folder's name (our job id)."""
        folder = self.folder(sub.job_id)
        if self._pid_record(folder):  # a submit that ran before: never start the job twice
            return sub.job_id
        text = script.render(sub, job_dir=str(folder))
        self.stage_environment(sub)
        try:
            files.prepare_folder(folder, sub, text)
        except OSError as e:
            raise ProviderError(f"cannot prepare the job's folder {folder}: {e}") from e
        argv, env = ["bash", str(folder / script.SCRIPT_NAME)], _job_environment()
        sandbox = sandbox_for(self.context.state_dir)
        if sandbox is not None:
            # a state folder shared by many users (the hub sidekick): the job sees its own
            # folder, the system and Python, nothing of the state folder or the service
            sandbox.check()
            sandbox.prepare(folder)
            argv = sandbox.command(argv, writable=[folder], cwd=folder)
            env = sandbox.environment(home=folder)
        try:
            with open(folder / script.LOG_NAME, "ab") as log:
                proc = subprocess.Popen(
                    argv, cwd=folder, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                    env=env)
        except OSError as e:
            raise ProviderError(f"cannot start the job: {e}") from e
        started = processes.start_time(proc.pid)
        (folder / script.MARKER_DIR / "pid").write_text(f"{proc.pid} {started or ''}\n")
        # reap it when it ends while we live; after we are gone, init does
        threading.Thread(target=proc.wait, name=f"job-{sub.job_id}", daemon=True).start()
        return sub.job_id

    def find(self, token: str, job_id: str) -> str | None:
        return job_id if self._pid_record(self.folder(job_id)) else None

    def _pid_record(self, folder: Path) -> tuple[int, float | None] | None:
        text = files.read_marker(folder, "pid")
        if not text:
            return None
        parts = text.split()
        return int(parts[0]), (float(parts[1]) if len(parts) > 1 else None)

    def _folder_of(self, job: JobRef) -> Path:
        folder = self.folder(job.id)
        if not folder.exists():
            raise NotFoundError(f"no local job {job.id} in {self.workdir}", field="job")
        return folder

    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        out = {}
        for job in jobs:
            nid = job.native_id
            folder = self.folder(job.id)
            rec = self._pid_record(folder)
            if rec is None:
                out[nid] = JobStatus(FAILED, "MISSING",
                                     f"the job's folder {folder} has no process record")
                continue
            status = self._status(folder, *rec)
            status.metadata["pid"] = rec[0]
            out[nid] = status
        return out

    def _status(self, folder: Path, pid: int, started: float | None) -> JobStatus:
        if files.read_marker(folder, CANCELLED_MARKER) is not None:
            return JobStatus(CANCELLED, "CANCELLED", "cancelled by request")
        code = files.read_marker(folder, "exitcode")
        if code is not None:
            rc = int(code) if code.lstrip("-").isdigit() else -1
            if rc == 0:
                return JobStatus(SUCCEEDED, "EXITED", exit_code=0)
            return JobStatus(FAILED, "EXITED", f"exit code {rc}", exit_code=rc)
        if processes.is_alive(pid, started):
            if files.read_marker(folder, "started") is None:
                return JobStatus(QUEUED, "STARTING")
            return JobStatus(RUNNING, "RUNNING")
        return JobStatus(FAILED, "VANISHED",
                         "the job's process ended without an exit code (killed?)")

    def cancel(self, job: JobRef) -> None:
        folder = self._folder_of(job)
        rec = self._pid_record(folder)
        if rec is None or files.read_marker(folder, "exitcode") is not None:
            return  # never started, or already over
        (folder / script.MARKER_DIR / CANCELLED_MARKER).write_text("1\n")
        pid, started = rec
        # the job's processes log to its folder: the proof they are ours once the leader
        # has ended and its group number may be somebody else's
        terminate_group(GroupRef(pid, started), grace=2.0, owned=writes_under(folder))

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        return files.read_log(self._folder_of(job), offset, limit)

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        return files.list_outputs(self._folder_of(job))

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        path = files.inside(self._folder_of(job), name)
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except FileNotFoundError:
            raise NotFoundError(f"the job has no file {name!r}", field="name") from None

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        folder = self._folder_of(job)
        out = []
        for name in names:
            src = files.inside(folder, name)
            if not src.exists():
                raise NotFoundError(f"the job has no file {name!r}", field="name")
            target = dest / name
            files.copy_into(src, target)
            out.append(target)
        return out

    def clean(self, job: JobRef) -> None:
        import shutil

        try:
            shutil.rmtree(self._folder_of(job))
        except NotFoundError:
            pass


def _job_environment() -> dict[str, str]:
    """The job gets the session's environment minus our own bookkeeping and secrets (a
    side-kick's: the variables its supervisor filled from the secret store)."""
    env = dict(os.environ)
    held = {k for k in env.get(envnames.SIDEKICK_SECRET_ENV, "").split(",") if k}
    for key in list(env):
        if key.startswith(envnames.PREFIX) or key in ("JPY_SESSION_NAME",) or key in held:
            env.pop(key)
    return env

