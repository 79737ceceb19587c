"""Cluster config: schema validation messages, short forms, defaults."""

from __future__ import annotations

import pytest

from jupyter_cloudtik.core.config import build_config, config_diff, config_hash, parse_config_text
from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.core.units import format_bytes, parse_bytes

FULL = """
cluster_name: analysis
provider:
  type: local
available_node_types:
  head:
    resources: {CPU: 0}
  small:
    resources: {CPU: 1, memory: 1GiB}
    min_workers: 1
    max_workers: 3
  big:
    resources: {CPU: 2, memory: 2GiB}
    min_workers: 0
    max_workers: 2
head_node_type: head
max_workers: 4
idle_timeout_minutes: 30
runtime:
  types: [dask]
setup_commands: ["echo hello"]
"""


def test_short_form_needs_no_file(settings):
    cfg = build_config(workers=3, settings=settings)
    assert cfg["cluster_name"] == "default"
    assert cfg["provider"]["type"] == "local"
    assert cfg["head_node_type"] == "head"
    worker = cfg["available_node_types"]["worker"]
    assert worker["min_workers"] == 3
    assert worker["max_workers"] >= 3
    assert worker["resources"]["CPU"] == 1
    assert worker["resources"]["memory"] > 0
    assert cfg["runtime"]["types"] == ["dask"]


def test_full_config_is_normalised(settings):
    cfg = build_config(parse_config_text(FULL), settings=settings)
    assert cfg["available_node_types"]["small"]["resources"]["memory"] == 2**30
    assert cfg["max_workers"] == 4
    assert "min_workers" not in cfg["available_node_types"]["head"]
    # the same input gives the same identity; a change gives another and a readable diff
    again = build_config(parse_config_text(FULL), settings=settings)
    assert config_hash(cfg) == config_hash(again)
    other = build_config(parse_config_text(FULL.replace("max_workers: 4", "max_workers: 5")),
                         settings=settings)
    assert config_hash(other) != config_hash(cfg)
    assert config_diff(cfg, other) == ["max_workers: 4 -> 5"]


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("available_node_types:\n  worker:\n    max_workers: -1\n",
         "available_node_types.worker.max_workers", "-1 is less than the minimum of 0"),
        ("cluster_name: Bad_Name\n", "cluster_name", "'Bad_Name' is not allowed"),
        ("clustr_name: x\n", "(top level)", "unknown field 'clustr_name'"),
        ("available_node_types:\n  worker:\n    resources: {CPU: two}\n",
         "available_node_types.worker.resources.CPU", "'two' is not of type 'integer'"),
        ("available_node_types:\n  worker:\n    resources: {memory: lots}\n",
         "available_node_types.worker.resources.memory", "'lots' is not valid"),
        ("runtime:\n  types: [ray]\n", "runtime.types.0",
         "'ray' is not an installed runtime; installed: dask, spark"),
        ("idle_timeout_minutes: -5\n", "idle_timeout_minutes", "less than the minimum of 0"),
        ("provider:\n  type: local\n  hostname: x\n", "provider",
         "unknown field 'hostname'"),
        ("available_node_types:\n  worker:\n    node_config: {envs: {}}\n",
         "available_node_types.worker.node_config", "unknown field 'envs'"),
    ],
)
def test_bad_values_name_the_field(settings, text, field, words):
    with pytest.raises(ConfigError) as e:
        build_config(parse_config_text(text), settings=settings)
    assert e.value.field == field
    assert e.value.message.startswith(f"{field}: ")
    assert words in e.value.message


def test_cross_field_rules(settings):
    with pytest.raises(ConfigError, match="head_node_type: 'boss' is not one of"):
        build_config({"available_node_types": {"w": {}}, "head_node_type": "boss"},
                     settings=settings)
    with pytest.raises(ConfigError, match=r"min_workers: 5 is more than max_workers \(2\)"):
        build_config({"available_node_types": {"head": {}, "w": {"min_workers": 5,
                                                                  "max_workers": 2}}},
                     settings=settings)
    with pytest.raises(ConfigError, match=r"max_workers: 1 is less than the sum of min_workers"):
        build_config({"max_workers": 1, "available_node_types": {
            "head": {}, "a": {"min_workers": 1}, "b": {"min_workers": 1}}}, settings=settings)
    with pytest.raises(ConfigError, match="2 worker node types"):
        build_config({"available_node_types": {"head": {}, "a": {}, "b": {}}}, workers=2,
                     settings=settings)


def test_yaml_syntax_error_gives_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster_name: a\nprovider:\n  type: local\n   bad: [\n")
    from jupyter_cloudtik.core.config import read_config_file

    with pytest.raises(ConfigError, match=r"YAML syntax error at line 4"):
        read_config_file(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(tmp_path / "missing.yaml")
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        read_config_file(path)


def test_unknown_provider_lists_installed(settings):
    with pytest.raises(ConfigError) as e:
        build_config(provider="nimbus", settings=settings)
    assert e.value.field == "provider.type"
    assert "unknown provider 'nimbus'; installed: " in e.value.message
    assert "local" in e.value.message


def test_allowed_providers_and_limits(settings):
    settings.allowed_providers = ["dask-gateway"]
    with pytest.raises(ConfigError, match="'local' is not allowed here"):
        build_config(settings=settings)
    settings.allowed_providers = []
    settings.max_workers_per_cluster = 2
    with pytest.raises(ConfigError, match="allows at most 2 per cluster"):
        build_config(workers=3, settings=settings)


@pytest.mark.parametrize("bad", [-1, True, 2.5, "3"])
def test_workers_short_form_must_be_a_count(settings, bad):
    with pytest.raises(ConfigError, match="workers: "):
        build_config(workers=bad, settings=settings)


def test_provider_short_form_cannot_contradict_the_file(settings):
    with pytest.raises(ConfigError, match="the config file says 'local' but 'other'"):
        build_config({"provider": {"type": "local"}}, provider="other", settings=settings)


def test_sizes():
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes(1024) == 1024
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    for bad in ["2 parsecs", "-1", True]:
        with pytest.raises(ConfigError):
            parse_bytes(bad)


ALL_WRONG = """
cluster_name: analysis
provider:
  type: local
available_node_types:
  head:
    resources: {CPU: 0}
  small:
    resources: {CPU: 1, memory: lots}
    min_workers: 3
    max_workers: 1
  big:
    resources: {CPU: 2, memory: 2 potatoes}
    node_config: {colour: red}
head_node_type: head
idle_timeout_minutes: soon
"""


def test_every_fault_of_a_config_is_named_at_once(settings):
    """A file with faults in independent places, found by the schema and by the later
    checks: one error lists them all, so the user fixes the file in one round."""
    with pytest.raises(ConfigError) as e:
        build_config(parse_config_text(ALL_WRONG), settings=settings)
    body = e.value.to_dict()
    fields = [p["field"] for p in body["problems"]]
    assert set(fields) == {
        "idle_timeout_minutes",
        "available_node_types.small.resources.memory",
        "available_node_types.small.min_workers",
        "available_node_types.big.resources.memory",
        "available_node_types.big.node_config",
    }, fields
    assert e.value.field == fields[0]
    assert e.value.message.startswith("5 problems in the config: ")
    for words in ("'soon'", "'lots'", "'2 potatoes'", "3 is more than max_workers (1)",
                  "'colour'"):
        assert words in e.value.message, (words, e.value.message)

    one = ALL_WRONG.replace("memory: lots", "memory: 1GiB").replace(
        "2 potatoes", "2GiB").replace("min_workers: 3", "min_workers: 1").replace(
        "node_config: {colour: red}", "").replace("soon", "5")
    build_config(parse_config_text(one), settings=settings)  # all fixed: accepted


def test_several_schema_faults_are_listed_together(settings):
    raw = {"cluster_name": "x", "idle_timeout_minutes": "soon", "max_workers": -1,
           "colour": "red"}
    with pytest.raises(ConfigError) as e:
        build_config(raw, settings=settings)
    fields = {p["field"] for p in e.value.to_dict()["problems"]}
    assert {"idle_timeout_minutes", "max_workers", "(top level)"} <= fields, fields
    assert "unknown field 'colour'" in e.value.message
