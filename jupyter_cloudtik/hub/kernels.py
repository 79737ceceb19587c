"""Interactive HPC kernels through the hub: the sidekick submits and reaches them, the
user's own server runs the kernel manager.

The backends' credentials (an SSH key in the sidekick's secret store) stay with the
sidekick.  A user's server asks it, with the server's hub token, for

* the profiles the catalogue grants the caller (kind ``kernel``; each names an ``hpc``
  backend the caller must also be granted: ``policy.CatalogPolicy`` decides both);
* a kernel of one, with the HMAC key the server's kernel manager signs messages with
  (written, mode 0600, into the job's connection file on the cluster);
* the job's state, the kernel's readiness, a signal, its end;
* a websocket per kernel port, which the sidekick joins to the kernel's port on the
  node's loopback: through its SSH connection to the node (listening on Unix sockets in a
  private folder of the sidekick's, never on a loopback port other accounts of the
  sidekick's machine could reach), or directly when the node is the sidekick's machine.

Every call after the start names a kernel the caller owns, or gets the very 404 a
missing one gets.  A kernel whose server stops asking after it for ``kernel_lease``
seconds (the server was killed) is ended by the sidekick, and so is every kernel of a
sidekick that is killed (``records.end_orphans`` at the next start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import (
    CloudTikError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
)
from ..hpc.base import RUNNING
from ..hpc.kernels.job import PORT_NAMES, KernelJob
from ..hpc.kernels.profiles import (
    HPCKernels,
    Profile,
    check_interactive,
    parse_profile,
    parse_size,
)
from ..hpc.kernels.records import KernelRecords, end_orphans
from .backend_kinds import local_backend_type
from .catalog import Caller

log = logging.getLogger("jupyter_cloudtik.hub.kernels")

#: what a start may say
START_FIELDS = ("profile", "custom", "key", "session")
#: signals a user may send to their kernel's process (TERM and KILL: DELETE ends it)
SIGNALS = ("INT", "HUP", "QUIT", "USR1", "USR2")
#: jupyter_client's keys are uuid4 strings; anything else is refused, not written
_KEY = re.compile(r"[A-Za-z0-9_.-]{16,128}")
_ID = re.compile(r"[0-9a-f]{32}")
LEASE_EVERY = 10.0  # s between two looks for kernels whose server stopped asking


def profile_of(name: str, spec: dict[str, Any]) -> Profile:
    """A catalogue ``kernel`` item as a profile; a mistake names ``spec.<field>``."""
    return parse_profile({"name": name, **spec}, 0, where="spec")


@dataclass
class HubKernel:
    id: str
    owner: str
    profile: Profile
    job: KernelJob
    seen: float = field(default_factory=time.monotonic)
    ports: dict[str, int] | None = None
    #: port name -> ("unix", path) | ("tcp", port), once connected
    channels: dict[str, tuple[str, Any]] | None = None
    tunnels: Any = None
    folder: str | None = None
    ended: bool = False  # its job was seen ended: nothing to reach any more
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class HubKernels:
    """Every hub user's HPC kernels, in the sidekick."""

    def __init__(self, hub: Any) -> None:
        for name, value, least in (("kernels_per_user", hub.hub.kernels_per_user, 1),
                                   ("kernel_lease", hub.hub.kernel_lease, 10)):
            if value < least:
                raise ConfigError(f"c.CloudTikHub.{name} is {value!r}; expected a number "
                                  f">= {least}", field=name, value=value)
        self.hub = hub
        # the sidekick's own log (the service's output), not a module logger nobody reads
        self.log = getattr(hub.serverapp, "log", None) or log
        self._kernels: dict[str, HubKernel] = {}
        self.records = KernelRecords(hub.store)
        self.settings = HPCKernels(parent=hub.serverapp)
        self._reaper: asyncio.Task | None = None
        # the Unix sockets of the forwards: a private folder (0700, mkdtemp) with a short
        # path, since a socket's path has at most 107 bytes (a state folder can be longer)
        self._private: str | None = None

    # deciding ---------------------------------------------------------------------------
    def profiles(self, caller: Caller) -> list[dict[str, Any]]:
        """The profiles the caller may start, as the catalogue wrote them (their user's
        server makes its kernel specs from these)."""
        out = []
        # visible(): what the policy grants, the profile with its backend
        for res in self.hub.visible(caller, "kernel"):
            try:
                p = profile_of(res.name, res.spec)
                be = self._backend(p)
            except CloudTikError as e:
                self.log.warning("HPC kernel profile %r not offered to %s: %s", res.name,
                            caller.name, e)
                continue
            out.append({**res.spec, "name": res.name, "backend": p.backend,
                        "display_name": p.title(), "description": res.description,
                        "kind": be.kind})
        return out

    def _backend(self, p: Profile) -> Any:
        """The profile's backend, if the hub may run users' kernels on it: one that runs
        them as the sidekick's own account on its machine only where the hub allows
        that, and a site account shared by the hub's users only where its admin says so
        (``shared_account_kernels`` of its ``hpc`` item): kernels of one account can read
        each other's connection files, so a user could reach another's kernel on a
        node they share."""
        where = local_backend_type(self.hub, p.backend)
        if where and not self.hub.hub.allow_local_execution:
            raise PermissionDeniedError(
                f"backend: '{p.backend}' ({where}) would run kernels as the sidekick's own "
                "account on its machine, which this hub does not allow "
                "(c.CloudTikHub.allow_local_execution)", field="backend", value=p.backend)
        res = self.hub.catalog.find("hpc", p.backend)
        if res is None or res.spec.get("shared_account_kernels") is not True:
            raise PermissionDeniedError(
                f"backend: '{p.backend}' runs every hub user's jobs as one account of its "
                "site, so one user's kernel could read another's key and reach that kernel "
                "on a node they share; its admin offers kernels on it only by setting "
                "shared_account_kernels: true in its hpc catalogue item",
                field="backend", value=p.backend)
        be = self.hub.job_manager().registry.get(p.backend)
        check_interactive(p.backend, be.kind)
        return be

    def resolve(self, caller: Caller, name: Any, custom: Any = None) -> tuple[Profile, Any]:
        """The profile a kernel of ``name`` runs with, at the caller's custom size: the
        catalogue's grant (item and backend), then the admin's bounds."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"profile: {name!r} is not a profile name", field="profile",
                              value=name)
        self.hub.grant(caller, "kernel", name, "run", field="profile")
        p = profile_of(name, self.hub.catalog.get("kernel", name).spec)
        if custom is not None:
            p = p.with_size(parse_size(custom, "custom"))
        return p, self._backend(p)

    async def size(self, caller: Caller, name: Any, custom: Any) -> Profile:
        """A custom size checked as a start checks it, before any job."""
        p, be = self.resolve(caller, name, custom)
        await asyncio.to_thread(KernelJob(be, p, key="").check)
        return p

    def _own(self, caller: Caller, kid: str) -> HubKernel:
        k = self._kernels.get(kid) if isinstance(kid, str) and _ID.fullmatch(kid) else None
        if k is None or k.owner != caller.name:
            raise NotFoundError(f"kernel: no HPC kernel {kid!r}", field="kernel", value=kid)
        k.seen = time.monotonic()
        return k

    # starting ---------------------------------------------------------------------------
    async def start(self, caller: Caller, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ConfigError("body: expected a JSON object", field="body")
        unknown = sorted(set(body) - set(START_FIELDS))
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown field; allowed: "
                              f"{', '.join(START_FIELDS)}", field=unknown[0])
        key = body.get("key")
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ConfigError("key: expected the kernel's message key (16 to 128 letters, "
                              "digits, '.', '_' or '-')", field="key")
        limit = self.hub.hub.kernels_per_user
        mine = [k for k in self._kernels.values() if k.owner == caller.name]
        if len(mine) >= limit:
            raise ConflictError(f"profile: you have {len(mine)} HPC kernels through the "
                                f"hub, the most it allows (c.CloudTikHub.kernels_per_user = "
                                f"{limit}); shut one down first", field="profile")
        p, be = self.resolve(caller, body.get("profile"), body.get("custom"))
        job = KernelJob(be, p, key=key, warn_before=self.settings.warn_before)
        kid = uuid.uuid4().hex
        k = HubKernel(kid, caller.name, p, job)
        self._kernels[kid] = k  # counted from now: two starts at once cannot both pass
        try:
            await asyncio.to_thread(job.check)
        except BaseException:
            self._kernels.pop(kid, None)
            raise
        self.hub.audit_use(caller, "kernel.start", f"kernel/{p.name}",
                           {"kernel": kid, "backend": p.backend})
        # recorded before sbatch: a sidekick killed meanwhile leaves a row the next one
        # ends the job of (records.end_orphans)
        await asyncio.to_thread(self.records.started, kid, backend=p.backend,
                                profile=p.name, job_id=job.job_id, native_id=None)
        try:
            native = await asyncio.to_thread(job.submit)
        except BaseException:
            self._kernels.pop(kid, None)
            await asyncio.to_thread(self.records.forget, kid)
            raise
        await asyncio.to_thread(self.records.update, kid, native_id=native)
        self.log.info("HPC kernel %s of %s: job %s submitted to %s (%s)", kid, caller.name, native,
                 p.backend, p.title())
        self._ensure_reaper()
        return {"id": kid, "job": native, "backend": p.backend, "profile": p.name,
                "folder": job.job_id, "display_name": p.title(),
                "environment": job.environment}

    # watching ---------------------------------------------------------------------------
    async def status(self, caller: Caller, kid: str) -> dict[str, Any]:
        k = self._own(caller, kid)
        st = await asyncio.to_thread(k.job.status)
        out = {"id": kid, "job": k.job.native_id, "state": st.state,
               "native_state": st.native_state, "message": st.message,
               "exit_code": st.exit_code, "final": st.final, "node": k.job.node,
               "address": k.job.address}
        if st.state == RUNNING and k.job.address is None:
            await asyncio.to_thread(k.job.node_address)
            out.update(node=k.job.node, address=k.job.address)
        if st.final:
            k.ended = True
            await self._close_channels(k)
        return out

    async def ports(self, caller: Caller, kid: str) -> dict[str, Any]:
        """Whether the kernel has bound its ports (one read of its connection file)."""
        k = self._own(caller, kid)
        if k.ports is None:
            k.ports = await asyncio.to_thread(k.job.ports)
        return {"ports": k.ports}

    async def connect(self, caller: Caller, kid: str) -> dict[str, Any]:
        """Reach the kernel's ports from here (an SSH connection to its node)."""
        k = self._own(caller, kid)
        async with k.lock:
            if k.channels is not None and (k.tunnels is None or k.tunnels.alive()):
                return {"channels": sorted(k.channels)}
            await self._close_channels(k)
            if k.ports is None:
                k.ports = await asyncio.to_thread(k.job.ports)
            if k.ports is None:
                raise ConflictError("kernel: it has not bound its ports yet; ask again "
                                    "once GET .../ports names them", field="kernel",
                                    value=kid)
            folder = None
            if k.job.backend.remote:
                if self._private is None or not os.path.isdir(self._private):
                    self._private = tempfile.mkdtemp(prefix="cloudtik-kernels-")
                folder = os.path.join(self._private, kid[:12])
                os.makedirs(folder, mode=0o700, exist_ok=True)
            local, k.tunnels = await asyncio.to_thread(k.job.open_channels, k.ports, folder)
            k.folder = folder
            k.channels = {n: ("unix" if folder else "tcp", local[n]) for n in PORT_NAMES}
            await asyncio.to_thread(self.records.update, kid, state="running",
                                    node=k.job.node)
            self.log.info("HPC kernel %s of %s: job %s on %s reached through %s", kid, caller.name,
                     k.job.native_id, k.job.node,
                     "SSH" if k.tunnels is not None else "this machine")
            return {"channels": sorted(k.channels)}

    async def open_channel(self, caller: Caller, kid: str, name: str
                           ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        k = self._own(caller, kid)
        if name not in PORT_NAMES:
            raise NotFoundError(f"channel: {name!r} is not one of {', '.join(PORT_NAMES)}",
                                field="channel", value=name)
        if k.ended:
            raise ConflictError("kernel: its job has ended", field="kernel", value=kid)
        if k.channels is None:
            await self.connect(caller, kid)
        assert k.channels is not None
        how, where = k.channels[name]
        if how == "unix":
            return await asyncio.open_unix_connection(where)
        return await asyncio.open_connection("127.0.0.1", where)

    # acting ---------------------------------------------------------------------------------
    async def signal(self, caller: Caller, kid: str, name: Any) -> None:
        k = self._own(caller, kid)
        if name not in SIGNALS:
            raise ConfigError(f"signal: {name!r} is not one of {', '.join(SIGNALS)} (DELETE "
                              "ends the kernel)", field="signal", value=name)
        await asyncio.to_thread(k.job.signal, name)

    async def cancel(self, caller: Caller, kid: str) -> None:
        """End the job; the kernel stays listed until DELETE (its end can be watched)."""
        k = self._own(caller, kid)
        await asyncio.to_thread(k.job.cancel)

    async def delete(self, caller: Caller, kid: str) -> None:
        k = self._own(caller, kid)
        await self._end(k, "shut down by its server")

    async def _end(self, k: HubKernel, why: str) -> None:
        self._kernels.pop(k.id, None)
        await self._close_channels(k)
        try:
            st = await asyncio.to_thread(k.job.status)
            if not st.final:
                await asyncio.to_thread(k.job.cancel)
        except CloudTikError as e:  # it is cancelled blind: a job nobody reaches must end
            self.log.warning("HPC kernel %s: cannot see job %s (%s); cancelling it", k.id,
                        k.job.native_id, e)
            try:
                await asyncio.to_thread(k.job.cancel)
            except CloudTikError:
                self.log.warning("HPC kernel %s: job %s could not be cancelled; the next "
                            "sidekick tries again", k.id, k.job.native_id)
                return  # its record stays: end_orphans ends it
        await asyncio.to_thread(k.job.forget_key)
        await asyncio.to_thread(self.records.forget, k.id)
        self.log.info("HPC kernel %s of %s: job %s ended (%s)", k.id, k.owner, k.job.native_id,
                 why)

    async def _close_channels(self, k: HubKernel) -> None:
        tunnels, folder = k.tunnels, k.folder
        k.tunnels = k.channels = k.folder = None
        if tunnels is not None:
            await asyncio.to_thread(tunnels.close)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    # the lease ------------------------------------------------------------------------------
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        lease = self.hub.hub.kernel_lease
        while self._kernels:
            await asyncio.sleep(min(LEASE_EVERY, lease / 4))
            now = time.monotonic()
            for k in [k for k in self._kernels.values() if now - k.seen > lease]:
                await self._end(k, f"its server stopped asking after it for over "
                                   f"{lease:.0f} s (c.CloudTikHub.kernel_lease)")

    def end_orphans(self) -> list[str]:
        """The jobs of kernels of a sidekick that was killed: ended (blocking)."""
        if not self.records.orphans():
            return []
        return end_orphans(self.records, self.hub.job_manager().registry, self.log)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for k in list(self._kernels.values()):
            await self._end(k, "the sidekick stopped")
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
