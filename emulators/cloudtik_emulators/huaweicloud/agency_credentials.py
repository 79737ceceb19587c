"""Temporary agency credentials, as the metadata service of a real ECS server hands out.

A server created with ``metadata.agency_name`` can read temporary AK/SK and a security
token at ``http://169.254.169.254/openstack/latest/securitykey`` ("Obtaining Metadata",
ECS user guide: https://support.huaweicloud.com/intl/en-us/usermanual-ecs/ecs_03_0166.html;
the answer is ``{"credential": {"access", "secret", "securitytoken", "expires_at"}}``).
OBS accepts them only with the token in ``x-obs-security-token`` ("Authentication of
Signature in a Header", OBS API reference:
https://support.huaweicloud.com/intl/en-us/api-obs/obs_04_0010.html), and refuses them
once expired: 403 ``InvalidAccessKeyId`` "The security token is invalid", whose causes
include "the security token provided in the request has expired" (OBS error code
reference, https://support.huaweicloud.com/intl/es-us/api-obs/obs_errorcode_0009.html);
without the token 403 ``AccessDenied``.  A server without an agency gets 404, as on the
real service.  Nodes use these, never the account's keys, and fetch new ones before
``expires_at`` (userdata.py's ``Agency``).

Real temporary credentials last 15 minutes to 24 hours ("Access Keys (AK/SK)", OBS
product description); tests shorten them (``POST /_emulator/options
{"credential_seconds": 4}``) so that the nodes' refresh is exercised.
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone
from typing import Any

import tornado.web

from .errors import ApiError

VALID_SECONDS = 3600
RENEW_BEFORE = 600
#: expired credentials are remembered this long (refused as expired, not as unknown)
FORGET_AFTER = 3600


def lifetime(emu: Any) -> float:
    return float(getattr(getattr(emu, "cloud", None), "credential_seconds", VALID_SECONDS))


def issue_temporary_credential(emu: Any, server: dict[str, Any]) -> dict[str, Any]:
    agency = (server.get("metadata") or {}).get("agency_name")
    if not agency:
        raise tornado.web.HTTPError(404)
    now = time.time()
    valid = lifetime(emu)
    # the service hands out the same credential until it nears its end, then a new one
    renew_before = min(RENEW_BEFORE, valid / 2)
    for ak, c in list(emu.temporary_credentials.items()):
        if c["expires"] < now - FORGET_AFTER:
            del emu.temporary_credentials[ak]
        elif c["server"] == server["id"] and c["expires"] - now > renew_before:
            return _view(ak, c)
    ak = "T" + secrets.token_hex(9).upper()
    c = {"secret": secrets.token_urlsafe(30), "token": secrets.token_urlsafe(96),
         "expires": now + valid, "agency": agency, "server": server["id"]}
    emu.temporary_credentials[ak] = c
    return _view(ak, c)


def _view(ak: str, c: dict[str, Any]) -> dict[str, Any]:
    expires = datetime.fromtimestamp(c["expires"], timezone.utc)
    return {"credential": {"access": ak, "secret": c["secret"], "securitytoken": c["token"],
                           "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def check_temporary_credential(emu: Any, ak: str, headers: dict[str, str]) -> None:
    """Refuse a temporary AK without its token, with another's token, or expired."""
    c = emu.temporary_credentials.get(ak)
    if c is None:
        return  # the account's own key
    if c["expires"] < time.time():
        raise ApiError(403, "InvalidAccessKeyId", "The security token is invalid.", "obs")
    if not secrets.compare_digest(headers.get("x-obs-security-token", ""), c["token"]):
        raise ApiError(403, "InvalidSecurityToken" if headers.get("x-obs-security-token")
                       else "AccessDenied", "The security token included in the request "
                       "is invalid" if headers.get("x-obs-security-token") else
                       "Access Denied", "obs")
