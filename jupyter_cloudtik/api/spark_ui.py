"""A Spark cluster's UI through the Jupyter server: ``{base_url}cloudtik/spark/NAME/``.

The same handler as the Dask dashboard (``api/dashboard.py``: the server's login, the
``cloudtik`` authorization, the caller's own clusters only, a 404 for a gone cluster, no
kernel token, no credentials passed on), pointed at the Spark master's web UI.

One target serves every UI of the cluster: the nodes run with ``spark.ui.reverseProxy``
on, so the master relays its workers' UIs (``/proxy/<worker id>/``) and every running
application's UI (``/proxy/<app id>/``, the driver's port 4040 in the kernel).  Spark's
pages link and redirect with server-relative paths (``/static/…``, ``/proxy/<id>/…``,
``setUIRoot('/proxy/<id>')``; the master's proxy answers redirects with its own origin).
Spark could prefix them itself (``spark.ui.reverseProxyUrl``), but only with a prefix fixed
when the master starts, and the path under which a cluster is seen depends on the server
that shows it (a JupyterLab, a hub user's server, the hub sidekick) and a cluster may be
started before any server.  So this handler asks Spark for plain root-relative pages (no
``X-Forwarded-Context``, which Spark would combine with its own ``proxyBase``) and puts
this route's prefix in front of those paths in the HTML and in redirects.

The target is the UI address the head recorded, and the master there must answer its JSON
(``/json/``) with the master URL recorded for the cluster, so a recycled port is never
proxied to.  A master UI behind a head's mutual-TLS relay (Huawei Cloud:
``extra.spark.ui_tls_address``, the port of the Dask dashboard's relay) is reached over
HTTPS with the cluster's client certificate, offering ALPN ``cloudtik-spark`` so the relay
passes the connection to the master's UI (``runtime/tls.py`` ``SPARK_UI_ALPN``); a
browser holds no such certificate, so this route is its only way in.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.utils import url_path_join
from tornado import web

from ..runtime.base import RuntimeUnreachable, http_json
from ..runtime.tls import SPARK_UI_ALPN
from .dashboard import VERIFY_TTL, DashboardGone, DashboardHandler, Target, client_context

SPARK_UI_PREFIX = "cloudtik/spark"
#: what jupyter-server-proxy adds and Spark would use as (part of) its link prefix
#: (``UIUtils.uiRoot`` reads ``X-Forwarded-Context``)
CONTEXT_HEADERS = ("X-Forwarded-Context", "X-ProxyContextPath", "X-Forwarded-Prefix")
_LINK = re.compile(rb"""((?:href|src|action)\s*=\s*["'])/(?!/)""")
_UI_ROOT = re.compile(rb"""(setUIRoot\(\s*['"])""")

# cluster name -> (checked at, UI address, master URL)
_verified: dict[str, tuple[float, str, str]] = {}


def spark_ui_prefix(base_url: str) -> str:
    """``{base_url}cloudtik/spark/``: where every Spark cluster's UI is served."""
    return url_path_join(base_url, SPARK_UI_PREFIX) + "/"


def _master_url_at(ui: str, context: ssl.SSLContext | None = None) -> str | None:
    try:
        return (http_json(ui.rstrip("/") + "/json/", timeout=10,
                          context=context) or {}).get("url")
    except (RuntimeUnreachable, LookupError, AttributeError):
        return None


async def verified_spark_target(view: Any, name: str) -> Target:
    """(host, port, "") of cluster ``name``'s Spark master UI, checked to be its own (and
    the ``SSLContext`` with the cluster's client certificate when it is behind a relay)."""
    info = view.get(name)  # 404 when missing or not the caller's
    if info.state in ("stopped", "stopping", "failed"):
        _verified.pop(name, None)
        raise DashboardGone(name, f"the cluster is {info.state}")
    facts = ((info.connect_info or {}).get("extra") or {}).get("spark") or {}
    cached = _verified.get(name)
    fresh = cached is not None and time.monotonic() - cached[0] <= VERIFY_TTL
    ui, master = facts.get("ui_tls_address") or facts.get("ui"), facts.get("master_url")
    if not ui and fresh:  # the head's record is being rewritten: the last check stands
        ui, master = cached[1], cached[2]  # type: ignore[index]
    parts = urlsplit(ui or "")
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port \
            or not master:
        raise DashboardGone(name, "no Spark master UI is recorded")
    context = (client_context(view, info, alpn=SPARK_UI_ALPN) if parts.scheme == "https"
               else None)
    if not (fresh and cached[1] == ui and cached[2] == master):  # type: ignore[index]
        seen = await asyncio.to_thread(_master_url_at, ui, context)
        if seen != master:
            _verified.pop(name, None)
            raise DashboardGone(name, f"{ui} does not answer as Spark master {master} "
                                      f"(it says {seen or 'nothing'})")
        _verified[name] = (time.monotonic(), ui, master)
    target = Target((parts.hostname, parts.port, ""))
    target.ssl = context
    return target


class SparkUIHandler(DashboardHandler):
    """``{base_url}cloudtik/spark/NAME/PATH``: PATH of cluster NAME's Spark UI."""

    route = SPARK_UI_PREFIX
    home_page = ""

    def initialize(self) -> None:
        super().initialize()
        # a plain function: jupyter-server-proxy passes the arguments it names
        def rewrite(response: Any, host: str, port: int) -> None:
            self._rewrite(response, host, port)

        self.rewrite_response = (rewrite,)

    async def resolve_target(self, view: Any, name: str) -> tuple[str, int, str]:
        return await verified_spark_target(view, name)

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        await super().prepare(*args, **kwargs)
        self._check_path()

    def _check_path(self) -> None:
        """400 for a path that is none of Spark's pages: empty, ``.`` or ``..`` segments, a
        backslash or an encoded slash (``//host/…``, ``http://host/…``, ``..%2F``).
        Spark's own links never have them, and an upstream that normalises a path or reads
        ``//host`` as a network path must not be handed one (Dask's dashboard, whose worker
        pages name ``tls://`` addresses, keeps its own route without this check)."""
        path = self.path_kwargs.get("proxied_path") or ""
        segments = path.split("/")[1:]
        raw = self.request.path.lower()
        if "" in segments[:-1] or any(s in (".", "..") for s in segments) or "\\" in path \
                or "%2f" in raw or "%5c" in raw:
            raise web.HTTPError(400, f"proxied path {path!r}: not a Spark UI page (empty, "
                                     "'.' or '..' segments, backslashes and encoded slashes "
                                     "are refused)")

    def _build_proxy_request(self, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        req = super()._build_proxy_request(host, port, *args, **kwargs)
        for h in CONTEXT_HEADERS:
            req.headers.pop(h, None)
        # the master's proxy builds redirects from the Host it is sent: its own, which
        # _rewrite recognises (this server's would look like a page outside the route)
        req.headers["Host"] = f"{host}:{port}"
        # pages are rewritten: ask for them uncompressed (Spark gzips otherwise)
        req.headers["Accept-Encoding"] = "identity"
        return req

    def _rewrite(self, response: Any, host: str, port: int) -> None:
        """Root-relative links and redirects of Spark's pages, under this route."""
        prefix = self._get_context_path(host, port).encode()
        location = response.headers.get("Location")
        if location:
            # the master's proxy redirects with its own origin: keep the path, which
            # jupyter-server-proxy then puts under this route
            parts = urlsplit(location)
            if parts.hostname in (host, "localhost", "127.0.0.1") and parts.port == port:
                response.headers["Location"] = (parts.path or "/") + (
                    "?" + parts.query if parts.query else "")
        if "text/html" in (response.headers.get("Content-Type") or "") and response.body:
            body = _LINK.sub(lambda m: m.group(1) + prefix + b"/", response.body)
            response.body = _UI_ROOT.sub(lambda m: m.group(1) + prefix, body)


def spark_ui_routes(base_url: str) -> list[tuple[str, Any]]:
    """The Spark UI route of a server (or the hub sidekick) at ``base_url``."""
    return [(spark_ui_prefix(base_url).rstrip("/") + r"/(?P<name>[^/]+)(?P<proxied_path>/.*)?",
             SparkUIHandler)]
