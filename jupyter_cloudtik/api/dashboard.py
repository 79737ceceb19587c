"""Every cluster's dashboard through the Jupyter server: ``{base_url}cloudtik/dashboard/NAME/``.

The browser of a JupyterHub user, of a remote JupyterLab, or behind a firewall reaches only
the Jupyter server, never a cluster's own ports.  This route serves a cluster's Dask
dashboard (its pages and the websockets Bokeh's plots use) under the server's base URL,
with jupyter-server-proxy's ``ProxyHandler`` doing the HTTP and websocket relaying.

What this adds to that handler is who may go where:

* **Authentication** is the server's (its cookie for browsers, XSRF on writes as every
  jupyter_server page, or the server's own token).  The kernel token does *not* open
  dashboards: it is a capability for the REST API only, and a dashboard is a browser page.
* **Authorization**: jupyter_server's authorizer with resource ``cloudtik``, then ownership:
  the cluster is looked up through the caller's own view (under the hub sidekick, the
  calling user's clusters only), so another user's cluster is a 404 like a missing one.
* **Target**: host and port come only from the cluster's recorded connect info (the
  scheduler's HTTP address its provider recorded), never from the URL; the URL names a
  cluster and a path under its dashboard.  A cluster that is stopped, stopping or has no
  live scheduler is a 404, and before the first request of a cluster (and every few
  seconds after) the dashboard's ``/json/identity.json`` must name the scheduler we
  recorded, so whatever now listens on a recycled port is never proxied to.
* **Still starting**: a cluster being started, or whose ``up`` finished less than
  ``START_GRACE`` seconds ago, whose scheduler is not recorded yet or whose dashboard
  does not answer at all yet (its head just came up; its relay closes connections while
  nothing listens behind it) and never answered here, is a 503 with ``Retry-After``: the
  dashboard is coming, so a client retries rather than being told there is none (a 404
  right after ``up`` made callers give up on a live cluster).  A dashboard that answered
  here before and answers no more is gone: 404.
* The caller's credentials for this server (cookie, Authorization, XSRF header) are not
  passed on to the cluster.
* **A dashboard behind mutual TLS** (a Huawei Cloud head or a TLS slurm scheduler job:
  its dashboard listens on its node's loopback, and the relay in front of it,
  ``connect_info.extra.dashboard_tls_address`` — runtime/dashboard_relay.py — requires a
  certificate of the cluster's CA): the server connects with the cluster's client
  certificate (from its own state folder), over HTTPS and WSS, trusting only the cluster's
  CA.  A browser holds no such certificate, so this is its only way in.  When the relay
  is reached through an SSH tunnel (``extra.tunnel``), the server opens its own tunnel
  (the view's ``connect_info``) instead of using another process's recorded port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from jupyter_server_proxy.handlers import ProxyHandler
from tornado import web

from ..core.errors import CloudTikError, NotFoundError
from ..runtime.tls import client_ssl_context, load_cluster_tls

log = logging.getLogger("jupyter_cloudtik.server")

DASHBOARD_PREFIX = "cloudtik/dashboard"
AUTH_RESOURCE = "cloudtik"
#: seconds a checked (cluster, dashboard address) pair is trusted before it is checked again
VERIFY_TTL = 5.0
#: how long a running cluster's dashboard may not answer at all (still starting) before
#: it is "none" (404)
UI_START_WAIT = 10.0
#: seconds after an ``up`` (or ``scale``) finished during which a dashboard that does not
#: answer at all, and has never answered here, is taken as still starting (503), not gone
START_GRACE = 60.0
#: seconds a client is told to wait (``Retry-After``) when a dashboard is still starting
RETRY_AFTER = 2
#: headers that carry the caller's credentials for *this* server: never sent to a cluster
NOT_FORWARDED = ("Cookie", "Authorization", "X-XSRFToken", "X-Xsrftoken")

# cluster name -> (checked at, connect info that answered as its scheduler)
_verified: dict[str, tuple[float, dict[str, Any]]] = {}
# (cluster name, dashboard address) pairs that have answered here as the cluster's scheduler:
# when one stops answering, it is gone (404), not starting
_answered: set[tuple[str, str]] = set()
# (cluster name, ALPN) -> (its client certificate, the SSLContext presenting it)
_contexts: dict[tuple[str, str | None], tuple[str, ssl.SSLContext]] = {}


class Target(tuple):
    """(host, port, path prefix) of a dashboard, and the ``SSLContext`` (with the cluster's
    client certificate) when it is reached over mutual TLS, else None."""

    ssl: ssl.SSLContext | None = None


class DashboardGone(NotFoundError):
    """404, with why (for the server log; the caller sees only that there is none)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"no running cluster named '{name}' with a dashboard",
                         field="name", value=name)
        self.why = why


class DashboardStarting(CloudTikError):
    """503: the cluster is starting or running, its dashboard is not there *yet*."""

    http_status = 503
    reason = "starting"

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"the dashboard of cluster '{name}' does not answer yet (it is "
                         f"still starting); retry in {RETRY_AFTER} s", field="name",
                         value=name)
        self.why = why


def dashboard_prefix(base_url: str) -> str:
    """``{base_url}cloudtik/dashboard/``: where every cluster's dashboard is served."""
    return url_path_join(base_url, DASHBOARD_PREFIX) + "/"


def dashboard_path(base_url: str, name: str, page: str = "status") -> str:
    """The path (under the server's origin) of one page of cluster ``name``'s dashboard."""
    return dashboard_prefix(base_url) + quote(name, safe="") + "/" + page.lstrip("/")


def _identity(url: str, context: ssl.SSLContext | None = None) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:  # an answer, not a connection error
        return {"error": f"HTTP {e.code} from {url}"}
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        return json.loads(body or b"null") or {}
    except ValueError:  # an answer, not a connection error
        return {"error": f"not JSON from {url}"}


def _not_its_scheduler(http: str, recorded: str, info: Any,
                       context: ssl.SSLContext | None = None) -> str | None:
    """Why what answers at ``http`` is not cluster ``info``'s scheduler (None when it is).

    The scheduler's identity names its address.  Dask answers 500 for the identity while
    some task metrics are not JSON-serialisable (any busy cluster); then its worker list
    must match the workers recorded for the cluster, or, behind a gateway's proxy (whose
    path names the cluster), a Dask scheduler's task counts must answer there."""
    base = http.rstrip("/")
    ident = _identity(base + "/json/identity.json", context)
    if ident.get("type") == "Scheduler":
        if recorded.startswith("gateway://") or ident.get("address") == recorded or (
                _port(ident.get("address")) == _port(recorded)):
            return None
        return f"it is scheduler {ident.get('address')}"
    if recorded.startswith("gateway://"):
        # the gateway's proxy routes /clusters/<id> to that cluster's scheduler only, and
        # the gateway's address comes from the admin's config, not from a recycled port:
        # a Dask scheduler's task counts answering there are the cluster's own (its
        # schedulers serve /json but not /api/v1)
        counts = _identity(base + "/json/counts.json")
        if "workers" in counts and "tasks" in counts:
            return None
        return ident.get("error") or counts.get("error") or "no scheduler identity"
    listed = _identity(base + "/api/v1/get_workers", context)
    if "workers" not in listed:
        return ident.get("error") or listed.get("error") or "no scheduler identity"
    theirs = {w.get("address") for w in listed["workers"]}
    ours = {(n.info or {}).get("address") for n in info.nodes if n.kind != "head"} - {None}
    if theirs == ours or theirs & ours:
        return None
    return "its workers are not the cluster's"


def _just_started(info: Any) -> bool:
    """The cluster is being started, or its last ``up``/``scale`` finished a moment ago:
    a dashboard that is not there yet is coming (its head may still be starting it)."""
    if info.state == "starting":
        return True
    last = info.last_operation or {}
    if last.get("kind") not in ("cluster.up", "cluster.scale"):
        return False
    if last.get("state") in ("pending", "running"):
        return True
    return time.time() - float(last.get("finished_at") or 0) < START_GRACE


def _no_answer(why: str) -> bool:
    """``why`` is an error of the connection itself (``_identity``'s), not an answer."""
    kind = why.split(":", 1)[0]
    return kind.isidentifier() and kind.endswith(("Error", "Disconnected", "Exception"))


def _port(address: str | None) -> str | None:
    if not address or ":" not in address:
        return None
    return address.rsplit(":", 1)[1].strip("/")


def client_context(view: Any, info: Any, alpn: str | None = None) -> ssl.SSLContext:
    """The cluster's client certificate as an ``SSLContext`` (kept while it is the same),
    offering ``alpn`` (the UI a head's relay passes the connection to; none: Dask's).

    Read from the state folder of the store the caller's view reads (the server's own, or
    the hub sidekick's, whose per-user view already refused another user's cluster)."""
    store = getattr(view, "store", None)
    tls = load_cluster_tls(store.state_dir, info.name) if store is not None else None
    creds = tls.client_credentials() if tls is not None else None
    if not creds:
        raise DashboardGone(info.name, "its dashboard requires the cluster's client "
                                       "certificate, which this server does not hold")
    cached = _contexts.get((info.name, alpn))
    if cached is None or cached[0] != creds["cert"]:
        cached = (creds["cert"], client_ssl_context(creds, alpn=alpn))
        _contexts[(info.name, alpn)] = cached
    return cached[1]


async def verified_target(view: Any, name: str) -> Target:
    """(host, port, path prefix) of cluster ``name``'s dashboard, checked to be its own.

    ``view`` is the caller's cluster manager (the hub's per-user view raises NotFound for
    another user's cluster).  Raises ``NotFoundError`` (404) for anything that is not a
    running cluster with a live scheduler answering at its recorded address."""
    info = view.get(name)  # 404 when missing or not the caller's
    if info.state in ("stopped", "stopping", "failed"):
        _verified.pop(name, None)
        raise DashboardGone(name, f"the cluster is {info.state}")
    connect = info.connect_info
    cached = _verified.get(name)
    fresh = cached is not None and time.monotonic() - cached[0] <= VERIFY_TTL
    if not connect:
        # the head's record is rewritten while the cluster is observed: a target checked
        # a moment ago still stands; otherwise there is no scheduler to show
        if not fresh:
            if _just_started(info):
                raise DashboardStarting(name, f"the cluster is {info.state}, its "
                                              "scheduler is not recorded yet")
            raise DashboardGone(name, "no scheduler is recorded")
        connect = cached[1]  # type: ignore[index]
    elif (connect.get("extra") or {}).get("tunnel"):
        # reached through an SSH tunnel (a slurm scheduler job behind a login node): the
        # recorded port is the recording process's end of it; this process opens its own
        # (the view's connect_info: ownership checked again, the provider's tunnels)
        if fresh:
            connect = cached[1]  # type: ignore[index]
        else:
            _, usable = await asyncio.to_thread(view.connect_info, name)
            connect = usable.to_dict()
    http = _address(connect)
    parts = urlsplit(http or "")
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise DashboardGone(name, "no dashboard address is recorded")
    context = client_context(view, info) if parts.scheme == "https" else None
    if not (fresh and _address(cached[1]) == http):  # type: ignore[index]
        # the scheduler names its own address, not a tunnel's end on this machine
        recorded = (connect.get("extra") or {}).get("remote_scheduler_address") or \
            connect.get("scheduler_address") or ""
        deadline = time.monotonic() + UI_START_WAIT
        while True:
            why = await asyncio.to_thread(_not_its_scheduler, http, recorded, info, context)
            # nothing answered at all: a head just up may still be starting its dashboard
            # (its relay closes a connection while nothing listens behind it); a running
            # cluster gets a few seconds before the answer is "none"
            if not why or not _no_answer(why) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        if why:
            _verified.pop(name, None)
            if _no_answer(why) and (name, http) not in _answered and _just_started(info):
                # nothing listens yet right after `up`: coming, not gone
                raise DashboardStarting(name, f"{http} does not answer yet ({why})")
            raise DashboardGone(name, f"{http} does not answer as scheduler {recorded} "
                                      f"({why})")
        _verified[name] = (time.monotonic(), dict(connect))
        _answered.add((name, http))
    target = Target((parts.hostname, parts.port, parts.path.rstrip("/")))
    target.ssl = context
    return target


def _address(connect: dict[str, Any]) -> str | None:
    """The recorded dashboard: the scheduler's HTTP address, or a mutual-TLS relay's."""
    return connect.get("http_address") or (connect.get("extra") or {}).get(
        "dashboard_tls_address")


class DashboardHandler(ProxyHandler):
    """``{base_url}cloudtik/dashboard/NAME/PATH``: PATH of cluster NAME's dashboard."""

    auth_resource = AUTH_RESOURCE
    #: the route under the server's base URL, and the page an empty path redirects to
    route = DASHBOARD_PREFIX
    home_page = "status"
    _target: tuple[str, int, str] | None = None

    def initialize(self) -> None:
        # never a host from the URL: the only host allowed is the one resolved in prepare
        self.host_allowlist = self._allowed

    def _allowed(self, handler: Any, host: str) -> bool:
        return self._target is not None and host == self._target[0]

    @property
    def _name(self) -> str:
        return self.path_kwargs.get("name", "")

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        await super().prepare(*args, **kwargs)  # authentication (403 / login redirect)
        action = "read" if self.request.method in ("GET", "HEAD", "OPTIONS") else "write"
        if not self.authorizer.is_authorized(self, self.current_user, action,
                                             AUTH_RESOURCE):
            raise web.HTTPError(403, f"not allowed to {action} cluster dashboards")
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            JupyterHandler.check_xsrf_cookie(self)
        ctx = self.settings["cloudtik"]
        for_request = getattr(ctx, "for_request", None)
        view = (for_request(self) if for_request is not None else ctx).manager
        try:
            self._target = await self.resolve_target(view, self._name)
        except DashboardGone as e:
            self.log.info("dashboard of %s: %s", self._name, e.why)
            raise web.HTTPError(404, e.message) from None
        except DashboardStarting as e:
            self.log.info("dashboard of %s: %s", self._name, e.why)
            raise web.HTTPError(503, e.message) from None
        except CloudTikError as e:
            raise web.HTTPError(404 if e.http_status in (404, 409) else e.http_status,
                                e.message) from None

    async def resolve_target(self, view: Any, name: str) -> tuple[str, int, str]:
        """(host, port, path prefix) of what cluster ``name`` serves here, checked."""
        return await verified_target(view, name)

    @property
    def _ssl(self) -> ssl.SSLContext | None:
        return getattr(self._target, "ssl", None)

    def get_client_uri(self, protocol: str, host: str, port: int, proxied_path: str) -> str:
        if self._ssl is not None:  # the cluster's dashboard is behind mutual TLS
            protocol = {"http": "https", "ws": "wss"}.get(protocol, protocol)
        return super().get_client_uri(protocol, host, port, proxied_path)

    def proxy_request_options(self) -> dict[str, Any]:
        options = super().proxy_request_options()
        if self._ssl is not None:
            options["ssl_options"] = self._ssl
        return options

    def _get_context_path(self, host: str, port: int) -> str:
        return url_path_join(self.base_url, self.route) + "/" + quote(self._name, safe="")

    def _path(self, proxied_path: str | None) -> str:
        assert self._target is not None
        return self._target[2] + "/" + (proxied_path or "").lstrip("/")

    def proxy_request_headers(self) -> Any:
        headers = super().proxy_request_headers()
        for h in NOT_FORWARDED:
            headers.pop(h, None)
        return headers

    def check_xsrf_cookie(self) -> None:
        """Checked in ``prepare`` (writes only), as jupyter_server does for its pages."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        message = getattr(exc, "log_message", None) or ""
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        if status_code == 503:  # still starting: when to ask again
            self.set_header("Retry-After", str(RETRY_AFTER))
        self.finish(json.dumps({"message": message or str(status_code),
                                "reason": {403: "forbidden", 404: "not_found",
                                           503: "starting"}.get(
                                    status_code, "error")}))

    # the methods: everything goes to the resolved target --------------------------------
    async def http_get(self, name: str, proxied_path: str | None = None) -> Any:
        if not proxied_path:
            return self.redirect(self._get_context_path("", 0) + "/" + self.home_page)
        host, port, _ = self._target  # type: ignore[misc]
        return await self.proxy(host, port, self._path(proxied_path))

    async def open(self, name: str, proxied_path: str | None = None) -> Any:
        host, port, _ = self._target  # type: ignore[misc]
        if self._ssl is not None:
            return await self._open_tls(host, port, self._path(proxied_path))
        return await self.proxy_open(host, port, self._path(proxied_path))

    async def _open_tls(self, host: str, port: int, path: str) -> None:
        """``proxy_open`` over WSS with the cluster's client certificate.

        jupyter-server-proxy builds its backend websocket request without TLS options (it
        proxies to local, plain ports), so this is its ``proxy_open`` with them: the same
        relaying of messages and pings, through its ``pingable_ws_connect``."""
        from jupyter_server_proxy.websocket import pingable_ws_connect
        from tornado import httpclient

        uri = self.get_client_uri("ws", host, port, path)

        def message_cb(message: Any) -> None:
            self._record_activity()
            if message is None:
                self.close()
            else:
                self.write_message(message, binary=isinstance(message, bytes))

        def ping_cb(data: bytes) -> None:
            self._record_activity()
            self.ping(data)

        self._record_activity()
        request = httpclient.HTTPRequest(url=uri, headers=self.proxy_request_headers(),
                                         ssl_options=self._ssl)
        self.ws = await pingable_ws_connect(
            request=request, on_message_callback=message_cb, on_ping_callback=ping_cb,
            subprotocols=self._requested_subprotocols)
        self._record_activity()

    def _relay(self, name: str, proxied_path: str | None = None) -> Any:
        host, port, _ = self._target  # type: ignore[misc]
        return self.proxy(host, port, self._path(proxied_path))

    post = put = delete = patch = head = options = _relay  # type: ignore[assignment]


def dashboard_routes(base_url: str) -> list[tuple[str, Any]]:
    """The dashboard route of a server (or the hub sidekick) at ``base_url``."""
    return [(dashboard_prefix(base_url).rstrip("/") + r"/(?P<name>[^/]+)(?P<proxied_path>/.*)?",
             DashboardHandler)]
