"""The pure parts of the egress proxy's path decision and echo masking (the proxy itself
against real servers: test_egress_readings.py)."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from jupyter_cloudtik.hub.egress.rules import Rule, RuleSet, read_path
from jupyter_cloudtik.hub.egress.scrub import BodyScrubber, decoder_for, needles, scrub

VALUE = 'Bearer s3cr3t/"value"+x'


@pytest.mark.parametrize("path", [
    "/api/x", "/api/a%2Fb", "/api/x;v=1/y", "/api//x", "/api/%C3%A9t%C3%A9", "/api/x?a=/../b"])
def test_plain_paths_have_one_reading(path):
    assert read_path(path).why is None


@pytest.mark.parametrize("path", [
    "/api/../x", "/api/.%2e/x", "/api/..;/x", "/api/x%2F..%2F..%2Fx", "/api\\..\\x",
    "/api/%252e%252e/x", "/api/%c0%ae%c0%ae/x", "/api/x#/../../x", "/api/%u002e%u002e/x",
    "/api/%ef%bc%8e%ef%bc%8e/x", "/api/.../x", "/api/..%20/x", "/api/%00/../"])
def test_paths_servers_read_differently_are_flagged(path):
    assert read_path(path).why


def test_a_narrow_rule_refuses_an_ambiguous_path_and_a_host_rule_applies():
    narrow = Rule(id="n", host="h.org", header="A", value="v1", path_prefix="/api/",
                  users=("*",))
    broad = Rule(id="b", host="h.org", header="B", value="v2", users=("*",))
    rs = RuleSet([narrow, broad])
    d = rs.decide("u", (), "h.org", 443, "/api/..;/admin")
    assert d.refused_by == (narrow,) and "path parameter" in d.refusal()
    d = rs.decide("u", (), "h.org", 443, "/x/..;/y")
    assert d.rules == (broad,) and not d.refused_by
    assert rs.decide("u", (), "h.org", 443, "/api/ok").rules == (narrow, broad)


@pytest.mark.parametrize("prefix", ["/api/../x", "/a;b", "/a%2fb", "/a//b", "/a\\b", "/é",
                                    "/a#b", "/a b"])
def test_rule_prefixes_must_be_plain(prefix):
    with pytest.raises(ValueError, match="path_prefix"):
        Rule(id="r", host="h.org", header="A", value="v", path_prefix=prefix)


def _stream(scrubber: BodyScrubber, data: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for n in sizes:
        out += b"".join(scrubber(data[i:i + n]))
        i += n
    out += b"".join(scrubber(data[i:]))
    return out + b"".join(scrubber(b""))


def test_every_echoed_form_is_masked_at_any_chunking():
    forms = needles([VALUE])
    body = b" | ".join(forms) + b" tail"
    rnd = random.Random(7)
    for _ in range(200):
        sizes = [rnd.randint(1, 9) for _ in range(rnd.randint(1, 40))]
        out = _stream(BodyScrubber(forms), body, sizes)
        assert len(out) == len(body)  # Content-Length stays true
        assert all(f not in out for f in forms)
        assert out.endswith(b" tail")


def test_chunks_that_cannot_start_a_form_are_not_held_back():
    s = BodyScrubber(needles([VALUE]))
    assert s(b"data: event one\n\n") == [b"data: event one\n\n"]
    assert s(b"x Bear") == [b"x "] and s(b"ing") == [b"Bearing"]


@pytest.mark.parametrize("coding,encode", [
    ("gzip", gzip.compress), ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4])])  # raw deflate, as some servers send
def test_encoded_bodies_are_decoded_then_masked(coding, encode):
    data = encode(b"{'echo': '" + VALUE.encode() + b"'}")
    out = _stream(BodyScrubber(needles([VALUE]), decoder_for(coding)), data, [5, 3])
    assert VALUE.encode() not in out and b"'echo'" in out


def test_an_unreadable_coding_is_refused():
    for coding in ("compress", "gzip, br", "x-custom"):
        with pytest.raises(ValueError):
            decoder_for(coding)
    assert decoder_for("identity") is None and decoder_for("") is None


def test_header_values_are_masked():
    value, n = scrub(b"/login?next=" + VALUE.encode(), needles([VALUE]))
    assert n == 1 and VALUE.encode() not in value
