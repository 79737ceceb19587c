"""Custom kernel sizes (hpc/kernels/profiles.py): one decision (``find_profile`` with a
size) for the launcher's form, the spec manager and every start; hostile values in every
field get a one-line refusal naming the field, and no name, config or body gets a size
beyond the admin's bounds.  No Slurm here: the partition's limits are checked in
test_hpc_docs_kernels.py on the real one."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_cloudtik.core.errors import CloudTikError, ConfigError
from jupyter_cloudtik.hpc.kernels.profiles import (
    CUSTOM_KEYS,
    CustomSize,
    find_profile,
    parse_profiles,
    parse_size,
    split_spec_name,
)

BOUNDS = {"cores": 4, "time": "2h", "memory": "8GiB", "gpus": 1}
PROFILES = parse_profiles([
    {"name": "debug", "backend": "daint", "cores": 1, "time": "30m", "custom": BOUNDS},
    {"name": "open", "backend": "daint", "custom": True},
    {"name": "fixed", "backend": "daint", "cores": 8},
])
HOSTILE = [None, True, False, -1, 0, 1.5, math.nan, math.inf, 10**30, "", " ", "1e400",
           "NaN", "-5m", "5x", "9" * 5000, "\x00", "../../etc", "${HOME}", "2h; rm -rf /",
           [], {}, {"cores": 1}, ["1"], "0:00:30"]


def _within(p) -> bool:
    return (p.cores <= 4 and p.time <= 7200 and (p.memory or 0) <= 8 * 2**30
            and (p.gpus or 0) <= 1)


def test_a_size_within_the_bounds_is_the_profile_at_that_size_and_its_name_says_it():
    p = find_profile(PROFILES, "daint", "debug",
                     parse_size({"cores": 2, "time": "45m", "memory": "512MiB", "gpus": 1}))
    assert (p.cores, p.time, p.memory, p.gpus) == (2, 2700.0, 512 * 2**20, 1)
    assert p.spec_name == "cloudtik-hpc-daint-debug--c2-t45m-m512m-g1"
    assert p.title() == "Python 3 on daint — 2 cores, 1 GPU, 512.0 MiB, 45 min"
    assert split_spec_name(p.spec_name) == ("cloudtik-hpc-daint-debug", p.size)
    # what the provisioner gets from the spec is read back to the same size
    assert parse_size(p.to_config()["custom"]) == p.size
    # the admin's own size is unchanged, and says nothing of a custom size
    assert find_profile(PROFILES, "daint", "debug").spec_name == "cloudtik-hpc-daint-debug"


@pytest.mark.parametrize(("size", "line"), [
    ({"cores": 5, "time": "1h"}, "cores: 5 is more than profile 'debug' allows (at most 4)"),
    ({"cores": 1, "time": "3h"}, "time: 3 h is more than profile 'debug' allows (at most 2 h)"),
    ({"cores": 1, "time": "1h", "memory": "9GiB"},
     "memory: 9.0 GiB is more than profile 'debug' allows (at most 8.0 GiB)"),
    ({"cores": 1, "time": "1h", "gpus": 2},
     "gpus: 2 is more than profile 'debug' allows (at most 1)"),
])
def test_beyond_the_bounds_is_refused_naming_the_field(size, line):
    with pytest.raises(ConfigError) as e:
        find_profile(PROFILES, "daint", "debug", parse_size(size))
    assert str(e.value) == line


def test_a_profile_without_custom_sizes_refuses_every_size_and_true_allows_the_partition():
    with pytest.raises(ConfigError, match=r"^profile: 'fixed' of backend 'daint' offers no "
                                          r"custom sizes"):
        find_profile(PROFILES, "daint", "fixed", CustomSize(cores=1, time=60.0))
    # custom: true bounds nothing here (the partition's limits are checked at the start),
    # but GPUs stay at the profile's own (none) unless the admin names a number
    assert find_profile(PROFILES, "daint", "open", CustomSize(cores=64, time=86400.0)).cores \
        == 64
    with pytest.raises(ConfigError, match=r"^gpus: 1 is more"):
        find_profile(PROFILES, "daint", "open", CustomSize(cores=1, time=60.0, gpus=1))


@pytest.mark.parametrize("key", CUSTOM_KEYS)
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_every_size_field_refuses_hostile_values_in_one_line_naming_it(key, value):
    raw = {"cores": 1, "time": "30m", key: value}
    try:
        size = parse_size(raw, "custom")
    except ConfigError as e:
        assert str(e).startswith(f"custom.{key}") and "\n" not in str(e), str(e)
        return
    # what got through is a real size, and the bounds still decide
    assert size.cores >= 1 and size.time >= 60 and size.time % 60 == 0
    try:
        assert _within(find_profile(PROFILES, "daint", "debug", size))
    except ConfigError as e:
        assert str(e).split(":")[0] in CUSTOM_KEYS


@pytest.mark.parametrize("key", CUSTOM_KEYS)
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_every_bound_of_an_admins_profile_refuses_hostile_values(key, value):
    raw = {"name": "p", "backend": "daint", "custom": {key: value}}
    try:
        (p,) = parse_profiles([raw])
    except ConfigError as e:
        assert str(e).startswith(f"HPCKernels.profiles[0].custom.{key}"), str(e)
        assert "\n" not in str(e)
        return
    assert p.custom is not None


def test_a_malformed_custom_or_size_is_one_line():
    for raw, start in ((["x"], "HPCKernels.profiles[0].custom: ['x'] is neither"),
                       ({"ram": 1}, "HPCKernels.profiles[0].custom.ram: not a size")):
        with pytest.raises(ConfigError) as e:
            parse_profiles([{"name": "p", "backend": "d", "custom": raw}])
        assert str(e.value).startswith(start), str(e.value)
    for raw, line in (("4 cores", "custom: expected a mapping of cores, memory, time, gpus, "
                                  "got '4 cores'"),
                      ({"cores": 1, "time": "1h", "nodes": 2},
                       "custom.nodes: not a size; allowed: cores, memory, time, gpus"),
                      ({"cores": 1}, "custom.time: missing; give the wall time (e.g. 90m or "
                                     "2h)")):
        with pytest.raises(ConfigError) as e:
            parse_size(raw, "custom")
        assert str(e.value) == line


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet="cgmt0123456789-.x", max_size=40))
def test_no_spec_name_gets_a_size_beyond_the_bounds(token):
    """Names as a user could write them into a notebook's metadata: the spec manager reads
    each as the profile at a size, refused beyond the bounds, or not a custom name."""
    base, size = split_spec_name(f"cloudtik-hpc-daint-debug--{token}")
    if size is None:
        return
    assert base == "cloudtik-hpc-daint-debug"
    try:
        p = find_profile(PROFILES, "daint", "debug", size)
    except CloudTikError as e:
        assert str(e).split(":")[0] in CUSTOM_KEYS
        return
    assert _within(p)
    # the name is the size's one spelling: read back, it is the same spec
    assert p.spec_name == f"cloudtik-hpc-daint-debug--{token}" or \
        split_spec_name(p.spec_name)[1] == size


def test_a_chosen_size_is_listed_by_the_next_server_on_the_same_state_folder(tmp_path):
    """JupyterLab finds a notebook's kernel only among the listed specs: a size chosen in
    one server is listed by the next one on the same state folder, while it still fits the
    admin's bounds; a name written into the file by hand gets no more than the form."""
    import json

    from traitlets.config import Config

    from jupyter_cloudtik.hpc.kernels import HPCKernelSpecManager
    from jupyter_cloudtik.hpc.kernels.provisioner import close_registries
    from jupyter_cloudtik.hpc.kernels.specs import SIZES_FILE

    def manager(bounds: dict) -> HPCKernelSpecManager:
        return HPCKernelSpecManager(config=Config({
            "CloudTik": {"state_dir": str(tmp_path / "state")},
            "HPC": {"backends": {"daint": {"type": "slurm", "workdir": str(tmp_path / "j")}}},
            "HPCKernels": {"profiles": [{"name": "debug", "backend": "daint",
                                         "custom": bounds}]}}))

    try:
        first = manager({"cores": 4, "time": "2h"})
        name = "cloudtik-hpc-daint-debug--c2-t45m"
        assert name not in first.find_kernel_specs()
        first.remember_custom(name)
        assert first.get_all_specs()[name]["spec"]["display_name"] == \
            "Python 3 on daint — 2 cores, 45 min"
        # a name written by hand beside it: beyond the bounds, never listed
        kept = tmp_path / "state" / SIZES_FILE
        kept.write_text(json.dumps([*json.loads(kept.read_text()),
                                    "cloudtik-hpc-daint-debug--c64-t60m", "python3", 7]))
        second = manager({"cores": 4, "time": "2h"})
        listed = second.find_kernel_specs()
        assert name in listed and "cloudtik-hpc-daint-debug--c64-t60m" not in listed
        assert second.get_kernel_spec(name).display_name == \
            "Python 3 on daint — 2 cores, 45 min"
        # the admin narrows the bounds: the size is no longer offered
        third = manager({"cores": 1, "time": "2h"})
        assert name not in third.find_kernel_specs()
        kept.write_text("{not json")  # a broken file lists nothing of it, and breaks nothing
        assert "cloudtik-hpc-daint-debug" in manager(True).find_kernel_specs()
    finally:
        close_registries()
