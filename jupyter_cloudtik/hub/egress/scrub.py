"""Keep injected values out of what the client receives.

A rule's value goes to the upstream, and the client is the one party that must never see
it; yet some upstreams send the request back: ``TRACE`` (its purpose), echo and debug
endpoints, error pages that quote a header, redirects that copy it into ``Location``.  The
proxy therefore (``addon.py``):

* refuses the reflecting methods (``TRACE``, ``TRACK``) wherever a rule would apply;
* asks the upstream of a credentialed request for an unencoded body
  (``Accept-Encoding: identity``) and decodes it here when the upstream encodes anyway;
* replaces, in the response's headers, body, trailers and WebSocket messages, every
  occurrence of an injected value in the forms an echo takes (as sent, JSON-escaped,
  percent-encoded, HTML-escaped, base64) by as many ``*``: lengths stay the same, so a
  ``Content-Length`` stays true.

What no proxy can know: an upstream that transforms the value in another way (encrypts it,
hashes it, reverses it, sends a part of it) before it sends it back.
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

__all__ = ["REFLECTING_METHODS", "BodyScrubber", "decoder_for", "needles", "scrub"]

# methods whose purpose is to send the request back (RFC 9110 9.3.8; TRACK: IIS's own)
REFLECTING_METHODS = frozenset({"TRACE", "TRACK"})
MASK = 0x2A  # "*"


def needles(values: Iterable[str]) -> tuple[bytes, ...]:
    """Every form of each value an echo may take, longest first."""
    out: set[bytes] = set()
    for v in values:
        forms = {v, json.dumps(v)[1:-1], json.dumps(v)[1:-1].replace("/", "\\/"),
                 json.dumps(v, ensure_ascii=False)[1:-1], quote(v, safe=""), quote_plus(v),
                 quote(v, safe="/:"), html.escape(v, quote=True),
                 html.escape(v, quote=True).replace("&#x27;", "&#39;")}
        for f in list(forms):
            if "%" in f:
                forms.add(_lower_escapes(f))
        encoded = {f.encode("latin-1", "ignore") for f in forms} | {
            f.encode("utf-8") for f in forms}
        raw = v.encode("latin-1")
        for b64 in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
            encoded |= {b64, b64.rstrip(b"=")}
        out |= {e for e in encoded if len(e) >= 4}
    return tuple(sorted(out, key=len, reverse=True))


def _lower_escapes(text: str) -> str:
    parts = text.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


def scrub(data: bytes, forms: tuple[bytes, ...]) -> tuple[bytes, int]:
    """``data`` with every form masked, and how many were."""
    count = 0
    for n in forms:
        if n in data:
            count += data.count(n)
            data = data.replace(n, bytes([MASK]) * len(n))
    return data, count


class BodyScrubber:
    """A streaming ``scrub`` (mitmproxy's ``response.stream`` callable): holds back only
    the end of a chunk that could be the start of a form, so streamed answers (events,
    logs) are not delayed, and no form is missed where it spans two chunks."""

    def __init__(self, forms: tuple[bytes, ...], decoder: _Decoder | None = None) -> None:
        self.forms = forms
        self.decoder = decoder
        self.held = b""
        self.count = 0

    def __call__(self, data: bytes) -> list[bytes]:
        final = data == b""
        if self.decoder is not None:
            data = self.decoder.feed(data, final)
        buf, n = scrub(self.held + data, self.forms)
        self.count += n
        keep = 0 if final else self._partial(buf)
        self.held = buf[len(buf) - keep:] if keep else b""
        out = buf[:len(buf) - keep] if keep else buf
        # an empty chunk would end a chunked response early: send none instead
        return [out] if out else []

    def _partial(self, buf: bytes) -> int:
        """The length of the longest end of ``buf`` that begins some form."""
        longest = len(self.forms[0]) - 1 if self.forms else 0
        start = max(0, len(buf) - longest)
        tail = buf[start:]
        best = 0
        for f in self.forms:
            i = tail.find(f[:1], max(0, len(tail) - len(f) + 1))
            while i >= 0 and len(tail) - i > best:
                if f.startswith(tail[i:]):
                    best = len(tail) - i
                    break
                i = tail.find(f[:1], i + 1)
        return best


class _Decoder:
    """Incremental decoding of one content coding, output bounded per input chunk."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._obj = None
        if coding in ("gzip", "x-gzip"):
            self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "br":
            import brotli  # mitmproxy's dependency, in the proxy's environment

            self._obj = brotli.Decompressor()
        elif coding == "zstd":
            import zstandard

            self._obj = zstandard.ZstdDecompressor().decompressobj()
        elif coding != "deflate":
            raise ValueError(coding)

    def feed(self, data: bytes, final: bool) -> bytes:
        if self._obj is None:  # deflate: zlib-wrapped as RFC 9110 says, raw as some send
            raw = data[:1] and (data[0] & 0x0F) != 8
            self._obj = zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
        if self.coding == "br":
            out = self._obj.process(data) if data else b""
        else:
            out = self._obj.decompress(data) if data else b""
            if final and hasattr(self._obj, "flush"):
                out += self._obj.flush()
        return out


def decoder_for(content_encoding: str) -> _Decoder | None:
    """A decoder for a response's ``Content-Encoding`` (None: not encoded); ValueError for
    one the proxy cannot read (then it cannot check the body, and refuses it)."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) > 1:
        raise ValueError(content_encoding)
    return _Decoder(codings[0])
