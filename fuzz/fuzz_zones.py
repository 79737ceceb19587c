"""What a zone service (placement/zones.py) reads from the network: sealed hints (Fernet
tokens a zone issued from ``select`` and gets back in ``boot``), the request every
``select``/``boot`` body carries (offers.py ``Request.from_dict``) and JSON filter
queries (placement/jsonfilter.py), which users write.

Properties: a hint this zone did not seal — any text, or a real hint with any byte changed —
is a ``HintRefused`` naming ``hint``, never another error and never a payload; a request is
a ``Request`` or a ``ConfigError`` naming the field, and an accepted one reads back the same
from its own ``to_dict()`` and has a digest; a query compiles or is a ``ConfigError``, and a
compiled one answers True/False for an offer without raising.
"""

from __future__ import annotations

import json
import tempfile

from _harness import choose, instrumented, main, text

with instrumented():
    from cryptography.fernet import Fernet

    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.offers import Offer, Request, VirtualState
    from jupyter_cloudtik.placement.jsonfilter import compile_query
    from jupyter_cloudtik.placement.zones import HintRefused, ZoneKeys

KEYS = ZoneKeys(tempfile.mkdtemp(prefix="fuzz-zones-"), Fernet.generate_key().decode())
PAYLOAD = {"v": 1, "zone": "z", "offer": "local/a", "count": 2, "req": "abc", "id": "1"}
SEALED = KEYS.seal(PAYLOAD)
OFFER = Offer(key="local/a", provider="local", region="r", availability_zone="az1",
              flavor="f", price_per_hour=0.5, total={"CPU": 8.0, "memory": 2.0**34},
              free={"CPU": 4.0, "memory": 2.0**33}, capabilities={"gpu": {"model": "x"}})
STATE = VirtualState(Request(count=1, resources={"CPU": 1}))


def _json(data: bytes):
    try:
        return json.loads(text(data))
    except (ValueError, RecursionError):
        return None


def one(data: bytes) -> None:
    which, rest = choose(data, 4)
    if which == 0:  # any text as a hint
        try:
            KEYS.open(text(rest), 300)
        except HintRefused as e:
            assert e.field == "hint", e.field
            return
        raise AssertionError("a hint this zone never sealed was opened")
    if which == 1:  # a real hint, altered
        token = bytearray(SEALED.encode())
        for i in range(0, len(rest) - 1, 2):
            token[rest[i] % len(token)] ^= rest[i + 1]
        altered = token.decode("latin-1")
        try:
            payload = KEYS.open(altered, 300)
        except HintRefused as e:
            assert e.field == "hint", e.field
            return
        # base64's padding bits may change without changing the token's bytes
        assert payload == PAYLOAD, payload
        return
    doc = _json(rest)
    if which == 2:
        try:
            req = Request.from_dict(doc)
        except ConfigError as e:
            assert e.field, e
            return
        assert Request.from_dict(req.to_dict()) == req
        req.digest()
        req.describe()
        return
    try:
        fn = compile_query(doc)
    except ConfigError as e:
        assert e.field, e
        return
    assert fn(OFFER, STATE) in (True, False)


if __name__ == "__main__":
    main(one)
