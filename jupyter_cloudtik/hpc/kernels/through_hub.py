"""A user's server's side of HPC kernels through a JupyterHub sidekick.

On a hub, the backends and their credentials are the sidekick's (``hub/kernels.py``); a
user's server has neither.  Its kernel spec manager lists the kernel profiles the hub's
catalogue grants the user, and the provisioner drives the kernel's job through the
sidekick with ``HubKernelJob``: the same calls as ``job.KernelJob`` (so the provisioner
waits, watches, signals and ends both the same way), each a request with the server's hub
token.  The kernel's ports are reached through ``Relays``: a loopback port of this server
per kernel port, each connection to it one websocket to the sidekick, which joins it to
the kernel's port on the node.  No credential of the backend, and no port of the node,
is ever on this server's side.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from ...api.client import RestClient, _seg
from ...core import env as envnames
from ...core.errors import CloudTikError, ConfigError, NotFoundError
from ..base import CANCELLED, JobRef, JobStatus
from .job import PORT_NAMES
from .profiles import Profile, parse_profile, parse_size

log = logging.getLogger("jupyter_cloudtik.hpc.kernels")
PROFILES_FOR = 10.0  # s a listing of the hub's profiles is used again
#: where the sidekick may be reached without TLS: this machine only
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
_profiles_cache: dict[str, tuple[float, list[Profile] | CloudTikError]] = {}


def hub_url(config: Any = None) -> str | None:
    """The sidekick's URL when this server delegates to one (and has a hub token)."""
    configured: Any = ""
    if config is not None and "CloudTikServer" in config:
        configured = config["CloudTikServer"].get("hub_service_url", "")
    if not isinstance(configured, str):  # traitlets' placeholder of an unset value
        configured = ""
    url = configured or os.environ.get(envnames.HUB_SERVICE_URL, "")
    if not url or not os.environ.get("JUPYTERHUB_API_TOKEN"):
        return None
    return url if url.endswith("/") else url + "/"


def hub_client(url: str, timeout: float = 30.0) -> RestClient:
    return RestClient(url + "cloudtik/api/", os.environ.get("JUPYTERHUB_API_TOKEN"),
                      timeout=timeout)


def hub_profiles(url: str, fresh: bool = False) -> list[Profile]:
    """The profiles the hub grants this server's user (at most ``PROFILES_FOR`` s old
    unless ``fresh``).  A sidekick that does not answer raises: said, not read as none."""
    now = time.monotonic()
    cached = _profiles_cache.get(url)
    if cached is not None and not fresh and now - cached[0] < PROFILES_FOR:
        if isinstance(cached[1], CloudTikError):
            raise cached[1]
        return cached[1]
    # short: a kernel spec listing waits for it (kept, answer or failure, PROFILES_FOR s:
    # a sidekick that does not answer delays one listing, not every one)
    try:
        answer = hub_client(url, timeout=5.0)._json("GET", "hub/kernel-profiles")
    except CloudTikError as e:
        _profiles_cache[url] = (now, e)
        raise
    out = []
    for i, item in enumerate(answer.get("profiles") or []):
        raw = {k: v for k, v in item.items()
               if k in ("name", "backend", "cores", "memory", "time", "partition", "gpus",
                        "account", "display_name", "custom")}
        try:
            p = parse_profile(raw, i, where=f"the hub's kernel profile {item.get('name')!r}")
        except ConfigError as e:  # the sidekick checked it; a newer one may know more
            log.warning("jupyter_cloudtik: %s", e.message)
            continue
        p.hub = True
        out.append(p)
    _profiles_cache[url] = (now, out)
    return out


def hub_profile(url: str, name: str, custom: Any = None) -> Profile:
    """The hub's profile ``name`` (asked afresh), at a custom size within its bounds."""
    for p in hub_profiles(url, fresh=True):
        if p.name == name:
            return p.with_size(parse_size(custom, "custom")) if custom is not None else p
    raise ConfigError(f"profile: the hub offers you no kernel profile {name!r}",
                      field="profile", value=name)


def hub_size_check(serverapp: Any, name: str, custom: Any) -> Profile:
    """A custom size of the hub's profile ``name``: the profile's bounds here, then the
    sidekick's checks (its grant, the bounds again, the partition), before any job."""
    url = hub_url(getattr(serverapp, "config", None))
    if url is None:
        raise ConfigError("hub: this server has no hub sidekick to ask", field="hub")
    sized = hub_profile(url, name, custom)
    HubKernelJob(url, sized, key="").check()
    return sized


class HubKernelJob:
    """The batch job of one kernel, submitted and reached by the hub's sidekick."""

    def __init__(self, url: str, profile: Profile, key: str, loop: Any = None) -> None:
        self.url, self.profile, self.key, self.loop = url, profile, key, loop
        self.client = hub_client(url)
        self.kid: str | None = None
        self.job_id = ""
        self.native_id: str | None = None
        self.node: str | None = None
        self.address: str | None = None
        self.environment: dict[str, Any] = {}

    @property
    def ref(self) -> JobRef:
        return JobRef(self.job_id, self.native_id or "")

    def _path(self, *parts: str) -> str:
        return "/".join(["hub/kernels", _seg(self.kid or ""), *parts])

    def check(self) -> None:
        """The way to the sidekick carries the kernel's key and messages: encrypted, or on
        this machine's loopback; then the profile's grant and a custom size's bounds,
        asked of the sidekick."""
        parts = urlsplit(self.url)
        if parts.scheme != "https" and (parts.hostname or "") not in LOOPBACK_HOSTS:
            raise ConfigError(
                f"hub: the sidekick is at {parts.scheme}://{parts.hostname}, so the kernel's "
                "key and messages would cross the network unencrypted; reach it over https "
                "(JupyterHub's c.JupyterHub.internal_ssl) or on this machine",
                field="hub", value=f"{parts.scheme}://{parts.hostname}")
        if self.profile.size is not None:
            self.client._json("POST", "hub/kernel-sizes", body={
                "profile": self.profile.name, "custom": self.profile.size.to_config()})

    def submit(self) -> str:
        body: dict[str, Any] = {"profile": self.profile.name, "key": self.key}
        if self.profile.size is not None:
            body["custom"] = self.profile.size.to_config()
        answer = self.client._json("POST", "hub/kernels", body=body)
        self.kid, self.native_id = answer["id"], str(answer["job"])
        self.job_id = answer.get("folder") or ""
        self.environment = answer.get("environment") or {}
        return self.native_id

    def status(self) -> JobStatus:
        try:
            a = self.client._json("GET", self._path())
        except NotFoundError:
            return JobStatus(CANCELLED, message="the hub's sidekick no longer has this "
                             "kernel (it ended its job: the sidekick restarted, or this "
                             "server stopped asking after it)")
        self.node = a.get("node") or self.node
        self.address = a.get("address") or self.address
        return JobStatus(a["state"], native_state=a.get("native_state"),
                         message=a.get("message"), exit_code=a.get("exit_code"))

    def ports(self) -> dict[str, int] | None:
        try:
            return self.client._json("GET", self._path("ports")).get("ports")
        except CloudTikError:
            return None

    def node_address(self) -> str:
        if self.address is None:
            self.status()
        if self.address is None:
            raise CloudTikError(f"the hub's sidekick does not say where job {self.native_id} "
                                "runs")
        return self.address

    def open_channels(self, ports: dict[str, int], folder: str | None = None
                      ) -> tuple[dict[str, int], Relays]:
        self.client._json("POST", self._path("connect"))
        ws = self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        relays = Relays(self.loop, lambda name: f"{ws}cloudtik/api/{self._path('channels', name)}")
        return relays.start(), relays

    def signal(self, name: str) -> None:
        if self.kid:
            self.client._json("POST", self._path("signal"), body={"signal": name})

    def cancel(self) -> None:
        if self.kid:
            try:
                self.client._json("POST", self._path("cancel"))
            except NotFoundError:
                pass

    def forget_key(self) -> None:
        """The sidekick forgets the kernel: its key, its channels, its job."""
        if self.kid:
            try:
                self.client._request("DELETE", self._path())
            except NotFoundError:
                pass


class Relays:
    """A loopback port of this server per kernel port; each connection to one is a
    websocket to the sidekick (this server's hub token), bytes both ways."""

    def __init__(self, loop: Any, url_of: Any) -> None:
        self.loop, self.url_of = loop, url_of
        self._servers: list[asyncio.Server] = []
        self._closed = False
        self.failures = 0

    def start(self) -> dict[str, int]:
        """Listen (called from a thread: the relays live on the server's loop)."""
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> dict[str, int]:
        ports = {}
        for name in PORT_NAMES:
            srv = await asyncio.start_server(
                lambda r, w, n=name: self._serve(n, r, w), "127.0.0.1", 0)
            self._servers.append(srv)
            ports[name] = srv.sockets[0].getsockname()[1]
        return ports

    async def _serve(self, name: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        try:
            ws = await websocket_connect(HTTPRequest(
                self.url_of(name), request_timeout=30, headers={
                    "Authorization": "token " + os.environ.get("JUPYTERHUB_API_TOKEN", "")}),
                max_message_size=2**30)
        except Exception as e:  # the kernel's ZMQ socket connects again by itself
            self.failures += 1
            log.warning("jupyter_cloudtik: the hub's sidekick refused the kernel's %s: %s",
                        name, e)
            writer.close()
            return

        async def up() -> None:
            try:
                while data := await reader.read(65536):
                    await ws.write_message(data, binary=True)
            finally:
                ws.close()

        async def down() -> None:
            try:
                while (m := await ws.read_message()) is not None:
                    writer.write(m if isinstance(m, bytes) else m.encode())
                    await writer.drain()
            finally:
                writer.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    def alive(self) -> bool:
        return not self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def go() -> None:
            for srv in self._servers:
                srv.close()

        try:
            asyncio.run_coroutine_threadsafe(go(), self.loop).result(5)
        except Exception:  # the loop has stopped: so have the listeners
            pass
