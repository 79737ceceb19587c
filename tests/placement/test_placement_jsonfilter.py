"""The JSON filter's grammar: what it accepts, what it computes, how it refuses."""

from __future__ import annotations

import pytest
from placement_helpers import GIB, host

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.placement import Request, VirtualState
from jupyter_cloudtik.placement.jsonfilter import compile_query

REQ = Request(count=1, resources={"CPU": 1})


def ev(query, offer=None):
    offer = offer or host("h1", 8, 16, free_cpus=6, free_gib=4, availability_zone="az1",
                          capabilities={"arch": "x86_64", "gpu": {"model": "A100"}},
                          price_per_hour=0.5)
    return compile_query(query)(offer, VirtualState(REQ))


@pytest.mark.parametrize("query, expected", [
    (["=", "$availability_zone", "az1"], True),
    (["=", "$availability_zone", "az2"], False),
    ([">=", "$free_ram_mb", 4096], True),
    ([">", "$free_ram_mb", 4096], False),
    (["<", "$free_cpus", 7], True),
    (["<=", "$price_per_hour", 0.5], True),
    (["in", "$capabilities.arch", "aarch64", "x86_64"], True),
    (["in", "$capabilities.arch", "aarch64"], False),
    (["=", "$capabilities.gpu.model", "A100"], True),
    (["not", ["=", "$capabilities.gpu.model", "A100"]], False),
    (["and", [">=", "$free_cpus", 2], ["=", "$spot", False]], True),
    (["or", ["=", "$spot", True], ["<", "$total_cpus", 4]], False),
    (["or", ["=", "$spot", True], ["=", "$provider", "test"]], True),
    # a missing capability never qualifies, whatever the comparison
    (["=", "$capabilities.nvme", "yes"], False),
    (["not", ["=", "$capabilities.nvme", "yes"]], True),
    ([">", "$capabilities.nvme", 0], False),
    # text and numbers do not order; booleans are not numbers
    ([">", "$availability_zone", 3], False),
    (["=", "$spot", 0], False),
    # variable on both sides
    ([">", "$total_cpus", "$free_cpus"], True),
])
def test_queries(query, expected):
    assert ev(query) is expected


def test_json_text_is_accepted():
    assert ev('[">=", "$free_ram_mb", 1024]') is True


def test_free_values_follow_virtual_depletion():
    offer = host("h", 8, 16)
    state = VirtualState(Request(count=4, resources={"CPU": 2, "memory": 4 * GIB}))
    fn = compile_query([">=", "$free_cpus", 4])
    assert fn(offer, state)
    state.place(offer)
    state.place(offer)
    assert fn(offer, state)  # 4 left
    state.place(offer)
    assert not fn(offer, state)  # 2 left


@pytest.mark.parametrize("query, field, words", [
    ("[>=", "query", "not valid JSON"),
    ({"op": "="}, "query", "is a list"),
    ([], "query", "empty list"),
    (["~", "$free_cpus", 1], "query[0]", "not an operator"),
    (["and", ["=", "$free_cpus"]], "query[1]", "exactly 2 arguments"),
    (["and", ["=", "$free_cpus", 1], [">", "$nope", 1]], "query[2][1]", "unknown variable"),
    (["not", ["=", "$spot", True], ["=", "$spot", False]], "query", "exactly 1 argument"),
    (["or"], "query", "at least 1 argument"),
    (["in", "$arch"], "query", "at least one candidate"),
    (["=", "$capabilities.", 1], "query[1]", "empty part"),
    (["=", "$arch", {"x": 1}], "query[2]", "is an object"),
    (["and", ["or", ["=", "$arch", "x"], [5, 1]]], "query[1][2][0]", "not an operator"),
])
def test_malformed_queries_name_the_bad_part(query, field, words):
    with pytest.raises(ConfigError) as e:
        compile_query(query)
    assert e.value.field == field
    assert words in e.value.message
    assert e.value.message.startswith(field)


def test_unknown_variable_lists_known_ones():
    with pytest.raises(ConfigError) as e:
        compile_query(["=", "$free_ram", 1])
    assert "$free_ram_mb" in e.value.message and "$capabilities.NAME" in e.value.message
