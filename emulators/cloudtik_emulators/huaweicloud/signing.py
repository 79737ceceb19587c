"""Checking request signatures the way Huawei Cloud's API gateway and OBS do.

Written from the published algorithms, not by calling the SDK's signer, so that a request
the SDK signs wrongly is refused here as it would be by the real service.

* API gateway (every service but OBS): ``Authorization: SDK-HMAC-SHA256 Access=AK,
  SignedHeaders=a;b, Signature=HEX`` over a canonical request, with ``X-Sdk-Date``.
* OBS: ``Authorization: OBS AK:BASE64`` — HMAC-SHA1 over the V2 canonical string.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from datetime import datetime, timezone
from urllib.parse import quote, unquote

SDK_ALGORITHM = "SDK-HMAC-SHA256"
MAX_CLOCK_SKEW = 15 * 60  # seconds, as the gateway allows
_AUTH_RE = re.compile(
    r"^SDK-HMAC-SHA256\s+Access=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9a-f]+)$"
)
OBS_SUBRESOURCES = {
    "acl", "policy", "location", "storageinfo", "quota", "storagepolicy", "versions",
    "versioning", "versionid", "uploads", "uploadid", "partnumber", "website",
    "notification", "lifecycle", "deletebucket", "delete", "cors", "restore", "tagging",
    "replication", "metadata", "encryption", "fileinterface",
}


class SignatureError(Exception):
    """Why a request's signature was refused (the message is what the client sees)."""


def _enc(text: str) -> str:
    return quote(text, safe="~")


def canonical_uri(path: str) -> str:
    parts = [_enc(p) for p in unquote(path).split("/")]
    uri = "/".join(parts)
    return uri if uri.endswith("/") else uri + "/"


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{_enc(k)}={_enc(v)}" for k, v in sorted(pairs))


def verify_sdk_signature(
    method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
    body: bytes, secrets: dict[str, str], now: datetime | None = None,
) -> str:
    """Return the access key of a correctly signed request, else raise SignatureError."""
    auth = headers.get("authorization", "")
    m = _AUTH_RE.match(auth.strip())
    if not m:
        raise SignatureError("the Authorization header is missing or not SDK-HMAC-SHA256")
    ak, signed, signature = m.groups()
    sk = secrets.get(ak)
    if sk is None:
        raise SignatureError("the access key is unknown")
    date = headers.get("x-sdk-date")
    if not date:
        raise SignatureError("the X-Sdk-Date header is missing")
    try:
        when = datetime.strptime(date, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise SignatureError("the X-Sdk-Date header is malformed") from None
    now = now or datetime.now(timezone.utc)
    if abs((now - when).total_seconds()) > MAX_CLOCK_SKEW:
        raise SignatureError("the request time differs from the server time by more than 15 min")
    names = signed.split(";")
    if names != sorted(names) or ("host" not in names and "x-sdk-date" not in names):
        raise SignatureError("SignedHeaders is not sorted or signs neither host nor date")
    canonical_headers = "".join(f"{n}:{headers.get(n, '').strip()}\n" for n in names)
    payload = headers.get("x-sdk-content-sha256") or hashlib.sha256(body or b"").hexdigest()
    creq = "\n".join([method.upper(), canonical_uri(path), canonical_query(query),
                      canonical_headers, signed, payload])
    to_sign = f"{SDK_ALGORITHM}\n{date}\n{hashlib.sha256(creq.encode()).hexdigest()}"
    expected = hmac.new(sk.encode(), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):  # ASCII: the regex
        raise SignatureError("verify aksk signature fail")
    return ak


def verify_obs_signature(
    method: str, bucket: str | None, key: str, query: list[tuple[str, str]],
    headers: dict[str, str], secrets: dict[str, str],
) -> str:
    """Return the access key of a correctly signed OBS request, else raise SignatureError."""
    auth = headers.get("authorization", "")
    if not auth.startswith("OBS ") or ":" not in auth:
        raise SignatureError("the Authorization header is missing or not OBS")
    ak, signature = auth[4:].rsplit(":", 1)
    sk = secrets.get(ak)
    if sk is None:
        raise SignatureError("the access key is unknown")
    interesting = {k: v for k, v in headers.items()
                   if k in ("content-type", "content-md5", "date") or k.startswith("x-obs-")}
    if "x-obs-date" in interesting:
        interesting["date"] = ""
    interesting.setdefault("content-type", "")
    interesting.setdefault("content-md5", "")
    parts = [method.upper() + "\n"]
    for k in sorted(interesting):
        v = interesting[k]
        if k.startswith("x-obs-"):
            parts.append(f"{k}:{v.strip() if k.startswith('x-obs-meta-') else v}\n")
        else:
            parts.append(f"{v}\n")
    uri = f"/{bucket}/" if bucket else ""
    if key:
        uri = (uri if uri.endswith("/") else uri + "/") + key
    parts.append(uri or "/")
    sub = sorted((k, v) for k, v in query if k.lower() in OBS_SUBRESOURCES)
    if sub:
        parts.append("?" + "&".join(f"{k}={v}" if v else k for k, v in sub))
    canonical = "".join(parts)
    digest = hmac.new(sk.encode(), canonical.encode(), hashlib.sha1).digest()
    # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500)
    if not hmac.compare_digest(base64.b64encode(digest),
                               signature.encode("utf-8", "surrogateescape")):
        raise SignatureError("The request signature we calculated does not match")
    return ak
