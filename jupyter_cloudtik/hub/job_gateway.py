"""The job gateway: an example side-kick that turns plain HTTP requests into HPC jobs.

This is the RFC's ARC example: the client software and credentials for a compute backend
live with the side-kick (configured by the admin, secrets from the secret store), and the
user's session only needs ``curl`` or ``requests``::

    POST   {prefix}/jobs            {"command": ["python", "x.py"]} | {"script": "..."}
                                    | {"notebook": "analysis.ipynb", "parameters": {...}}
                                    optional: backend, name, env, time, memory, cpus, nodes,
                                    tasks_per_node, queue, account, reservation, inputs,
                                    outputs, output, container, python, kernel,
                                    allow_unknown_parameters
                                    -> 201 {"id", "state", "backend", "warnings", "url"}
    GET    {prefix}/jobs            recent jobs
    GET    {prefix}/jobs/{id}       the job (``?refresh=1`` asks the backend first)
    GET    {prefix}/jobs/{id}/logs  {"text", "offset", "eof", "done"} (``?offset=N``)
    DELETE {prefix}/jobs/{id}       cancel
    GET    {prefix}/backends        the configured backends
    GET    {prefix}/health          200 while it can serve

Run by the supervisor as ``python -m jupyter_cloudtik.hub.job_gateway``; it reads ``PORT``,
``CLOUDTIK_SIDEKICK_PREFIX``, ``CLOUDTIK_SIDEKICK_USER`` (recorded as the jobs' user),
``CLOUDTIK_SIDEKICK_TOKEN`` (required on every request when set), ``CLOUDTIK_STATE_DIR``
(its jobs' records), ``CLOUDTIK_JOB_GATEWAY_BACKEND`` (default backend: the HPC settings'
default) and ``CLOUDTIK_JOB_GATEWAY_ROOT`` (folder relative notebook/input paths start
from).  Backends are configured as for every HPC face (``c.HPC.backends`` or
``CLOUDTIK_HPC_CONFIG``).

On a hub (run by the supervisor: ``CLOUDTIK_SIDEKICK_TOKEN`` is set) the ``local`` and
``dask`` backends run a user's job on the hub's own machine, so they are offered only when
the supervisor says the hub allows it (``CLOUDTIK_ALLOW_LOCAL_EXECUTION=1``, from
``c.CloudTikHub.allow_local_execution``) — and then inside the side-kick's sandbox.  Run
by hand, on your own machine, they are always there.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tornado import web

from ..core import env as envnames
from ..core import jsontext
from ..core.errors import CloudTikError, ConfigError, PermissionDeniedError
from ..core.identity import os_user

log = logging.getLogger("jupyter_cloudtik.hub.job_gateway")

TOKEN_HEADER = "X-CloudTik-Sidekick-Token"
BACKEND_ENV = envnames.JOB_GATEWAY_BACKEND
ROOT_ENV = envnames.JOB_GATEWAY_ROOT
#: backend types that run the job on the machine the gateway runs on
LOCAL_TYPES = ("local", "dask")

_STR_FIELDS = ("backend", "name", "queue", "account", "reservation", "output", "container",
               "python", "kernel")
_INT_FIELDS = ("nodes", "cpus", "tasks_per_node")
_SIZE_FIELDS = ("memory", "time")
_LIST_FIELDS = ("inputs", "outputs")
ALLOWED_FIELDS = ("command", "script", "notebook", "parameters", "allow_unknown_parameters",
                  "env", *_STR_FIELDS, *_INT_FIELDS, *_SIZE_FIELDS, *_LIST_FIELDS)


def parse_submission(body: Any, default_backend: str, root: Path) -> tuple[Any, str]:
    """A ``JobSpec`` and backend name from a request body; ConfigError names the field."""
    from ..hpc.commands import build_spec  # deferred: start-up (hpc.commands ~11 ms)

    if not isinstance(body, dict):
        raise ConfigError("body: expected a JSON object", field="body")
    unknown = sorted(set(body) - set(ALLOWED_FIELDS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field; allowed: {', '.join(ALLOWED_FIELDS)}",
                          field=unknown[0])
    given = [k for k in ("command", "script", "notebook") if body.get(k) not in (None, "")]
    if len(given) != 1:
        raise ConfigError("command: give exactly one of 'command' (a list of arguments), "
                          f"'script' (bash) or 'notebook' (a path); got {given or 'none'}",
                          field="command")
    command = body.get("command")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(a, str) and a for a in command)):
        raise ConfigError(f"command: {command!r} is not allowed; expected a non-empty list "
                          "of strings, e.g. [\"python\", \"run.py\"]", field="command")
    script = body.get("script")
    if script is not None:
        if not isinstance(script, str) or not script.strip():
            raise ConfigError("script: expected the text of a bash script", field="script")
        command = ["bash", "-c", script]
    notebook = body.get("notebook")
    if notebook is not None and not isinstance(notebook, str):
        raise ConfigError(f"notebook: {notebook!r} is not allowed; expected a path",
                          field="notebook")
    for key in _STR_FIELDS:
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ConfigError(f"{key}: {body[key]!r} is not allowed; expected text", field=key)
    for key in _INT_FIELDS:
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{key}: {v!r} is not allowed; expected a whole number >= 1",
                              field=key)
    for key in _SIZE_FIELDS:
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
            raise ConfigError(f"{key}: {v!r} is not allowed; expected e.g. "
                              + ("'4GiB'" if key == "memory" else "'30m' or minutes"),
                              field=key)
    for key in _LIST_FIELDS:
        v = body.get(key)
        if v is not None and (not isinstance(v, list)
                              or not all(isinstance(x, str) and x for x in v)):
            raise ConfigError(f"{key}: {v!r} is not allowed; expected a list of strings",
                              field=key)
    params = body.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ConfigError("parameters: expected a JSON object name: value",
                          field="parameters")
    allow = body.get("allow_unknown_parameters", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"allow_unknown_parameters: {allow!r} is not allowed; expected "
                          "true or false", field="allow_unknown_parameters")
    env = body.get("env")
    if env is not None and (not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ConfigError("env: expected a JSON object of strings NAME: value", field="env")

    def local(path: str) -> str:
        from ..hpc.staging import is_local  # deferred: start-up (hpc.staging ~5 ms)

        if not is_local(path):
            return path
        p = Path(os.path.expanduser(path))
        return str(p if p.is_absolute() else root / p)

    spec = build_spec(
        local(notebook) if notebook else None, command, name=body.get("name"),
        parameters=params, nodes=body.get("nodes"), cpus=body.get("cpus"),
        tasks_per_node=body.get("tasks_per_node"), memory=body.get("memory"),
        time=body.get("time"), queue=body.get("queue"), account=body.get("account"),
        reservation=body.get("reservation"),
        inputs=[local(i) for i in body.get("inputs") or []], outputs=body.get("outputs"),
        output=local(body["output"]) if body.get("output") else None,
        container=body.get("container"), python=body.get("python"),
        kernel=body.get("kernel"), env=env, allow_unknown_parameters=allow)
    return spec, body.get("backend") or default_backend


class _Handler(web.RequestHandler):
    def initialize(self, gateway: JobGateway) -> None:
        self.gw = gateway

    def prepare(self) -> None:
        token = self.gw.token
        if token and not hmac.compare_digest(
                self.request.headers.get(TOKEN_HEADER, "").encode(), token.encode()):
            raise web.HTTPError(403, reason="missing or wrong side-kick token")

    def check_xsrf_cookie(self) -> None:  # token header auth, no cookies
        pass

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, CloudTikError):
            body = exc.to_dict()
        elif isinstance(exc, web.HTTPError):
            body = {"message": exc.reason or exc.log_message or "error",
                    "reason": "http", "field": None}
        else:
            body = {"message": "internal error (see the side-kick's log)", "reason": "error",
                    "field": None}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, CloudTikError):
            if e.http_status >= 500:
                log.warning("%s %s: %s", self.request.method, self.request.path, e.message)
            self.send_error(e.http_status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)


class HealthHandler(_Handler):
    def get(self) -> None:
        self.write_json({"ok": True, "user": self.gw.user})


class BackendsHandler(_Handler):
    async def get(self) -> None:
        backends = await asyncio.to_thread(self.gw.manager.backends)
        for b in backends:
            refusal = self.gw.local_refusal(b.get("name"))
            if refusal:
                b.update(available=False, reason=refusal)
        self.write_json({"backends": backends, "default": self.gw.default_backend})


class JobsHandler(_Handler):
    def get(self) -> None:
        jobs = self.gw.manager.list(limit=100)
        self.write_json({"jobs": [j.to_dict() for j in jobs]})

    async def post(self) -> None:
        body = jsontext.loads(self.request.body or b"null", "body")
        spec, backend = parse_submission(body, self.gw.default_backend, self.gw.root)
        self.gw.check_backend(backend)
        info = await self.gw.manager.submit(spec, backend)
        url = f"{self.gw.prefix}/jobs/{info.id}"
        self.set_header("Location", url)
        self.write_json({"id": info.id, "state": info.state, "backend": info.backend,
                         "reason": info.reason, "warnings": info.warnings, "url": url},
                        status=201)


class JobHandler(_Handler):
    async def get(self, job_id: str) -> None:
        if self.get_argument("refresh", "") in ("1", "true", "yes"):
            info = await self.gw.manager.refresh(job_id)
        else:
            info = self.gw.manager.get(job_id)
        self.write_json(info.to_dict())

    async def delete(self, job_id: str) -> None:
        info = await self.gw.manager.cancel(job_id)
        self.write_json({"id": info.id, "state": info.state, "reason": info.reason})


class JobLogsHandler(_Handler):
    async def get(self, job_id: str) -> None:
        try:
            offset = int(self.get_argument("offset", "0"))
        except ValueError:
            raise ConfigError("offset: expected a whole number of bytes",
                              field="offset") from None
        if offset < 0:
            raise ConfigError("offset: must be >= 0", field="offset")
        job = self.gw.manager.get(job_id)
        chunk = await self.gw.manager.logs(job.id, offset)
        self.write_json({"id": job.id, "text": chunk.text, "offset": chunk.offset,
                         "eof": chunk.eof, "done": self.gw.manager.get(job.id).done})


class JobGateway:
    """The gateway's state: its job manager (the HPC core) and where it is served."""

    def __init__(self, *, state_dir: Path, user: str, prefix: str = "", token: str = "",
                 default_backend: str | None = None, root: Path | None = None,
                 allow_local: bool = True) -> None:
        """``allow_local``: whether the ``local``/``dask`` backends may run jobs here
        (False on a hub that does not allow local execution)."""
        # deferred: start-up (core.settings ~22 ms, loads jupyter_core, traitlets; hpc.jobs ~82 ms,
        #   loads cryptography, psutil; hpc.settings ~28 ms, loads importlib.metadata, traitlets)
        from ..core.settings import CloudTik, load_user_config
        from ..hpc.jobs import JobManager
        from ..hpc.settings import hpc_settings

        self.user = user
        self.prefix = prefix.rstrip("/")
        self.token = token
        self.root = (root or Path.cwd()).resolve()
        self.allow_local = allow_local
        settings = CloudTik(config=load_user_config(), state_dir=str(state_dir))
        self.manager = JobManager(settings=settings, hpc=hpc_settings(), user=user)
        self.default_backend = default_backend or self.manager.hpc.default_backend

    def local_refusal(self, backend: str | None) -> str | None:
        """Why ``backend`` may not be used here (it runs jobs on this machine and the hub
        does not allow that), or None."""
        if self.allow_local:
            return None
        name = backend or self.default_backend
        try:
            btype = self.manager.hpc.backend_configs().get(name, {}).get("type")
        except CloudTikError as e:  # never "not local" for a config that cannot be read
            return (f"backend: cannot tell whether '{name}' runs jobs on the hub's own "
                    f"machine, which this hub does not allow "
                    f"(c.CloudTikHub.allow_local_execution): the backends' configuration "
                    f"cannot be read ({e.message})")
        if btype not in LOCAL_TYPES and not name.startswith("dask:"):
            return None
        remote = sorted(n for n, c in self.manager.hpc.backend_configs().items()
                        if c.get("type") not in LOCAL_TYPES)
        return (f"backend: '{name}' runs jobs on the hub's own machine, which this hub "
                "does not allow (c.CloudTikHub.allow_local_execution); use "
                + (f"one of: {', '.join(remote)}" if remote else
                   "a remote backend, once an admin configures one for this side-kick "
                   f"({BACKEND_ENV}, CLOUDTIK_HPC_CONFIG)"))

    def check_backend(self, backend: str | None) -> None:
        refusal = self.local_refusal(backend)
        if refusal:
            raise PermissionDeniedError(refusal, field="backend",
                                        value=backend or self.default_backend)

    def app(self) -> web.Application:
        p = _re_escape(self.prefix)
        kw = {"gateway": self}
        return web.Application([
            (rf"{p}/health/?", HealthHandler, kw),
            (rf"{p}/backends/?", BackendsHandler, kw),
            (rf"{p}/jobs/?", JobsHandler, kw),
            (rf"{p}/jobs/([^/]+)/?", JobHandler, kw),
            (rf"{p}/jobs/([^/]+)/logs/?", JobLogsHandler, kw),
        ], log_function=_access_log)

    async def close(self) -> None:
        await self.manager.close()
        self.manager.store.close()


def _re_escape(prefix: str) -> str:
    import re

    return re.escape(prefix)


def _access_log(handler: web.RequestHandler) -> None:
    r = handler.request
    log.info("%s %s %s %.0fms", handler.get_status(), r.method, r.path,
             1000 * r.request_time())


def _not_dumpable() -> None:
    """Jobs this gateway starts run as its own account (in its sandbox): make its memory
    and ``/proc/PID/environ`` (which hold the side-kick's secrets) unreadable to them, as
    ssh-agent does (``prctl(PR_SET_DUMPABLE, 0)``)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        log.warning("job gateway: could not make itself undumpable (not Linux?)")


async def serve() -> None:
    port = os.environ.get("PORT") or os.environ.get(envnames.SIDEKICK_PORT)
    if not port or not port.isdigit():
        raise SystemExit("job gateway: PORT must be set to the port to listen on")
    state_dir = os.environ.get(envnames.STATE_DIR)
    if not state_dir:
        raise SystemExit("job gateway: CLOUDTIK_STATE_DIR must be set")
    root = os.environ.get(ROOT_ENV)
    token = os.environ.get(envnames.SIDEKICK_TOKEN, "")
    if token:  # run by a hub's supervisor: keep what it was given from its jobs
        _not_dumpable()
    # run by a hub's supervisor (it sets the token): local backends only if the hub says
    allow_local = not token or os.environ.get(envnames.ALLOW_LOCAL_EXECUTION) == "1"
    gw = JobGateway(state_dir=Path(state_dir),
                    user=os.environ.get(envnames.SIDEKICK_USER) or os_user(),
                    prefix=os.environ.get(envnames.SIDEKICK_PREFIX, ""), token=token,
                    default_backend=os.environ.get(BACKEND_ENV) or None,
                    root=Path(root) if root else None, allow_local=allow_local)
    server = gw.app().listen(int(port), address="127.0.0.1")
    gw.manager.ensure_poller()
    log.info("job gateway for %s on 127.0.0.1:%s under %s/ (default backend %s)",
             gw.user, port, gw.prefix, gw.default_backend)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("job gateway: stopping")
    server.stop()
    await gw.close()



def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve())


if __name__ == "__main__":
    main()
