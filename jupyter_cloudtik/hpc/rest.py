"""``RestJobsClient``: the jobs client over the server extension's REST API.

A kernel started by a Jupyter server with the extension (``CLOUDTIK_API_URL`` set) asks
the server, which runs the one job manager and poller, instead of running its own; the
same calls as ``JobsClient`` answer with the same types, so ``%hpc`` and ``Job`` cannot tell
the difference.  Local paths are made absolute here (the kernel's folder), as the server
would otherwise read them relative to its root folder.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..api.client import RestClient, _seg
from ..core.errors import ConfigError
from ..core.operations import Event
from .base import JobSpec, LogChunk, OutputFile, follow_logs
from .env_requirements import parse
from .models import JobInfo
from .staging import is_local, local_path, split_named
from .sweeps import SweepInfo


def _absolute(location: str) -> str:
    name, loc = split_named(location)
    if not is_local(loc):
        return location
    path = str(local_path(loc).resolve())
    return f"{name}={path}" if name else path


def _cell_notebook(notebook: str | None) -> Path | None:
    """The notebook ``%%hpc`` wrote for a cell (in this session's state folder), if it is."""
    if not notebook:
        return None
    # deferred: start-up (core.settings ~17 ms, loads traitlets, jupyter_core)
    from ..core.settings import default_settings

    cells = (default_settings().state_path / "hpc" / "cells").resolve()
    path = Path(notebook).expanduser().resolve()
    return path if cells in path.parents and path.is_file() else None


class RestJobsClient:
    kind = "rest"

    def __init__(self, rest: RestClient) -> None:
        self.rest = rest

    @classmethod
    def from_environment(cls) -> RestJobsClient:
        return cls(RestClient.from_environment())

    def __repr__(self) -> str:
        return f"<RestJobsClient {self.rest.url}>"

    # reading ---------------------------------------------------------------------------
    def backends(self) -> list[dict[str, Any]]:
        return self.rest._json("GET", "hpc/backends")["backends"]

    def get(self, job_id: str) -> JobInfo:
        return JobInfo.from_dict(self.rest._json("GET", f"jobs/{_seg(job_id)}"))

    def list(self, active_only: bool = False, backend: str | None = None,
             limit: int = 100) -> list[JobInfo]:
        data = self.rest._json("GET", "jobs", params={
            "active": "true" if active_only else None, "backend": backend, "limit": limit})
        return [JobInfo.from_dict(j) for j in data["jobs"]]

    def refresh(self, job_id: str) -> JobInfo:
        return JobInfo.from_dict(self.rest._json("GET", f"jobs/{_seg(job_id)}",
                                                 params={"refresh": "true"}))

    def run_tick(self) -> None:
        """The server polls by itself."""

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        op_id = self.get(job_id).op_id
        data = self.rest._json("GET", f"operations/{_seg(op_id)}/events",
                               params={"after": after or None})
        return [Event.from_dict(e) for e in data["events"]]

    def watch(self, job_id: str, after: int = 0) -> Iterator[Event]:
        return self.rest.events(self.get(job_id).op_id, after=after)

    # acting ----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, backend: str | None = None) -> JobInfo:
        """Submit, and return once the backend took the job (as the core does)."""
        info = JobInfo.from_dict(self.rest._json("POST", "jobs", body=self._body(spec,
                                                                                  backend))["job"])
        while info.state == "submitting":
            time.sleep(0.05)
            info = self.get(info.id)
        return info

    # sweeps ------------------------------------------------------------------------------
    def sweep(self, spec: JobSpec, backend: str | None = None, *,
              grid: dict[str, list[Any]] | None = None, zip: dict[str, list[Any]] | None = None,
              elements: list[dict[str, Any]] | None = None,
              max_concurrent: int | None = None) -> SweepInfo:
        body = self._body(spec, backend)
        body.pop("command", None)
        body.update({k: v for k, v in {"grid": grid, "zip": zip, "elements": elements,
                                       "max_concurrent": max_concurrent}.items()
                     if v is not None})
        return SweepInfo.from_dict(self.rest._json("POST", "jobs/sweeps", body=body)["sweep"])

    def get_sweep(self, sweep_id: str) -> SweepInfo:
        return SweepInfo.from_dict(self.rest._json("GET", f"jobs/sweeps/{_seg(sweep_id)}"))

    def list_sweeps(self, limit: int = 100) -> list[SweepInfo]:
        data = self.rest._json("GET", "jobs/sweeps", params={"limit": limit})
        return [SweepInfo.from_dict(d) for d in data["sweeps"]]

    def cancel_sweep(self, sweep_id: str, element: int | None = None) -> SweepInfo:
        body = {"element": element} if element is not None else {}
        return SweepInfo.from_dict(self.rest._json(
            "POST", f"jobs/sweeps/{_seg(sweep_id)}/cancel", body=body))

    def retry_sweep(self, sweep_id: str) -> SweepInfo:
        return SweepInfo.from_dict(self.rest._json(
            "POST", f"jobs/sweeps/{_seg(sweep_id)}/retry", body={}))

    def sweep_results(self, sweep_id: str) -> list[dict[str, Any]]:
        return self.rest._json("GET", f"jobs/sweeps/{_seg(sweep_id)}/results")["rows"]

    def wait_sweep(self, sweep_id: str, timeout: float | None = None) -> SweepInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get_sweep(sweep_id)
            if info.done or (deadline is not None and time.monotonic() > deadline):
                return info
            time.sleep(0.5)

    def _body(self, spec: JobSpec, backend: str | None) -> dict[str, Any]:
        r, a = spec.resources, spec.attributes
        env = spec.environment
        requirements = env.requirements_text if env is not None else None
        if env is not None and env.requirements:
            # the file is this kernel's, which the server never reads for a request: its
            # contents travel, checked here as the server will (no file lines: a wheel
            # or folder named in it is this kernel's too)
            path = Path(env.requirements).expanduser()
            try:
                requirements = path.read_text()
            except (OSError, UnicodeDecodeError) as e:
                why = getattr(e, "strerror", None) or "not text"
                raise ConfigError(f"environment.requirements: cannot read "
                                  f"{env.requirements!r} ({why})",
                                  field="environment.requirements",
                                  value=env.requirements) from None
            if not parse(requirements, "environment.requirements",
                         label=f"environment.requirements ({path.name})"):
                raise ConfigError(f"environment.requirements: {env.requirements!r} has no "
                                  "requirement", field="environment.requirements",
                                  value=env.requirements)
        body: dict[str, Any] = {
            "notebook": _absolute(spec.notebook) if spec.notebook else None,
            "command": spec.command, "backend": backend, "name": spec.name,
            "parameters": spec.parameters, "nodes": r.node_count,
            "cpus": r.cpu_cores_per_process, "tasks_per_node": r.processes_per_node,
            "memory": r.memory, "time": f"{a.duration:.0f}s" if a.duration else None,
            "queue": a.queue_name, "account": a.account, "reservation": a.reservation_id,
            "inputs": [_absolute(i) for i in spec.inputs], "outputs": list(spec.outputs),
            "output": _absolute(spec.output) if spec.output else None,
            "container": env.container if env else None,
            "python": env.python if env else None, "kernel": spec.kernel,
            "packages": env.packages if env else None, "requirements": requirements,
            "env": dict(env.variables) if env and env.variables else None,
            "allow_unknown_parameters": spec.allow_unknown_parameters or None,
        }
        body = {k: v for k, v in body.items() if v is not None}
        cell = _cell_notebook(spec.notebook)
        if cell is not None:
            # a %%hpc cell is written to the state folder, which the server never reads
            # for a request: it travels as content
            body["notebook"] = cell.name
            body["files"] = {cell.name: base64.b64encode(cell.read_bytes()).decode("ascii")}
        return body

    def cancel(self, job_id: str) -> JobInfo:
        return JobInfo.from_dict(self.rest._json("DELETE", f"jobs/{_seg(job_id)}"))

    def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get(job_id)
            if info.done or (deadline is not None and time.monotonic() > deadline):
                return info
            time.sleep(0.2)

    def logs(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        data = self.rest._json("GET", f"jobs/{_seg(job_id)}/logs",
                               params={"offset": offset, "limit": limit})
        return LogChunk(data["text"], data["offset"], data["eof"])

    def follow_logs(self, job_id: str, offset: int = 0, poll: float = 0.5) -> Iterator[str]:
        return follow_logs(lambda at: self.logs(job_id, at), lambda: self.get(job_id).done,
                           offset, poll)

    def outputs(self, job_id: str) -> list[OutputFile]:
        data = self.rest._json("GET", f"jobs/{_seg(job_id)}/outputs")
        return [OutputFile(o["name"], o["size"]) for o in data["outputs"]]

    def read_file(self, job_id: str, name: str) -> bytes:
        return self.rest._request("GET", f"jobs/{_seg(job_id)}/files/{_seg(name)}").content

    def fetch(self, job_id: str, dest: str | Path | None = None,
              names: list[str] | None = None) -> list[Path]:
        """Download the results into this kernel's folder (``hpc-jobs/<job id>``)."""
        info = self.get(job_id)
        target = Path(dest).expanduser() if dest else Path.cwd() / "hpc-jobs" / info.id
        if names is None:
            names = [f.name for f in self.outputs(info.id)]
        out = []
        for name in names:
            path = (target / name).resolve()
            if target.resolve() not in path.parents:
                raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.read_file(info.id, name))
            out.append(path)
        return out

    def close(self) -> None:
        pass
