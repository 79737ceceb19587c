"""The kernel provisioner of interactive kernels on HPC backends (``cloudtik-hpc``).

jupyter_client asks a provisioner to launch a kernel, poll it, signal it, and end it.
``HPCKernelProvisioner`` does each with the kernel's batch job (``job.KernelJob``):

* ``pre_launch`` checks the profile (it exists, its backend can run interactive work, its
  sizes fit the partition) — refusals are one line naming the field;
* ``launch_kernel`` submits the job, logs its queue state while it waits (and keeps it in
  ``status``, which ``kernel_status()`` lists for the panel and the REST API), and, once
  the job runs and the kernel has bound its ports on the node's loopback, opens the SSH
  tunnels and answers the local ends as the kernel's connection info;
* a watcher task looks at the job every ``HPCKernels.poll_interval`` seconds: ``poll``
  answers from what it saw (it is called often), a job that ended (wall time, preemption,
  ``scancel``) makes the kernel dead with the reason in ``status`` and the log, and the
  server log warns ``warn_before`` seconds before the wall time (the kernel itself prints
  the same warning into the notebook);
* interrupt goes to the kernel as a message through the tunnel (the kernel spec's
  ``interrupt_mode``), or as ``scancel --batch --signal=INT``; shutdown asks the kernel
  through the tunnel, then ``scancel``; a restart is a new job (the old one is ended).

Jupyter's automatic restart of a dead kernel is limited to reporting it: resubmitting a
job whose wall time ran out would queue again behind the user's back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from typing import Any

from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Any as AnyTrait
from traitlets import Bool, Unicode

from ...core.errors import CloudTikError, ConfigError
from ...core.settings import CloudTik, load_user_config
from ...core.store import Store
from ..base import CANCELLED, RUNNING, SUCCEEDED
from ..settings import HPC, BackendRegistry
from . import node_access
from .job import KernelJob
from .profiles import (
    HPCKernels,
    Profile,
    check_interactive,
    find_profile,
    parse_profiles,
    parse_size,
)
from .records import KernelRecords, end_orphans
from .through_hub import HubKernelJob, hub_profile, hub_url

PROVISIONER_NAME = "cloudtik-hpc"
PORTS_EVERY = 0.1  # s between two reads of a running kernel's connection file
log = logging.getLogger("jupyter_cloudtik.hpc.kernels")

_registries: dict[str, Any] = {}
_registries_lock = threading.Lock()
_status: dict[str, dict[str, Any]] = {}  # kernel id -> status (kernel_status())


def _serverapp(provisioner: Any) -> Any:
    """The Jupyter server that owns the kernel (its manager's parents), or None."""
    node = getattr(provisioner, "parent", None)
    for _ in range(4):
        if node is None:
            return None
        if getattr(node, "web_app", None) is not None and hasattr(node, "port"):
            return node
        node = getattr(node, "parent", None)
    return None


def kernel_status(parent: Any = None) -> dict[str, dict[str, Any]]:
    """What every HPC kernel of this process is doing (queued, running, dead, why); with
    ``parent`` (the server's config), also the kernels of a server that was killed whose
    jobs were ended for them (``records``), marked ``orphaned``."""
    mine = {k: dict(v) for k, v in _status.items()}
    if parent is None:
        return mine
    try:
        hpc, _kernels, settings = settings_of(parent)
        configured = bool(hpc.backend_configs())
    except CloudTikError:  # the HPC settings themselves: the spec listing says why
        return mine
    if not configured:
        return mine
    end_orphans_soon(parent)
    keep = HPCKernels(config=parent.config).reconnect_within \
        if getattr(parent, "config", None) is not None else 0.0
    gone = {r["id"]: r for r in kernel_records(settings).reported(keep)
            if r["id"] not in mine}
    return {**gone, **mine}


def ended_because(st: Any) -> str:
    """Why a kernel's job ended, for people: Slurm's pending reason ("Priority") is stale
    once the job is cancelled, so a cancel says so itself."""
    if st.state == CANCELLED:
        return "cancelled (scancel)"
    if st.state == SUCCEEDED:
        return "the kernel exited"
    return st.message or (st.native_state or st.state).lower()


def said_to_server(error: Exception, status: int) -> Exception:
    """``error`` as it is (same class, same ``str``), and also a tornado ``HTTPError``.

    Why: jupyter_server answers a kernel that cannot start with "Unhandled error" (and logs
    a traceback) unless the error is an ``HTTPError``, whose message it passes on to
    JupyterLab's dialog.  Callers outside a server still catch ``ConfigError`` or
    ``RuntimeError``."""
    from tornado.web import HTTPError

    text = str(error)
    cls = type(type(error).__name__, (type(error), HTTPError), {"__str__": lambda self: text})
    said = cls.__new__(cls)
    said.__dict__.update(error.__dict__)
    # no args: tornado would format the message with them ("%" in it is shown doubled)
    HTTPError.__init__(said, status, text)
    return said


def settings_of(parent: Any) -> tuple[Any, HPCKernels, Any]:
    """The HPC settings, kernel settings and CloudTik settings a kernel's manager sees:
    the server's config (its parent chain), over the user's config file."""
    config = load_user_config()
    if parent is not None and getattr(parent, "config", None) is not None:
        config.merge(parent.config)
    return HPC(config=config), HPCKernels(config=config), CloudTik(config=config)


def backend_registry(hpc: Any, settings: Any) -> Any:
    """One registry (and so one kept SSH connection per backend) per configuration."""
    # deferred: start-up (core.secrets ~11 ms, loads cryptography, sqlite3)
    from ...core.secrets import SecretStore

    key = json.dumps([settings.state_dir, hpc.backend_configs()], sort_keys=True, default=str)
    with _registries_lock:
        reg = _registries.get(key)
        if reg is None:
            store = Store(settings.state_dir)
            reg = BackendRegistry(hpc, store.state_dir, SecretStore(store), log, settings)
            _registries[key] = reg
        return reg


_records_by_folder: dict[str, KernelRecords] = {}
# state folder -> when its orphans may be looked for again (never, once all were ended)
_orphans_next: dict[str, float] = {}
ORPHANS_RETRY = 60.0  # s before a job that could not be ended is tried again


def kernel_records(settings: Any) -> KernelRecords:
    """The kernels' records of a state folder (one store per folder and process)."""
    with _registries_lock:
        rec = _records_by_folder.get(settings.state_dir)
        if rec is None:
            rec = KernelRecords(Store(settings.state_dir))
            _records_by_folder[settings.state_dir] = rec
        return rec


def end_orphans_soon(parent: Any, logger: logging.Logger | None = None) -> None:
    """In a thread, once per process and state folder (again after ``ORPHANS_RETRY`` s
    while a job could not be ended): end the jobs of kernels whose server was killed
    (``records.end_orphans``).  Called when a server lists kernel specs (at start-up and
    when JupyterLab loads), starts an HPC kernel, or is asked for its HPC kernels."""
    hpc, kernels, settings = settings_of(parent)
    if not hpc.backend_configs():  # no backend: no kernel's job could have been started
        return
    keep_for = max(0.0, kernels.reconnect_within)
    folder = settings.state_dir
    with _registries_lock:
        if time.monotonic() < _orphans_next.get(folder, 0.0):
            return
        _orphans_next[folder] = float("inf")  # one look at a time

    def run() -> None:
        left = True
        try:
            left = bool(end_orphans(kernel_records(settings), backend_registry(hpc, settings),
                                    logger or log, unresolved_only=True, keep_for=keep_for))
        except Exception:  # a bug: said, and looked at again later
            (logger or log).exception("jupyter_cloudtik: cannot look for the jobs of HPC "
                                      "kernels whose server is gone")
        finally:
            with _registries_lock:
                again = max(1.0, min(ORPHANS_RETRY, keep_for / 4) if keep_for
                            else ORPHANS_RETRY)
                _orphans_next[folder] = (time.monotonic() + again if left
                                         else float("inf"))
            if left:  # looked at again by itself: a kept job's time runs out unattended
                timer = threading.Timer(again + 0.1, end_orphans_soon, (parent, logger))
                timer.daemon = True
                timer.start()

    threading.Thread(target=run, name="cloudtik-hpc-kernel-orphans", daemon=True).start()


def close_registries() -> None:
    with _registries_lock:
        for reg in _registries.values():
            reg.close()
        _registries.clear()


def resolve_kernel(parent: Any, backend: str | None, profile: str, custom: Any = None
                   ) -> tuple[Profile, Any, HPCKernels, Any]:
    """What a kernel of (backend, profile[, custom size]) runs with: the profile, its
    backend, the kernel settings and the CloudTik settings; refused in one line.  The one
    decision for every start and for the launcher's size form (``size_check``)."""
    hpc, kernels, settings = settings_of(parent)
    registry = backend_registry(hpc, settings)
    name = registry.resolve(backend or None)
    be = registry.get(name)
    check_interactive(name, be.kind)
    # the size in the spec is the user's ask, checked again at every start against the
    # admin's bounds: a kernel.json written by hand gets no more than the form would
    size = parse_size(custom, "custom") if custom is not None else None
    return (find_profile(parse_profiles(kernels.profiles), name, profile, size), be, kernels,
            settings)


def size_check(parent: Any, backend: str | None, profile: str, custom: Any) -> Profile:
    """A custom size as the launcher's form asks for it, checked as a start would check it
    (the admin's bounds, then the partition's limits on the backend) before any job."""
    sized, be, kernels, _settings = resolve_kernel(parent, backend, profile, custom)
    KernelJob(be, sized, key="", warn_before=kernels.warn_before).check()
    return sized


class HPCKernelProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """A kernel that runs as a batch job on an HPC backend, reached through SSH."""

    backend = Unicode("", config=True, help="The HPC backend the kernel runs on.")
    profile = Unicode("", config=True, help="The kernel profile (HPCKernels.profiles).")
    # Any, not Dict: a malformed value is refused at the start in one line naming the field
    custom = AnyTrait(None, config=True,
                      help="A custom size of the profile ({cores, time, memory, gpus}), "
                           "within the profile's custom bounds.")
    hub = Bool(False, config=True,
               help="A profile of the hub's catalogue: its sidekick submits and reaches "
                    "the kernel (through_hub.py).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job: KernelJob | None = None
        self._profile: Profile | None = None
        self._be: Any = None
        self._kernels: HPCKernels | None = None
        self._records: KernelRecords | None = None
        self._session: str | None = None
        self._tunnels: Any = None
        self._watcher: asyncio.Task | None = None
        self._exit: int | None = None
        self._ended = False
        self._hub_url = ""
        self.status: dict[str, Any] = {}

    # checking -------------------------------------------------------------------------------
    def _resolve(self) -> None:
        """The profile and its backend, checked in one-line refusals."""
        if self.hub:
            # the hub's own profile, asked afresh: its grant is the sidekick's to decide
            # (again at the start); this server keeps no record (the sidekick's lease
            # ends the job of a server that was killed)
            _hpc, self._kernels, _settings = settings_of(self.parent)
            url = hub_url(getattr(self.parent, "config", None))
            if url is None:
                raise ConfigError(
                    "profile: this kernel's profile is the hub's, and this server has no "
                    "hub sidekick (CLOUDTIK_HUB_SERVICE_URL and JUPYTERHUB_API_TOKEN)",
                    field="profile", value=self.profile)
            self._hub_url = url
            self._profile = hub_profile(url, self.profile, self.custom)
            self._be, self._records = None, None
            return
        self._profile, self._be, self._kernels, settings = resolve_kernel(
            self.parent, self.backend, self.profile, self.custom)
        self._records = kernel_records(settings)

    def _new_job(self, key: str) -> Any:
        assert self._profile is not None and self._kernels is not None
        if self.hub:
            return HubKernelJob(self._hub_url, self._profile, key,
                                loop=asyncio.get_running_loop())
        return KernelJob(self._be, self._profile, key=key,
                         warn_before=self._kernels.warn_before)

    @property
    def _backend_name(self) -> str:
        return self._profile.backend if self._profile is not None else self.backend

    async def _record(self, method: str, *args: Any, **kwargs: Any) -> None:
        """This server's record of the kernel's job (none through the hub)."""
        if self._records is not None:
            await asyncio.to_thread(getattr(self._records, method), *args, **kwargs)

    def _set(self, **values: Any) -> None:
        self.status.update(values, time=time.time())
        _status[self.kernel_id] = self.status

    # launching ------------------------------------------------------------------------------
    @property
    def has_process(self) -> bool:
        return self.job is not None and self.job.native_id is not None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        end_orphans_soon(self.parent, self.log)
        try:
            self._resolve()
            job = self._new_job("")
            await asyncio.to_thread(job.check)  # sizes beyond the partition: refused here
        except CloudTikError as e:
            raise said_to_server(e, e.http_status) from None
        # the notebook the kernel is for (jupyter_server's sessions set it): the notebook's
        # toolbar finds its kernel's job by it while the kernel has no id the page knows
        self._session = (kwargs.get("env") or {}).get("JPY_SESSION_NAME")
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        assert self._profile is not None and self._kernels is not None
        km = self.parent
        key = km.session.key.decode() if km is not None else ""
        self._exit, self._ended = None, False
        self.job = job = self._new_job(key)
        self.status = {}
        self._set(backend=self._backend_name, profile=self._profile.name, state="submitting",
                  reason=None, job=None, session=self._session, hub=bool(self.hub))
        adopted = await self._adopt(job)
        if adopted is not None:
            native, key = adopted
        else:
            native = await self._submit(job)
        self._set(state="queued", job=native, native_state="PENDING")
        try:
            ports = await self._wait_running(job)
            local, self._tunnels = await asyncio.to_thread(job.open_channels, ports)
        except BaseException as e:
            await asyncio.to_thread(job.cancel)
            await asyncio.to_thread(job.forget_key)
            await self._record("forget", self.kernel_id)
            if isinstance(e, CloudTikError) and not hasattr(e, "status_code"):
                # the backend's (or the hub's) one line, for JupyterLab's dialog
                raise said_to_server(e, e.http_status) from None
            raise
        self._set(state="running", node=job.node)
        await self._record("update", self.kernel_id, state="running", node=job.node)
        if not self.hub:
            await self._open_node_api(job)
        self.log.info("HPC kernel %s: job %s runs on %s; kernel reached through %s",
                      self.kernel_id, native, job.node,
                      "the hub's sidekick" if self.hub else
                      "SSH" if self._tunnels is not None else "this machine")
        self._watcher = asyncio.ensure_future(self._watch())
        self.connection_info = {"transport": "tcp", "ip": "127.0.0.1",
                                "key": key.encode(), "signature_scheme": "hmac-sha256",
                                "kernel_name": km.kernel_name if km is not None else "",
                                **local}
        return self.connection_info

    async def _submit(self, job: Any) -> str:
        assert self._profile is not None
        # recorded before sbatch: a server killed while it waits for the answer leaves a
        # row the next server can look into (the job's folder), not a job nobody knows of
        await self._record("started", self.kernel_id, backend=self._backend_name,
                           profile=self._profile.name, job_id=job.job_id, native_id=None,
                           session=self._session, spec=self._profile.spec_name)
        try:
            native = await asyncio.to_thread(job.submit)
        except CloudTikError as e:
            await self._record("forget", self.kernel_id)
            raise said_to_server(e, e.http_status) from None
        except BaseException:
            await self._record("forget", self.kernel_id)
            raise
        await self._record("update", self.kernel_id, native_id=native)
        self.log.info("HPC kernel %s: job %s submitted to %s%s (%s)", self.kernel_id, native,
                      self._backend_name, " through the hub" if self.hub else "",
                      self._profile.title())
        return native

    async def _adopt(self, job: Any) -> tuple[str, str] | None:
        """Reconnect to the job of this notebook's kernel whose server was killed (same
        profile and size, kept for ``HPCKernels.reconnect_within``): its job id and the
        key its kernel signs with (read back from its connection file on the system)."""
        if self._records is None or not self._session or self._profile is None:
            return None
        row = await asyncio.to_thread(self._records.adopt, self.kernel_id,
                                      session=self._session, spec=self._profile.spec_name)
        if row is None:
            return None
        job.job_id, job.native_id = row["job_id"], row["native_id"]
        info = await asyncio.to_thread(job.connection)
        key = info.get("key") if info else None
        st = await asyncio.to_thread(job.status)
        if not isinstance(key, str) or st.final:
            # its key is gone, or so is the job: end what is left, start afresh
            await asyncio.to_thread(job.cancel)
            await asyncio.to_thread(job.forget_key)
            await self._record("forget", self.kernel_id)
            self.log.warning("HPC kernel %s: job %s of a server that stopped cannot be "
                             "reconnected to (%s); a new job is submitted", self.kernel_id,
                             row["native_id"], "it ended" if st.final else "its key is gone")
            job.job_id, job.native_id = KernelJob.new_id(), None
            return None
        job.key = key
        self._set(reconnected=True)
        self.log.info("HPC kernel %s: reconnected to job %s on %s, the kernel %s of a server "
                      "(pid %s on %s) that stopped without shutting it down", self.kernel_id,
                      row["native_id"], row["backend"], row["id"], row["owner_pid"],
                      row["owner_host"])
        return row["native_id"], key

    async def _wait_running(self, job: KernelJob) -> dict[str, int]:
        """Wait for the job to run and the kernel to bind its ports; log the queue.

        Once the job runs, the node is asked for while the kernel starts, and the
        connection file (one small read) is looked at every ``PORTS_EVERY`` seconds
        between two looks at the queue.  Why: the kernel binds its ports a second or so
        after the job starts; a whole ``squeue`` round (and the sleep after it) per look
        made the start wait up to a poll interval longer than the kernel did."""
        assert self._kernels is not None
        deadline = time.monotonic() + self._kernels.start_timeout
        last = None
        while True:
            st = await asyncio.to_thread(job.status)
            seen = (st.state, st.native_state, st.message)
            if seen != last:
                self.log.info("HPC kernel %s: job %s %s%s", self.kernel_id, job.native_id,
                         st.native_state or st.state, f" ({st.message})" if st.message else "")
                last = seen
            self._set(native_state=st.native_state, reason=st.message)
            if st.final:
                why = ended_because(st)
                self._set(state="dead", reason=why)
                raise said_to_server(RuntimeError(
                    f"the kernel's job {job.native_id} on {self._backend_name} ended before "
                    f"the kernel started: {why}"), 500)
            if st.state == RUNNING:
                if not self.status.get("started"):
                    self._set(started=time.time(),
                              deadline=time.time() + (self._profile.time if self._profile
                                                      else 0))
                if job.address is None:
                    await asyncio.to_thread(job.node_address)
                ports = await self._ports_soon(job, min(self._kernels.poll_interval, 1.0))
                if ports:
                    return ports
            if time.monotonic() > deadline:
                raise said_to_server(RuntimeError(
                    f"the kernel's job {job.native_id} did not start within "
                    f"{self._kernels.start_timeout:.0f} s (HPCKernels.start_timeout); it was "
                    "cancelled"), 504)
            if st.state != RUNNING:  # running: _ports_soon has waited
                await asyncio.sleep(self._kernels.poll_interval)

    async def _open_node_api(self, job: KernelJob) -> None:
        """The session's storages for ``%storage`` on the node: a token of this kernel's,
        and the server's port forwarded to the node's loopback through the kernel's SSH
        connection (the node is this machine: the port itself).  Not fatal: the kernel
        runs without, and says why when ``%storage`` is used; the log and the status say
        why too."""
        app = _serverapp(self)
        if app is None:
            return  # a kernel manager without a server (a script): no API to reach
        why = None
        if getattr(app, "sock", ""):
            why = "the server listens on a Unix socket"
        elif getattr(app, "certfile", ""):
            why = "the server uses TLS, which a forwarded loopback port cannot verify"
        if why is None:
            ip = app.ip if app.ip not in ("", "0.0.0.0", "*", "localhost", "::", "[::]") \
                else "127.0.0.1"
            try:
                port = app.port
                if self._tunnels is not None:
                    port = await asyncio.to_thread(self._tunnels.reverse, ip.strip("[]"),
                                                   app.port)
                elif ip not in ("127.0.0.1", "::1"):
                    raise OSError(f"the server listens on {ip} only")
                _hpc, _kernels, settings = settings_of(self.parent)
                access = node_access.grant(self.kernel_id, job, settings)
                url = (f"http://127.0.0.1:{port}{app.base_url}cloudtik/api/hpc/kernels/"
                       f"{self.kernel_id}/node/")
                await asyncio.to_thread(job.write_node_api, url, access.token)
                self._set(storages="reachable")
                return
            except Exception as e:  # asyncssh's refusal of -R, the node's disk: said below
                node_access.revoke(self.kernel_id)
                why = getattr(e, "message", None) or str(e) or type(e).__name__
        self._set(storages=f"not reachable from the node: {why}")
        self.log.warning("HPC kernel %s: the session's storages are not reachable from the "
                         "node (%%storage there): %s", self.kernel_id, why)

    @staticmethod
    async def _ports_soon(job: KernelJob, within: float) -> dict[str, int] | None:
        """The kernel's ports if it binds them within ``within`` seconds, else None."""
        until = time.monotonic() + within
        while True:
            ports = await asyncio.to_thread(job.ports)
            if ports or time.monotonic() >= until:
                return ports
            await asyncio.sleep(min(PORTS_EVERY, max(until - time.monotonic(), 0.0)))

    async def post_launch(self, **kwargs: Any) -> None:
        # a dead HPC kernel is reported, not resubmitted: the restarter's first failure
        # is final ("dead"), so a job whose wall time ran out does not queue again
        restarter = getattr(self.parent, "_restarter", None)
        if restarter is not None:
            restarter.restart_limit = 0

    # watching -------------------------------------------------------------------------------
    async def _watch(self) -> None:
        job, kernels = self.job, self._kernels
        assert job is not None and kernels is not None
        warned = False
        while not self._ended:
            try:
                st = await asyncio.to_thread(job.status)
            except Exception as e:  # the login node did not answer: try again
                self.log.warning("HPC kernel %s: cannot see job %s: %s", self.kernel_id,
                            job.native_id, e)
                await asyncio.sleep(kernels.poll_interval)
                continue
            if st.final:
                why = ended_because(st)
                self._exit = st.exit_code if st.exit_code else (0 if st.state == "succeeded"
                                                                else 1)
                self._ended = True
                self._set(state="dead", native_state=st.native_state, reason=why)
                await self._record("update", self.kernel_id, state="dead", reason=why)
                level = logging.INFO if st.state == "succeeded" else logging.WARNING
                self.log.log(level, "HPC kernel %s: job %s ended (%s): %s", self.kernel_id,
                        job.native_id, st.native_state, why)
                return
            if self._tunnels is not None and not self._tunnels.alive():
                self.log.warning("HPC kernel %s: the SSH tunnel to %s closed; job %s still runs",
                            self.kernel_id, job.node, job.native_id)
                self._set(reason="the SSH tunnel to the compute node closed")
            left = (self.status.get("deadline") or 0) - time.time()
            if not warned and self.status.get("deadline") and left <= kernels.warn_before:
                warned = True
                self.log.warning("HPC kernel %s: job %s reaches its wall time in %.0f s",
                            self.kernel_id, job.native_id, max(left, 0))
                self._set(warning=f"the wall time ends in about {max(left, 0) / 60:.0f} min")
            await asyncio.sleep(kernels.poll_interval)

    async def poll(self) -> int | None:
        if self.job is None or self.job.native_id is None:
            return 0
        return self._exit if self._ended else None

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.2)
        return self._exit

    # acting ---------------------------------------------------------------------------------
    async def send_signal(self, signum: int) -> None:
        if self.job is None or signum == 0:
            return
        if signum in (signal.SIGTERM, signal.SIGKILL):
            await self._end(f"signal {signal.Signals(signum).name}")
            return
        await asyncio.to_thread(self.job.signal, signal.Signals(signum).name[3:])

    async def kill(self, restart: bool = False) -> None:
        await self._end("killed")

    async def terminate(self, restart: bool = False) -> None:
        await self._end("terminated")

    async def _end(self, why: str) -> None:
        """scancel the job, and wait (a little) until Slurm says it ended."""
        job = self.job
        if job is None or job.native_id is None or self._ended:
            return
        await asyncio.to_thread(job.cancel)
        self.log.info("HPC kernel %s: job %s cancelled (%s)", self.kernel_id, job.native_id, why)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        # the job's end is seen by polling Slurm: give it a few looks
        interval = self._kernels.poll_interval if self._kernels else 2.0
        return max(recommended, 4 * interval + 2)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, 30.0)

    async def cleanup(self, restart: bool = False) -> None:
        node_access.revoke(self.kernel_id)
        job = self.job
        if self._watcher is not None:
            self._ended = True
            self._watcher.cancel()
            self._watcher = None
        if self._tunnels is not None:
            await asyncio.to_thread(self._tunnels.close)
            self._tunnels = None
        if job is not None and job.native_id:
            st = await asyncio.to_thread(job.status)
            if not st.final:
                await asyncio.to_thread(job.cancel)
            await asyncio.to_thread(job.forget_key)
            await self._record("forget", self.kernel_id)
            if self.status.get("state") != "dead":
                self._set(state="dead", reason=st.message or "shut down")
        if not restart:
            _status.pop(self.kernel_id, None)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        if self.job is not None:
            info.update(hpc_backend=self._backend_name,
                        hpc_profile=self.profile, hpc_job=self.job.native_id,
                        hpc_folder=self.job.job_id)
        return info


