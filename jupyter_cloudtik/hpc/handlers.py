"""HPC job routes of the server extension: backends, jobs, logs, results.

The server keeps one ``JobManager`` (``ctx.feature("hpc")``) on its own event loop, and so
holds the poller lease while it runs: the side panel and every kernel of the server see
the same jobs, kept current by one poller.  Submitting answers ``202 Accepted`` as soon as
the job is recorded (staging inputs and submitting go on; the job's operation carries the
events).  Paths in requests (notebook, inputs, output, fetch destination) are relative to
the server's root folder, like the contents API's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..api.base import CloudTikHandler
from ..core.errors import CloudTikError, ConfigError

JOB_ID = r"(?P<job_id>[^/]+)"
SWEEP_ID = r"(?P<sweep_id>[^/]+)"
FILE_NAME = r"(?P<name>[^/]+)"
KERNEL_ID = r"(?P<kid>[^/]+)"  # a path inside the job's folder, '/' sent as %2F
MAX_FILE_BYTES = 256 * 1024 * 1024


def _manager(ctx):
    def make(ctx):
        # deferred: start-up (hpc.jobs ~38 ms, loads psutil, cryptography; hpc.settings ~6 ms)
        from .jobs import JobManager
        from .settings import HPC

        return JobManager(settings=ctx.settings, hpc=HPC(parent=ctx.serverapp),
                          store=ctx.store, locations=ctx.locations)

    manager = ctx.feature("hpc", make)
    manager.ensure_poller()
    return manager


class _JobsHandler(CloudTikHandler):
    @property
    def jobs(self):
        return _manager(self.ctx)

    def body_limit(self) -> int:
        limit = super().body_limit()
        if self.request.method == "POST" and self.__class__ is JobsHandler:
            # notebook and inputs sent as content (base64: 4 bytes for 3)
            return limit + self.settings["cloudtik"].server.max_upload_bytes * 4 // 3
        return limit


def sent_files(body: dict[str, Any], limit: int) -> dict[str, bytes] | None:
    """``files`` of a job submission: name → base64 content, decoded and bounded."""
    files = body.get("files")
    if not files:
        return None
    out: dict[str, bytes] = {}
    total = 0
    for name, text in files.items():
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"files.{name}: not base64", field="files") from None
        total += len(data)
        if total > limit:
            raise ConfigError(f"files: more than {limit} bytes sent "
                              "(c.CloudTikServer.max_upload_bytes)", field="files")
        out[name] = data
    return out


def _job(info) -> dict[str, Any]:
    return info.to_dict()


class BackendsHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The configured backends (no secrets), and which is the default."""
        backends = await asyncio.to_thread(self.jobs.backends)
        self.write_json({"backends": backends,
                         "default_backend": self.jobs.hpc.default_backend})


def _kernels(ctx):
    """The HPC kernels' face the caller may use (a user's view in the hub sidekick)."""
    def make(ctx):
        # deferred: start-up (hpc.kernels ~51 ms, loads jupyter_client)
        from .kernels.face import KernelsFace

        return KernelsFace(ctx.serverapp)

    return ctx.feature("hpc-kernels", make)


class KernelsHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """This server's interactive kernels on HPC backends (hpc/kernels/) and their jobs:
        queued with Slurm's pending reason, running (node, wall time end), dead (why); and
        a killed server's kernels whose jobs this one ended.  No backend call (memory and
        the state store): JupyterLab shows such a kernel as "starting" while its job waits,
        and this is where the reason is."""
        kernels = await asyncio.to_thread(_kernels(self.ctx).status)
        self.write_json({"kernels": [{"id": k, **kernels[k]} for k in sorted(kernels)]})


class KernelSizesHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """A custom size of a kernel profile, checked as a kernel's start checks it (the
        admin's bounds, then the partition's limits): the kernel spec to start, which the
        server's kernel picker lists from then on.  Nothing is submitted."""
        body = self.json_body("HpcKernelSize")
        size = {k: body[k] for k in ("cores", "time", "memory", "gpus")
                if body.get(k) is not None}
        face = _kernels(self.ctx)
        self.write_json(await asyncio.to_thread(face.size, body.get("backend"),
                                                body["profile"], size,
                                                bool(body.get("hub"))))


class JobsHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Recorded jobs, newest first (reads the store only: cheap enough to poll)."""
        # sweep_elements=false: the panel shows each sweep as one row, not its jobs
        jobs = self.jobs.list(active_only=self.bool_arg("active"),
                              backend=self.str_arg("backend"),
                              limit=self.int_arg("limit", 100, 1, 1000),
                              sweep_elements=self.bool_arg("sweep_elements", True))
        self.write_json({"jobs": [_job(j) for j in jobs]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Check and record a job: 202 with it and its operation; submitting goes on."""
        body = self.json_body("JobSubmit")
        files = sent_files(body, self.settings["cloudtik"].server.max_upload_bytes)
        spec = _spec_of(body)
        info = await self.jobs.submit(spec, body.get("backend"), wait_submitted=False,
                                      files=files)
        self.set_header("Location", self.api_path("jobs", info.id))
        op = self.jobs.ops.get(info.op_id)
        self.write_json({"job": _job(info), "operation": op.to_dict()}, status=202)


def _spec_of(body: dict[str, Any]):
    from .commands import build_spec  # deferred: start-up (hpc.commands ~8 ms)

    return build_spec(
        body.get("notebook"), body.get("command"),
        name=body.get("name"), parameters=body.get("parameters"),
        nodes=body.get("nodes"), cpus=body.get("cpus"),
        tasks_per_node=body.get("tasks_per_node"), memory=body.get("memory"),
        time=body.get("time"), queue=body.get("queue"), account=body.get("account"),
        reservation=body.get("reservation"),
        inputs=body.get("inputs"), outputs=body.get("outputs"), output=body.get("output"),
        container=body.get("container"), python=body.get("python"),
        packages=body.get("packages"),
        # a requirements or lock file's contents (never a path: the server reads none)
        requirements_text=body.get("requirements"),
        kernel=body.get("kernel"), env=body.get("env"),
        allow_unknown_parameters=body.get("allow_unknown_parameters", False))


class _SweepsHandler(_JobsHandler):
    @property
    def sweeps(self):
        # deferred: start-up (hpc.jobs ~38 ms, loads psutil, cryptography; hpc.sweeps ~21 ms, loads
        #   psutil, sqlite3)
        from .jobs import JobManager
        from .sweeps import sweeps_of

        jobs = self.jobs
        if isinstance(jobs, JobManager):
            return sweeps_of(jobs)
        return jobs.sweeps()  # the hub sidekick's view: one user's sweeps, their grants

    def body_limit(self) -> int:
        limit = CloudTikHandler.body_limit(self)
        if self.request.method == "POST" and self.__class__ is SweepsHandler:
            return limit + self.settings["cloudtik"].server.max_upload_bytes * 4 // 3
        return limit


class SweepsHandler(_SweepsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Recorded sweeps, newest first, with their counts and elements."""
        sweeps = self.sweeps.list(limit=self.int_arg("limit", 100, 1, 1000))
        self.write_json({"sweeps": [i.to_dict() for i in sweeps]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Check every element, record them, submit them (one array, or the first
        ``max_concurrent`` jobs): 201 with the sweep."""
        body = self.json_body("SweepSubmit")
        files = sent_files(body, self.settings["cloudtik"].server.max_upload_bytes)
        info = await self.sweeps.submit(
            _spec_of(body), body.get("backend"), grid=body.get("grid"), zip=body.get("zip"),
            elements=body.get("elements"), max_concurrent=body.get("max_concurrent"),
            files=files)
        self.set_header("Location", self.api_path("jobs", "sweeps", info.id))
        self.write_json({"sweep": info.to_dict()}, status=201)


class SweepHandler(_SweepsHandler):
    @web.authenticated
    @authorized
    async def get(self, sweep_id: str) -> None:
        self.write_json(self.sweeps.get(sweep_id).to_dict())

    @web.authenticated
    @authorized
    async def delete(self, sweep_id: str) -> None:
        """Cancel the whole sweep."""
        self.write_json((await self.sweeps.cancel(sweep_id)).to_dict())


class SweepCancelHandler(_SweepsHandler):
    @web.authenticated
    @authorized
    async def post(self, sweep_id: str) -> None:
        """Cancel the sweep, or with ``{"element": I}`` one element."""
        body = self.json_body("SweepCancel", required=False)
        info = await self.sweeps.cancel(sweep_id, body.get("element"))
        self.write_json(info.to_dict())


class SweepRetryHandler(_SweepsHandler):
    @web.authenticated
    @authorized
    async def post(self, sweep_id: str) -> None:
        """Resubmit only the failed elements."""
        self.write_json((await self.sweeps.retry(sweep_id)).to_dict())


class SweepResultsHandler(_SweepsHandler):
    @web.authenticated
    @authorized
    async def get(self, sweep_id: str) -> None:
        """One row per element: parameters, state, recorded values, outputs."""
        info = self.sweeps.get(sweep_id)
        rows = await self.sweeps.results(info.id)
        self.write_json({"sweep": info.id, "rows": rows})


class JobHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """One job; ``?refresh=true`` asks its backend first."""
        if self.bool_arg("refresh"):
            info = await self.jobs.refresh(job_id)
        else:
            info = self.jobs.get(job_id)
        self.write_json(_job(info))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Cancel the job (it ends as ``cancelled`` once its backend confirms)."""
        self.write_json(_job(await self.jobs.cancel(job_id)))


class JobCancelHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        self.write_json(_job(await self.jobs.cancel(job_id)))


class JobLogsHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The job's log from byte ``offset``: call again with the returned offset."""
        offset = self.int_arg("offset", 0, 0, 2**62)
        limit = self.int_arg("limit", 1 << 20, 1, 16 << 20)
        job = self.jobs.get(job_id)
        chunk = await self.jobs.logs(job.id, offset, limit)
        self.write_json({"job": job.id, "text": chunk.text, "offset": chunk.offset,
                         "eof": chunk.eof, "done": self.jobs.get(job.id).done})


class JobOutputsHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        files = await self.jobs.outputs(job.id)
        self.write_json({"job": job.id, "output_notebook": job.output_notebook,
                         "outputs": [{"name": f.name, "size": f.size} for f in files]})


class JobFetchHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        """Copy the executed notebook and results into a folder under the root folder
        (default ``hpc-jobs/<job id>``), where the file browser shows them."""
        body = self.json_body("JobFetch", required=False)
        job = self.jobs.get(job_id)
        dest = self.jobs.fetch_dest(job.id, body.get("dest"))
        paths = await self.jobs.fetch(job.id, dest, body.get("files") or None)
        shown = self.jobs.locations.relative
        nb = dest / job.output_notebook if job.output_notebook else None
        self.write_json({"job": job.id, "dest": shown(dest),
                         "files": [shown(p) for p in paths],
                         "output_notebook": shown(nb) if nb and nb.exists() else None})


class JobFileHandler(_JobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str, name: str) -> None:
        """One file of the job's folder, as it is (kernels fetch results with this)."""
        job = self.jobs.get(job_id)
        data = await self.jobs.read_file(job.id, name, MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(f"name: {name!r} is larger than {MAX_FILE_BYTES} bytes; fetch "
                              "it into the root folder instead (POST .../fetch)", field="name")
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)


class _KernelNodeHandler(web.RequestHandler):
    """What an HPC kernel's node asks of this server (``%storage`` there): authenticated
    by that kernel's own token only (``kernels/node_access.py``), never by a cookie or a
    token of the server's, so no XSRF check applies: a page cannot send the header."""

    MAX_BODY = 64 * 1024

    def check_xsrf_cookie(self) -> None:  # no cookie is ever read here
        pass

    def _access(self, kid: str) -> tuple[Any, Any]:
        # deferred: start-up (hpc.kernels.node_access loads the storage stager)
        from .kernels import node_access

        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        access = node_access.check(kid, token.strip() if scheme.lower() in ("token", "bearer")
                                   else None)
        if access is None:  # another kernel's, an ended one's, none: the same answer
            raise web.HTTPError(403, "not authenticated: this route takes the token of the "
                                     "HPC kernel it names (cloudtik-api.json on its node)")
        return access, node_access

    def _body(self) -> dict[str, Any]:
        if len(self.request.body or b"") > self.MAX_BODY:
            raise ConfigError("body: too large", field="body")
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise ConfigError("body: not JSON", field="body") from None
        if not isinstance(body, dict):
            raise ConfigError("body: expected a JSON object", field="body")
        return body

    def _json(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, CloudTikError):
            status_code, body = exc.http_status, exc.to_dict()
        elif isinstance(exc, web.HTTPError):
            body = {"message": exc.log_message or "error", "field": None,
                    "reason": {403: "forbidden", 404: "not_found",
                               405: "method_not_allowed"}.get(status_code, "error")}
        else:
            status_code, body = 500, {"message": "internal error; the server log has the "
                                                 "details", "field": None, "reason": "error"}
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class KernelNodeLsHandler(_KernelNodeHandler):
    async def get(self, kid: str) -> None:
        access, node_access = self._access(kid)
        self._json(await node_access.ls(access, self.get_argument("path", "")))


class KernelNodeGetHandler(_KernelNodeHandler):
    async def post(self, kid: str) -> None:
        access, node_access = self._access(kid)
        body = self._body()
        self._json(await node_access.get(access, body.get("src"), body.get("dest")))


class KernelNodePutHandler(_KernelNodeHandler):
    async def post(self, kid: str) -> None:
        access, node_access = self._access(kid)
        body = self._body()
        self._json(await node_access.put(access, body.get("src"), body.get("dst")))


ROUTES: list[tuple[str, Any]] = [
    (r"/hpc/backends", BackendsHandler),
    (r"/hpc/kernels", KernelsHandler),
    (r"/hpc/kernel-sizes", KernelSizesHandler),
    (rf"/hpc/kernels/{KERNEL_ID}/node/ls", KernelNodeLsHandler),
    (rf"/hpc/kernels/{KERNEL_ID}/node/get", KernelNodeGetHandler),
    (rf"/hpc/kernels/{KERNEL_ID}/node/put", KernelNodePutHandler),
    (r"/jobs", JobsHandler),
    # before /jobs/{job_id}: "sweeps" is no job id
    (r"/jobs/sweeps", SweepsHandler),
    (rf"/jobs/sweeps/{SWEEP_ID}", SweepHandler),
    (rf"/jobs/sweeps/{SWEEP_ID}/cancel", SweepCancelHandler),
    (rf"/jobs/sweeps/{SWEEP_ID}/retry", SweepRetryHandler),
    (rf"/jobs/sweeps/{SWEEP_ID}/results", SweepResultsHandler),
    (rf"/jobs/{JOB_ID}", JobHandler),
    (rf"/jobs/{JOB_ID}/cancel", JobCancelHandler),
    (rf"/jobs/{JOB_ID}/logs", JobLogsHandler),
    (rf"/jobs/{JOB_ID}/outputs", JobOutputsHandler),
    (rf"/jobs/{JOB_ID}/fetch", JobFetchHandler),
    (rf"/jobs/{JOB_ID}/files/{FILE_NAME}", JobFileHandler),
]
