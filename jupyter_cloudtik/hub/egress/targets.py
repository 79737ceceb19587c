"""What a request names and how the proxy refuses it: the authority a client connected to
(host and port, validated and normalised), the checks on a request head that carries a
secret, and the plain-text error responses.  Pure functions of their input, shared by the
add-on's CONNECT and request paths."""

from __future__ import annotations

import ipaddress
import re

from mitmproxy import http

from .rules import normalize_host

__all__ = ["TLS_PORT", "Refused", "check_head", "error_response", "format_authority",
           "parse_authority", "same_origin", "valid_host"]

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]{0,252})$")
# control characters (HTAB allowed in values) and DEL: never in a head that carries a secret
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET_BAD = re.compile(r"[\x00-\x20\x7f]")
# the port of TLS: a rule for it is a rule for HTTPS, never sent over plain http://
TLS_PORT = 443


class Refused(Exception):
    """A request the proxy answers itself: ``status`` and a one-line ``text`` (never a
    secret)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def valid_host(host: str) -> str:
    h = normalize_host(host)
    if not h:
        raise Refused(400, "empty host in request target")
    try:
        ipaddress.ip_address(h)
        return h
    except ValueError:
        pass
    if not h.isascii() or not _HOSTNAME.match(h) or ".." in h:
        raise Refused(400, "invalid host in request target")
    return h


def parse_authority(authority: str, default_port: int) -> tuple[str, int]:
    a = authority.strip()
    if a.startswith("["):
        end = a.find("]")
        if end < 0 or (a[end + 1:] and not a[end + 1:].startswith(":")):
            raise Refused(400, "malformed IPv6 authority")
        host, port_s = a[1:end], a[end + 2:]
    else:
        host, _, port_s = a.partition(":")
    if port_s:
        # ASCII digits only: int() takes other scripts' digits, we do not
        if not (port_s.isascii() and port_s.isdigit()) or not 0 < int(port_s) < 65536:
            raise Refused(400, "invalid port in authority")
        port = int(port_s)
    else:
        port = default_port
    return valid_host(host), port


def same_origin(host_header: str, host: str, port: int) -> bool:
    try:
        return parse_authority(host_header, port) == (host, port)
    except Refused:
        return False


def format_authority(host: str, port: int, default: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return h if port == default else f"{h}:{port}"


def _reason_text(status: int) -> str:
    return http.status_codes.RESPONSES.get(status, "Error")


def error_response(status: int, text: str, extra: dict[str, str] | None = None) -> http.Response:
    body = f"{status} {_reason_text(status)}: {text}\n"
    headers = {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"}
    headers.update(extra or {})
    return http.Response.make(status, body, headers)


def check_head(req: http.Request) -> None:
    """A request head that may be given a secret: no control character or space in its
    target, a token for its method and field names, no control character in a value."""
    if _TARGET_BAD.search(req.path):
        raise Refused(400, "control character or space in the request target")
    if not _TOKEN.match(req.method):
        raise Refused(400, "malformed request method")
    for name, value in req.headers.fields:
        if not _TOKEN.match(name.decode("latin-1")) or _CTL.search(value):
            raise Refused(400, "malformed header field")
