"""One test per bug the fuzz targets (fuzz/, docs/security.md#fuzzing) found, or that
writing them turned up: each input once raised something other than the documented error
(a 500 through the REST API, a crash of a poll or of ``%hpc limits``).  The same inputs are
seeds of the targets (fuzz/corpus/*/regress-*), so every fuzz run replays them too."""

from __future__ import annotations

import math

import pytest

from jupyter_cloudtik.core.errors import ConfigError


# --- values ------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["9" * 400 + ":00", "9" * 5000, "9" * 30 + "d"])
def test_duration_too_long_is_a_config_error(text):
    from jupyter_cloudtik.core.units import parse_duration

    with pytest.raises(ConfigError) as e:  # was OverflowError / ValueError / inf
        parse_duration(text, field="walltime")
    assert e.value.field == "walltime"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_duration_nan_and_inf_are_refused(value):
    from jupyter_cloudtik.core.units import parse_duration

    with pytest.raises(ConfigError):  # NaN was returned as a duration
        parse_duration(value, field="walltime")


@pytest.mark.parametrize("value", ["9" * 400 + "GiB", "9" * 39 + "T", 10**400, float("nan")])
def test_size_too_large_is_a_config_error(value):
    from jupyter_cloudtik.core.units import parse_bytes

    with pytest.raises(ConfigError) as e:  # was OverflowError (and NaN passed)
        parse_bytes(value, field="memory")
    assert e.value.field == "memory"


def test_sizes_and_durations_still_read():
    from jupyter_cloudtik.core.units import parse_bytes, parse_duration

    assert parse_bytes("2GiB") == 2 * 1024**3 and parse_bytes(512) == 512
    assert parse_duration("1-00:00:00") == 86400.0 and parse_duration("90") == 5400.0


# --- locations and configs ---------------------------------------------------------------
def test_file_url_with_a_bracket_is_a_config_error(tmp_path):
    from jupyter_cloudtik.core.locations import InProcess, ServerRoot, resolve

    for policy in (InProcess(tmp_path), ServerRoot(tmp_path)):
        with pytest.raises(ConfigError) as e:  # was ValueError "Invalid IPv6 URL"
            resolve("file://localh[st/x", "notebook", policy)
        assert e.value.field == "notebook"


@pytest.mark.parametrize("text,field", [
    ("cluster_name: a\nnull: 1\nfoo: 2\n", "config"),      # TypeError sorting keys
    ("runtime: {dask: {x: 2020-01-01}}\n", "runtime.dask.x"),  # a date: not JSON
    ("setup_commands: !!binary aGk=\n", "setup_commands"),
])
def test_config_that_is_not_json_is_refused_where_it_is(text, field):
    from jupyter_cloudtik.core.config import build_config, parse_config_text

    with pytest.raises(ConfigError) as e:
        build_config(parse_config_text(text))
    assert e.value.field == field


def test_backends_file_entry_that_is_no_mapping():
    from jupyter_cloudtik.hpc.settings import parse_backends_text

    with pytest.raises(ConfigError) as e:  # was ValueError from dict(["a"])
        parse_backends_text("backends:\n  hpc: [a]\n", "x.yaml")
    assert e.value.field == "backends.hpc"
    assert parse_backends_text("backends:\n  hpc:\n", "x.yaml") == {"hpc": {}}


# --- Slurm's answers ---------------------------------------------------------------------
def test_blank_slurm_state_is_unknown():
    from jupyter_cloudtik.hpc.slurm import UNKNOWN, common_state, first_word

    assert common_state("\x1c") == UNKNOWN  # was IndexError (str.split of blanks only)
    assert first_word(" ") == "" and first_word(5) == ""
    assert common_state("CANCELLED by 0") == "cancelled"


def test_odd_scontrol_values_are_no_limit():
    from jupyter_cloudtik.hpc.base import Limits
    from jupyter_cloudtik.hpc.slurm import limits_from_scontrol

    lim = Limits()
    # MaxNodes that is not a number: was ValueError; MaxTime 0: was ConfigError "time";
    # ² passes str.isdigit and int() refuses it
    default = limits_from_scontrol(
        lim, "PartitionName=p Default=YES MaxNodes=UPLIMITED MaxTime=0-00:00:00 "
             "TotalNodes=\u00b2 State=UP\n",
        "NodeName=n CPUTot=\u00b2 RealMemory=2/2 Partitions=p\n")
    assert default == "p" and lim.queues == ["p"]
    q = lim.per_queue["p"]
    assert (q.max_nodes, q.max_duration, q.max_cpus_per_node) == (None, None, None)
    limits_from_scontrol(lim, "PartitionName=p MaxNodes=4 MaxTime=1:00:00 State=UP\n",
                         "NodeName=n CPUTot=2 RealMemory=100 Partitions=p\n")
    assert (lim.per_queue["p"].max_nodes, lim.per_queue["p"].max_duration) == (4, 3600.0)


def test_odd_node_values_in_the_slurm_provider():
    from jupyter_cloudtik.providers.slurm_parse import free_memory, memory_per_core, sinfo_cpus

    assert memory_per_core([{"RealMemory": "100", "CPUTot": "2/2"}]) == 100 * 2**20
    assert memory_per_core([{"RealMemory": "x"}]) is None
    assert sinfo_cpus("2/x/0") is None and sinfo_cpus("0/2/0/2") == (0, 2, 0, 2)
    assert free_memory([{"RealMemory": "100", "AllocMem": "z", "State": "IDLE"},
                        {"RealMemory": "10", "AllocMem": "50", "State": "MIXED"}]) \
        == 100 * 2**20


def test_sacct_exit_code_with_odd_digits():
    from jupyter_cloudtik.hpc.slurm import parse_sacct_states

    out = parse_sacct_states("1|FAILED|None|\u00b2:0\n2|CANCELLED|None|0:9\n", ["1", "2"])
    assert out == {"1": ("FAILED", "None", None), "2": ("CANCELLED", "None", 137)}


# --- ARC's answers -----------------------------------------------------------------------
@pytest.mark.parametrize("info", [5, [1], {"Domains": "x"}, {"Domains": {"AdminDomain": {
    "Services": {"ComputingService": {"ComputingShare": {
        "Name": "q", "MaxSlotsPerJob": "1e999", "MaxWallTime": "nan"}}}}}}])
def test_arc_info_of_any_shape(info):
    from jupyter_cloudtik.hpc.arc import limits_from_info
    from jupyter_cloudtik.hpc.base import Limits

    lim = Limits()
    limits_from_info(lim, info)  # was AttributeError (5.get) and OverflowError (int(inf))
    for q in lim.per_queue.values():
        assert q.max_cpus_per_node is None and q.max_duration is None


def test_arc_answers_that_are_no_object():
    from jupyter_cloudtik.hpc.arc import answers_by_id

    assert [a["status-code"] for a in answers_by_id([1, 2], ["a"])] == ["404"]


# --- rclone's output ---------------------------------------------------------------------
def test_rclone_stats_of_odd_shapes():
    from jupyter_cloudtik.storage.rclone import parse_stats

    assert parse_stats('"stats"') is None  # was AttributeError ('str'.get)
    st = parse_stats('{"stats": {"bytes": "x", "speed": 1e999, "eta": [], "errors": -1, '
                     '"transfers": 3}}')
    assert st is not None and (st.bytes, st.speed, st.errors, st.files) == (0, 0.0, 0, 3)
    assert st.eta == 0.0 and math.isfinite(st.to_dict()["speed"])


def test_cut_lsjson_is_a_storage_error():
    from jupyter_cloudtik.storage.manager import listing_page
    from jupyter_cloudtik.storage.rclone import StorageError

    for out in (b'[{"Path', b'{"Path": "a"}', b'[{"Name": "a"}]', b"[1]"):
        with pytest.raises(StorageError):  # was JSONDecodeError / AttributeError: a 500
            listing_page(out, "f", 0, 10)
    page = listing_page(b'[{"Path": "b", "Name": "b"}, {"Path": "a", "IsDir": true}]',
                        "/f/", 0, 10)
    assert [e["path"] for e in page["entries"]] == ["f/a", "f/b"]


# --- zones and REST bodies ---------------------------------------------------------------
def test_hint_that_is_not_ascii_is_refused(tmp_path):
    from jupyter_cloudtik.placement.zones import HintRefused, ZoneKeys

    keys = ZoneKeys(tmp_path)
    for token in ("\udcff", "gAAAA\u00e9"):
        with pytest.raises(HintRefused) as e:  # was UnicodeEncodeError: a 500 from boot
            keys.open(token, 300)
        assert e.value.field == "hint"


def test_request_with_an_empty_key_names_the_request():
    from jupyter_cloudtik.offers import Request

    with pytest.raises(ConfigError) as e:
        Request.from_dict({"": 1, "count": 1})
    assert e.value.field == "request"  # was "" (no field)


@pytest.mark.parametrize("raw,problem", [
    (b'{"config":' + b"[" * 3000 + b"]" * 3000 + b"}", "nested"),  # was RecursionError
    (b'{"config":' + b"[" * 65 + b"]" * 65 + b"}", "nested"),
    (b'{"config": {"runtime": {"dask": {"x": NaN}}}}', "NaN"),     # was stored as NaN
    (b'{"name": "\\ud800"}', "surrogate"),                        # was accepted
])
def test_rest_bodies_that_are_not_plain_json(raw, problem):
    from jupyter_cloudtik.api.base import parse_json_body

    with pytest.raises(ConfigError) as e:
        parse_json_body(raw, "ClusterCreate")
    assert e.value.field == "body" and problem in str(e.value)


def test_filter_query_nested_too_deep():
    from jupyter_cloudtik.placement.jsonfilter import compile_query

    with pytest.raises(ConfigError) as e:  # was RecursionError from json.loads
        compile_query("[" * 100000 + "]" * 100000, field="query")
    assert e.value.field == "query"
    assert compile_query('["=", "$availability_zone", "az1"]') is not None


def test_emulator_obs_signature_that_is_not_ascii():
    from cloudtik_emulators.huaweicloud.signing import (
        SignatureError,
        verify_obs_signature,
    )

    with pytest.raises(SignatureError):  # was TypeError from hmac.compare_digest
        verify_obs_signature("GET", "b", "", [], {"authorization": "OBS AK:\u00e9"},
                             {"AK": "SK"})


# --- YAML (found by the 50 s campaign of fuzz/fuzz_config.py) -------------------------------
@pytest.mark.parametrize("text,says", [
    ("cluster_name: a\nstarted: 2020-02-31\n", "day is out of range"),  # was ValueError
    ("a: " + "[" * 600 + "]" * 600, "nested too deeply"),               # was RecursionError
    ("a: " + "[" * 70 + "]" * 70, "nested more than 64"),
    # aliases of aliases: 10**9 values in 400 bytes (was minutes of schema checking)
    ("a: &a [" + ",".join(["x"] * 10) + "]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join(["*" + chr(97 + i)] * 10) + "]\n"
        for i in range(8)), "more than 1000000 values"),
])
def test_yaml_that_pyyaml_or_the_checks_choke_on(text, says):
    from jupyter_cloudtik.core.config import parse_config_text

    with pytest.raises(ConfigError) as e:
        parse_config_text(text)
    assert e.value.field == "config" and says in str(e.value)


def test_yaml_values_elsewhere_read_the_same_way():
    from jupyter_cloudtik.hpc.commands import parse_value
    from jupyter_cloudtik.hpc.settings import parse_backends_text

    assert parse_value("2020-02-31") == "2020-02-31"  # `%hpc -p d 2020-02-31`: text, no crash
    assert parse_value("[1, 2]") == [1, 2]
    with pytest.raises(ConfigError) as e:
        parse_backends_text("backends:\n  hpc: {since: 2020-13-01}\n", "x.yaml")
    assert e.value.field == "config_file"
