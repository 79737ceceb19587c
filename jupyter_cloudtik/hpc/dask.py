"""``dask``: the notebook runs as a task on one of our Dask clusters.

From cluster to job in two lines::

    Cluster.up(workers=2)
    Job.submit("analysis.ipynb", backend="dask")   # the only running cluster

``cluster:`` in the backend's config (or the short backend name ``dask:NAME``) picks a
cluster; ``address:`` a scheduler that is not ours.  The task is fire-and-forget: it keeps
running when the kernel that submitted it goes, and reports through the scheduler (see
``dask_task``), which is what every poll asks, once for all jobs.  Inputs and the
notebook travel with the task; results come back as a dataset on the scheduler, so keep
them small or give an output location.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ..core.errors import (
    BackendUnavailable,
    CloudTikError,
    ConfigError,
    NotFoundError,
    ProviderError,
)
from . import dask_task, script
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

MAX_BYTES = 256 * 1024 * 1024


class DaskBackend(HPCBackend):
    kind = "dask"
    description = "a task on one of our Dask clusters"
    direct_schemes = ("http", "https")
    config_schema = {
        "type": "object",
        "properties": {
            "type": {"const": "dask"},
            "cluster": {"type": "string", "description": "cluster name (default: the only "
                                                         "running one)"},
            "address": {"type": "string", "description": "a scheduler address instead"},
            "max_transfer_bytes": {"type": "integer", "minimum": 1},
            "reaches": {"type": "array", "items": {"type": "string"}},
            "environment": {"type": "object"},
            "limits": {"type": "object"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, config: dict[str, Any], context) -> None:
        super().__init__(name, config, context)
        self._client = None
        self._lock = threading.Lock()
        self._provider: str | None = None
        self.max_bytes = int(self.config.get("max_transfer_bytes", MAX_BYTES))

    # the cluster -----------------------------------------------------------------------------
    def _cluster_name(self) -> str:
        # deferred: start-up (clusters.client ~20 ms, loads asyncio, sqlite3)
        from ..clusters.client import get_backend, resolve_name

        return resolve_name(get_backend(self.context.settings), self.config.get("cluster"))

    def client(self):
        import distributed

        with self._lock:
            if self._client is not None and self._client.status == "running":
                return self._client
            try:
                if self.config.get("address"):
                    self._client = distributed.Client(self.config["address"], timeout=10,
                                                      set_as_default=False)
                    self._provider = None
                else:
                    # deferred: start-up (clusters.api ~42 ms, loads asyncio, yaml; clusters.client
                    #   ~26 ms, loads asyncio, sqlite3)
                    from ..clusters.api import Cluster
                    from ..clusters.client import get_backend

                    cluster = Cluster.get(self._cluster_name(),
                                          get_backend(self.context.settings))
                    self._provider = cluster.info.provider
                    self._client = cluster.client(timeout=10, set_as_default=False)
            except CloudTikError as e:
                raise ProviderError(f"backend '{self.name}': {e.message}") from None
            except (OSError, TimeoutError) as e:
                raise BackendUnavailable(f"cannot reach the Dask scheduler: {e}") from None
            return self._client

    @property
    def shares_local_filesystem(self) -> bool:  # type: ignore[override]
        if self.config.get("address"):
            return False
        try:
            self.client()
        except CloudTikError:
            return False
        return self._provider == "local"

    def _call(self, fn):
        from distributed.comm.core import CommClosedError

        try:
            return fn(self.client())
        except CloudTikError:
            raise
        except (OSError, TimeoutError, CommClosedError) as e:
            self._drop()
            raise BackendUnavailable(f"lost the Dask scheduler: {type(e).__name__}: {e}") \
                from None

    def _drop(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close(timeout=2)
            except Exception:
                pass

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["where"] = self.config.get("address") or \
            f"cluster {self.config.get('cluster') or '(the only running one)'}"
        return d

    # limits -----------------------------------------------------------------------------------
    def limits(self) -> Limits:
        lim = super().limits()
        info = self._call(lambda c: c.scheduler_info(n_workers=-1))
        workers = list((info.get("workers") or {}).values())
        if not workers:
            raise ProviderError(f"backend '{self.name}': the Dask cluster has no workers")
        lim.max_nodes = 1
        threads = max(int(w.get("nthreads", 1)) for w in workers)
        lim.max_cpus_per_node = min(lim.max_cpus_per_node or threads, threads)
        mems = [int(w["memory_limit"]) for w in workers if w.get("memory_limit")]
        if mems:
            lim.max_memory_per_node = min(lim.max_memory_per_node or max(mems), max(mems))
        return lim

    # submitting -------------------------------------------------------------------------------
    def submit(self, sub: Submission) -> str:
        key = dask_task.topic(sub.job_id)
        files: dict[str, bytes] = {}
        total = 0

        def add(name: str, path: Path) -> None:
            nonlocal total
            items = [(name, path)] if path.is_file() else [
                (f"{name}/{p.relative_to(path).as_posix()}", p)
                for p in sorted(path.rglob("*")) if p.is_file()]
            for n, p in items:
                total += p.stat().st_size
                if total > self.max_bytes:
                    raise ConfigError(
                        f"inputs: more than {self.max_bytes} bytes would travel with the task; "
                        "put large inputs where the workers read them (a URL or a shared "
                        "path)", field="inputs")
                files[n] = p.read_bytes()

        for name, local in sub.files.items():
            add(name, Path(local))
        for item in sub.inputs:
            if item.mode == "upload":
                add(item.name, Path(item.source))
        direct = [(i.name, _plain(i.source)) for i in sub.inputs if i.mode == "direct"]
        spec = sub.spec
        nb = Path(spec.notebook).name if spec.notebook else None

        def go(c):
            import distributed

            fut = c.submit(dask_task.run_job, sub.job_id, files, direct, spec.parameters, nb,
                           sub.output_notebook, spec.command, spec.kernel or "python3",
                           list(spec.outputs), dict(sub.environment.variables),
                           self.max_bytes, key=key, pure=False, retries=0)
            distributed.fire_and_forget(fut)
            # the graph travels asynchronously: return once the scheduler holds the task,
            # so a poll right after this never mistakes the job for a lost one
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                r = c.run_on_scheduler(dask_task.scheduler_report, job_ids=[sub.job_id])
                if r[sub.job_id]["task"] or r[sub.job_id]["last"]:
                    return key
                time.sleep(0.02)
            raise BackendUnavailable("the Dask scheduler did not take the task within 30s")

        return self._call(go)

    def find(self, token: str, job_id: str) -> str | None:
        report = self._call(lambda c: c.run_on_scheduler(dask_task.scheduler_report,
                                                         job_ids=[job_id]))
        r = report.get(job_id) or {}
        if r.get("task") or r.get("last") or r.get("published"):
            return dask_task.topic(job_id)
        return None

    # watching ---------------------------------------------------------------------------------
    def poll(self, jobs: list[JobRef]) -> dict[str, JobStatus]:
        ids = [j.id for j in jobs]
        report = self._call(lambda c: c.run_on_scheduler(dask_task.scheduler_report,
                                                         job_ids=ids))
        out = {}
        for job in jobs:
            r = report.get(job.id) or {}
            last, task = r.get("last") or {}, r.get("task")
            state = last.get("state")
            if state == "succeeded":
                out[job.native_id] = JobStatus(SUCCEEDED, "finished", exit_code=0)
            elif state == "failed":
                rc = last.get("exit_code")
                msg = last.get("error") or (f"exit code {rc}" if rc is not None else None)
                out[job.native_id] = JobStatus(FAILED, "finished", msg, exit_code=rc)
            elif state == "cancelled":
                out[job.native_id] = JobStatus(CANCELLED, "cancelled", "cancelled by request")
            elif state == "running" and task in ("processing", "memory", None):
                out[job.native_id] = JobStatus(RUNNING, task or "processing")
            elif task in ("waiting", "queued", "no-worker", "released"):
                out[job.native_id] = JobStatus(QUEUED, task)
            elif task == "processing":
                out[job.native_id] = JobStatus(QUEUED, "processing")
            elif task == "erred":
                out[job.native_id] = JobStatus(FAILED, "erred", r.get("error") or
                                               "the task failed on the worker")
            else:
                out[job.native_id] = JobStatus(FAILED, task or "lost",
                                               "the Dask cluster no longer has the job (the "
                                               "scheduler restarted or the worker died)")
        return out

    def cancel(self, job: JobRef) -> None:
        def go(c):
            import distributed

            distributed.Event(f"{dask_task.CANCEL_PREFIX}{job.id}", client=c).set()
            try:
                distributed.Future(job.native_id, client=c).cancel()
            except Exception:
                pass

        self._call(go)

    def logs(self, job: JobRef, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        events = self._call(lambda c: c.get_events(dask_task.topic(job.id)))
        text = "".join(m["log"] for _t, m in events if isinstance(m, dict) and "log" in m)
        data = text.encode()
        chunk = data[offset:offset + limit]
        return LogChunk(chunk.decode(errors="replace"), offset + len(chunk),
                        eof=offset + len(chunk) >= len(data))

    def _results(self, job: JobRef) -> dict[str, bytes]:
        name = dask_task.topic(job.id)
        data = self._call(lambda c: c.get_dataset(name, default=None))
        if data is None:
            raise NotFoundError(f"the Dask cluster holds no results of job {job.id}",
                                field="job")
        return data["files"]

    def list_outputs(self, job: JobRef) -> list[OutputFile]:
        return [OutputFile(n, len(b)) for n, b in sorted(self._results(job).items())]

    def read_file(self, job: JobRef, name: str, limit: int = 16 << 20) -> bytes:
        files = self._results(job)
        if name not in files:
            raise NotFoundError(f"the job has no file {name!r}", field="name")
        return files[name][:limit]

    def fetch_outputs(self, job: JobRef, dest: Path, names: list[str]) -> list[Path]:
        files = self._results(job)
        out = []
        for name in names:
            if name not in files:
                raise NotFoundError(f"the job has no file {name!r}", field="name")
            target = dest / name
            if dest.resolve() not in target.resolve().parents:
                raise ConfigError(f"name: {name!r} is outside the job's folder", field="name")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[name])
            out.append(target)
        return out

    def clean(self, job: JobRef) -> None:
        try:
            self._call(lambda c: c.unpublish_dataset(dask_task.topic(job.id)))
        except (CloudTikError, KeyError):
            pass

    def close(self) -> None:
        self._drop()


def _plain(source: str) -> str:
    return script._system_path(source) if "://" not in source or source.startswith(
        "file://") else source
