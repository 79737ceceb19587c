"""Passing one HTTP request on to another server and its answer back: used where this
server answers for another (a user's server for the hub sidekick; the sidekick for a
user's side-kick service).  Event streams are passed on as they arrive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tornado import httpclient, web

# hop-by-hop headers, and the caller's credentials for *this* server
NOT_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "cookie", "authorization",
    "x-xsrftoken"})
NOT_RETURNED = NOT_FORWARDED | {"set-cookie", "server", "date"}


def request_headers(handler: Any, extra: dict[str, str],
                    drop: frozenset[str] = frozenset()) -> dict[str, str]:
    headers = {k: v for k, v in handler.request.headers.get_all()
               if k.lower() not in NOT_FORWARDED and k.lower() not in drop}
    headers.update(extra)
    return headers


async def forward(handler: Any, url: str, headers: dict[str, str], *, unavailable: str,
                  timeout: float = 600,
                  header_value: Callable[[str, str], str] = lambda k, v: v,
                  body: bytes | None = None) -> None:
    """Send ``handler``'s request to ``url`` and write the answer as ``handler``'s.

    ``unavailable`` is the 502 message when nothing answered; ``header_value`` may rewrite
    an answer header (e.g. a Location under another prefix); ``body`` replaces the
    request's body."""
    request = handler.request
    if request.query:
        url += "?" + request.query
    streaming = "text/event-stream" in request.headers.get("Accept", "")
    started = False

    def add(name: str, value: str) -> None:
        if name.lower() not in NOT_RETURNED:
            handler.add_header(name, header_value(name, value))

    def on_chunk(chunk: bytes) -> None:
        nonlocal started
        started = True
        handler.write(chunk)
        handler.flush()

    def on_header(line: str) -> None:
        line = line.strip()
        if line.startswith("HTTP/"):
            parts = line.split(" ", 2)
            handler.set_status(int(parts[1]), parts[2] if len(parts) > 2 else None)
            handler.clear_header("Content-Type")
        elif ":" in line:
            name, _, value = line.partition(":")
            add(name.strip(), value.strip())

    if body is None:
        body = request.body if request.method in ("POST", "PUT", "PATCH") else None
    req = httpclient.HTTPRequest(
        url, method=request.method, headers=headers, body=body, follow_redirects=False,
        allow_nonstandard_methods=True, request_timeout=0 if streaming else timeout,
        connect_timeout=20, streaming_callback=on_chunk if streaming else None,
        header_callback=on_header if streaming else None)
    try:
        resp = await httpclient.AsyncHTTPClient().fetch(req, raise_error=False)
    except Exception:
        resp = None
    if resp is None or resp.code == 599:
        if not started:
            raise web.HTTPError(502, unavailable)
    elif not streaming:
        handler.set_status(resp.code, resp.reason)
        handler.clear_header("Content-Type")
        for name, value in resp.headers.get_all():
            add(name, value)
        handler.write(resp.body or b"")
    handler.finish()
