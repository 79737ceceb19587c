"""Credentials, retries, offers and API call counts of the provider, against the emulator."""

from __future__ import annotations

import os

import pytest

from cloudtik_emulators.huaweicloud import Emulator, EmulatorControl, Options
from jupyter_cloudtik.core.errors import ConfigError, ProviderError
from jupyter_cloudtik.providers.huaweicloud.clients import Clients
from jupyter_cloudtik.providers.huaweicloud.credentials import HuaweiCloud, resolve
from jupyter_cloudtik.providers.huaweicloud.offers import flavor_resources, offer_set
from jupyter_cloudtik.providers.huaweicloud.retry import RetryPolicy


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    e = Emulator(tmp_path_factory.mktemp("emu"), Options(boot=False, boot_seconds=0.02,
                                                         settle_seconds=0.01))
    e.start()
    yield e
    e.stop()


def _clients(emu, **policy) -> Clients:
    from jupyter_cloudtik.providers.huaweicloud.credentials import Credentials

    o = emu.options
    creds = Credentials(o.access_key, o.secret_key, source="test")
    return Clients({"region": o.region, "endpoint": emu.endpoint}, creds,
                   policy=RetryPolicy(**{"base_delay": 0.01, **policy}))


def test_credentials_come_from_env_then_file_and_say_how_when_missing(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("HUAWEICLOUD_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        resolve({}, HuaweiCloud())
    assert "HUAWEICLOUD_SDK_AK" in e.value.message and "credentials" in e.value.message
    # ...the variable that names another file, and who must have them under JupyterLab
    assert "HUAWEICLOUD_CREDENTIALS_FILE names another file" in e.value.message
    assert "the Jupyter server" in e.value.message and "\n" not in e.value.message
    f = tmp_path / "creds"
    f.write_text("[default]\naccess_key = AKFILE\nsecret_key = SKFILE\nproject_id = p1\n"
                 "[other]\naccess_key = AK2\nsecret_key = SK2\n")
    monkeypatch.setenv("HUAWEICLOUD_CREDENTIALS_FILE", str(f))
    c = resolve({}, HuaweiCloud())
    assert (c.access_key, c.project_id) == ("AKFILE", "p1")
    assert "SKFILE" not in repr(c)
    assert resolve({"profile": "other"}, HuaweiCloud()).access_key == "AK2"
    with pytest.raises(ConfigError, match="no profile \\[nope\\]"):
        resolve({"profile": "nope"}, HuaweiCloud())
    monkeypatch.setenv("HUAWEICLOUD_SDK_AK", "AKENV")
    monkeypatch.setenv("HUAWEICLOUD_SDK_SK", "SKENV")
    monkeypatch.setenv("HUAWEICLOUD_SDK_PROJECT_ID", "p2")
    assert resolve({}, HuaweiCloud()).access_key == "AKENV"


def test_project_and_domain_are_found_through_iam(emu):
    c = _clients(emu)
    assert c.project_id == emu.options.project_id
    assert c.domain_id == emu.options.domain_id


def test_retries_are_bounded_and_reported(emu):
    from huaweicloudsdkecs.v2 import ListFlavorsRequest

    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    seen = []
    c = _clients(emu, attempts=4)
    c.on_retry = lambda what, n, delay, why: seen.append((n, why))
    ctl.inject("ecs.list_flavors", "throttle", times=2)
    assert c.call("ecs", "list_flavors", ListFlavorsRequest()).flavors
    assert [n for n, _ in seen] == [1, 2] and "429" in seen[0][1]
    ctl.inject("ecs.list_flavors", "error", times=10)
    with pytest.raises(ProviderError) as e:
        c.call("ecs", "list_flavors", ListFlavorsRequest())
    assert "after 4 attempt(s)" in e.value.message and "Ecs.0500" in e.value.message
    ctl.clear_faults()
    # a budget of seconds bounds the waiting as well
    c = _clients(emu, attempts=20, base_delay=0.2, budget=0.5)
    ctl.inject("ecs.list_flavors", "error", times=100)
    with pytest.raises(ProviderError, match="attempt"):
        c.call("ecs", "list_flavors", ListFlavorsRequest())
    ctl.clear_faults()


def test_a_long_throttling_window_is_waited_out(emu):
    """The gateway's flow control counts per window ("limit:XX,time:1 minute", FAQ "How
    Do I Handle the Error APIG.0308?"): six tries over 8-15 s gave up in the first
    quarter of a one-minute window.  A throttled call now waits out a window (more
    tries, waits up to a quarter window, 1.5 windows of budget): the one the answer
    names, else a minute (the SDK never shows the answer's text: every 429 is "too many
    429 error responses").  Here the gateway throttles for 4 s against a schedule whose
    six tries, as before, spend at most 1.55 s."""
    import time

    from huaweicloudsdkecs.v2 import ListFlavorsRequest

    from jupyter_cloudtik.providers.huaweicloud.retry import RetryPolicy

    policy = RetryPolicy(base_delay=0.05)
    assert policy.for_window(1.0) == (6, 60.0, 8.0)  # short windows: as before
    assert policy.for_window(60.0) == (16, 90.0, 15.0)
    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    seen = []
    c = _clients(emu, base_delay=0.05)
    c.on_retry = lambda what, n, delay, why: seen.append(why)
    ctl.inject("ecs.list_flavors", "rate_window", times=60, delay=4)
    try:
        t0 = time.monotonic()
        assert c.call("ecs", "list_flavors", ListFlavorsRequest()).flavors
        took = time.monotonic() - t0
    finally:
        ctl.clear_faults()
    assert len(seen) > 5 and "429" in seen[0], seen  # more than the 5 retries before
    assert 4 <= took < 12, took


def test_offers_are_flavors_times_zones_with_prices_and_quota(emu):
    emu.cloud.set_options({"sold_out": [["s6.large.2", "cn-north-4b"]]})
    got = offer_set(_clients(emu), prices={"s6.large.2": 0.05})
    flavors = {o.flavor for o in got.offers}
    assert {"s6.small.1", "s6.large.2", "c7.xlarge.2"} <= flavors
    large = {o.availability_zone: o for o in got.offers if o.flavor == "s6.large.2"}
    assert set(large) == {"cn-north-4a", "cn-north-4c"}  # sold out in 4b
    a = large["cn-north-4a"]
    assert a.price_per_hour == 0.05 and a.size == {"CPU": 2, "memory": 4 * 2**30, "GPU": 0}
    assert a.node_config == {"flavor": "s6.large.2", "availability_zone": "cn-north-4a",
                             "market_type": None}
    pool = got.pools[a.pool]
    assert pool.free["instances"] == 200 and pool.total["CPU"] == 800
    spot = offer_set(_clients(emu), spot=True)
    assert any(o.spot and o.node_config["market_type"] == "spot" for o in spot.offers)
    emu.cloud.set_options({"sold_out": []})
    assert flavor_resources("s6.xlarge.2") == {"CPU": 4, "memory": 8 * 2**30}
    assert flavor_resources("c7.2xlarge.4") == {"CPU": 8, "memory": 32 * 2**30}
    assert flavor_resources("odd") is None


def test_the_eip_type_is_one_the_region_has(emu):
    """EIP types differ by region (CreatePublicipOption docstring: cn-northeast-1 has only
    5_telcom and 5_union) and a type the region has not is refused: 5_bgp was
    hard-coded.  The type is asked of EIP v3 ListCommonPools: 5_bgp, else 5_sbgp, else
    the region's first IPv4 pool."""
    from huaweicloudsdkeip.v2 import (
        CreatePublicipBandwidthOption,
        CreatePublicipOption,
        CreatePublicipRequest,
        CreatePublicipRequestBody,
    )

    from jupyter_cloudtik.providers.huaweicloud.offers import eip_type

    assert eip_type(_clients(emu)) == "5_bgp"
    try:
        for pools, want in ((["5_telcom", "5_union", "5_ipv6"], "5_telcom"),
                            (["5_sbgp"], "5_sbgp")):
            emu.cloud.set_options({"eip_pools": pools})
            c = _clients(emu)
            assert eip_type(c) == want
            with pytest.raises(ProviderError) as e:  # what the hard-coded type met
                c.call("eip", "create_publicip", CreatePublicipRequest(
                    CreatePublicipRequestBody(
                        bandwidth=CreatePublicipBandwidthOption(name="bw", share_type="PER",
                                                                size=5),
                        publicip=CreatePublicipOption(type="5_bgp"))))
            assert "is not supported in this region" in e.value.message, e.value.message
    finally:
        emu.cloud.set_options({"eip_pools": ["5_bgp", "5_sbgp"]})


def test_edge_and_dedicated_zones_are_not_offered(emu):
    """ListServerAzInfo lists edge zones (type Edge, mode dedicated, their own
    public_border_group: ECS "Listing AZs") beside the central ones, and flavors name
    them as sold like any zone: they were offered, and a create there fails (the edge
    site needs its own subnets).  Only central shared zones are offered now."""
    from huaweicloudsdkecs.v2 import ListFlavorsRequest, ListServerAzInfoRequest

    from jupyter_cloudtik.providers.huaweicloud.offers import list_zones, sold

    c = _clients(emu)
    edge = f"{emu.options.region}-ies-1a"
    emu.cloud.set_options({"edge_zones": [edge]})
    try:
        listed = c.call("ecs", "list_server_az_info",
                        ListServerAzInfoRequest()).availability_zones
        assert {(z.availability_zone_id, z.type, z.mode) for z in listed} >= {
            (edge, "Edge", "dedicated"), (f"{emu.options.region}a", "Center", "shared")}
        flavor = c.call("ecs", "list_flavors", ListFlavorsRequest()).flavors[0]
        assert sold(flavor.os_extra_specs, edge)  # the flavor says "normal" there
        assert edge not in list_zones(c) and len(list_zones(c)) == 3
        offers = offer_set(c)
        assert offers.offers and all(o.availability_zone != edge for o in offers.offers)
    finally:
        emu.cloud.set_options({"edge_zones": []})


def test_offers_follow_the_flavors_sale_status_zone_then_region_and_charge(emu):
    """ECS's sale fields (FlavorExtraSpec docstrings): a zone cond:operation:az does not
    name takes the region-level cond:operation:status; promotion is sold; obt, sellout and
    abandon are not; cond:operation:charge without demand is monthly-only."""
    emu.cloud.set_options({"flavor_sale": {
        # sold out region-wide except in 4a
        "s6.large.2": {"status": "sellout", "az": {"cn-north-4a": "normal"}},
        "c7.large.2": {"status": "promotion"},                   # recommended: sold
        "c7.xlarge.2": {"status": "normal", "charge": "period"},  # monthly only
        "s6.xlarge.2": {"status": "normal", "az": {"cn-north-4b": "obt"}},  # beta in 4b
        "m7.xlarge.8": {"status": "abandon"},                    # withdrawn
    }})
    try:
        got = offer_set(_clients(emu), spot=True)
        where: dict[tuple[str, bool], set[str]] = {}
        for o in got.offers:
            where.setdefault((o.flavor, o.spot), set()).add(o.availability_zone)
        zones = {"cn-north-4a", "cn-north-4b", "cn-north-4c"}
        assert where[("s6.large.2", False)] == {"cn-north-4a"}
        assert where[("c7.large.2", False)] == zones
        assert ("c7.xlarge.2", False) not in where and ("m7.xlarge.8", False) not in where
        assert where[("s6.xlarge.2", False)] == zones - {"cn-north-4b"}
        assert where[("s6.small.1", False)] == zones  # no sale entry: normal everywhere
        # the emulator refuses what is not offered, as the real create would
        from cloudtik_emulators.huaweicloud.errors import ApiError

        with emu.cloud.lock:
            for fid, zone in (("c7.xlarge.2", "cn-north-4a"), ("m7.xlarge.8", "cn-north-4a"),
                              ("s6.xlarge.2", "cn-north-4b")):
                with pytest.raises(ApiError) as e:
                    emu.cloud._check_sale(fid, zone)
                assert e.value.status == 400, (fid, zone)
            emu.cloud._check_sale("c7.large.2", "cn-north-4c")  # promotion: sold
    finally:
        emu.cloud.set_options({"flavor_sale": {}})


def test_gpu_and_kunpeng_flavors_are_offers_with_their_hardware(emu):
    """GPUs from info:gpus or pci_passthrough:alias, arm64 from ecs:instance_architecture,
    read through the official SDK's FlavorExtraSpec (what the real ListFlavors returns)."""
    from huaweicloudsdkecs.v2 import FlavorExtraSpec

    from jupyter_cloudtik.providers.huaweicloud.offers import flavor_hardware

    offers = {o.flavor: o for o in offer_set(_clients(emu)).offers}
    v100, t4, plain = offers["p2s.2xlarge.8"], offers["pi2.2xlarge.4"], offers["s6.large.2"]
    assert (v100.size["GPU"], v100.capabilities["gpu_model"]) == (1, "V100")
    assert (t4.size["GPU"], t4.capabilities["gpu_model"]) == (1, "T4")  # the alias alone
    assert plain.size["GPU"] == 0 and "gpu_model" not in plain.capabilities
    assert v100.capabilities["performance"] == "gpu" and v100.arch == "x86_64"
    assert "1 x V100" in v100.description
    kunpeng = FlavorExtraSpec(ecsperformancetype="kunpeng_computing",
                              ecsinstance_architecture="arm64")
    assert flavor_hardware(kunpeng) == ("aarch64", 0, None)
    two = FlavorExtraSpec(pci_passthroughalias="nvidia-a100:2,nvidia-a100:2")
    assert flavor_hardware(two) == ("x86_64", 4, "A100")
    vgpu = FlavorExtraSpec(pci_passthroughgpu_specs="m60_1q:virt:1")
    assert flavor_hardware(vgpu) == ("x86_64", 1, "M60")
    odd = FlavorExtraSpec(infogpus="not json", pci_passthroughalias="nvidia-t4:x")
    assert flavor_hardware(odd) == ("x86_64", 1, "T4")


def test_the_placement_options_of_docs_placement_md_against_the_emulators_offers(emu,
                                                                                  tmp_path):
    import doc_examples
    import yaml

    from jupyter_cloudtik.clusters.placing import ClusterPlacement
    from jupyter_cloudtik.core.config import build_config
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.placement.engine import Engine, PlacementError

    text = doc_examples.block("docs/placement.md", "Placement options in a cluster config",
                              lang="yaml").text
    fragment = yaml.safe_load(text)

    def config(frag):
        return build_config({
            "cluster_name": "gpu", "head_node_type": "head",
            "provider": {"type": "huaweicloud", "workspace_name": "demo"},
            "placement": frag["placement"],
            "available_node_types": {"head": {"node_config": {"flavor": "s6.large.2"}},
                                     "worker": {"node_config": {"flavor": "s6.large.2"}},
                                     **frag["available_node_types"]}})

    cfg = config(fragment)
    placement = ClusterPlacement(Store(tmp_path / "state"), CloudTik(state_dir=str(tmp_path)))
    offers = offer_set(_clients(emu), spot=True)
    engine = Engine(placement.settings)

    gpus = engine.place(offers.offers, placement.request_for(cfg, "gpu-worker", 2, "ann"),
                        offers.pools)
    where = [next(o for o in offers.offers if o.key == c.offer) for c in gpus.choices]
    assert {o.flavor for o in where} == {"p2s.2xlarge.8"}  # V100; the T4 flavor is not asked
    assert {o.availability_zone for o in where} == {"cn-north-4a", "cn-north-4b"}  # spread
    assert all(o.spot for o in where)  # prefer_spot, and spot is cheaper

    workers = engine.place(offers.offers, placement.request_for(cfg, "worker", 2, "ann"),
                           offers.pools)
    picked = [next(o for o in offers.offers if o.key == c.offer) for c in workers.choices]
    assert {o.flavor for o in picked} == {"s6.large.2"}
    assert all(o.price_per_hour <= 0.5 and o.availability_zone != "cn-north-4c"
               for o in picked)

    # a GPU no flavor has: refused, naming the filter and what it saw
    wants_h100 = yaml.safe_load(text)
    wants_h100["available_node_types"]["gpu-worker"]["placement"]["capabilities"] = {
        "gpu_model": ["H100"]}
    with pytest.raises(PlacementError) as info:
        engine.place(offers.offers,
                     placement.request_for(config(wants_h100), "gpu-worker", 1, "ann"),
                     offers.pools)
    assert "filter 'capabilities' eliminated" in info.value.message
    assert "wanted ['H100']" in info.value.message and "Nothing was reserved" in info.value.message

    # a filters list without the filter an option needs is refused, not ignored
    no_filter = yaml.safe_load(text)
    no_filter["placement"]["filters"].remove("capabilities")
    with pytest.raises(ConfigError) as info:
        placement.request_for(config(no_filter), "gpu-worker", 1, "ann")
    assert info.value.field == "placement.filters"
    assert "'capabilities'" in info.value.message and "gpu_model" in info.value.message


def test_a_filters_list_keeps_the_providers_own_flavor_pin(emu, tmp_path):
    """`filters: [max_price]` in a Huawei config: the node type's flavor (the provider's
    capabilities wish) still holds; only the config's own wishes must list their filter."""
    from jupyter_cloudtik.clusters.placing import ClusterPlacement
    from jupyter_cloudtik.core.config import build_config
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.core.store import Store

    cfg = build_config({
        "cluster_name": "pinned", "head_node_type": "head",
        "provider": {"type": "huaweicloud", "workspace_name": "demo"},
        "placement": {"filters": ["max_price"], "max_price": 1.0},
        "available_node_types": {"head": {"node_config": {"flavor": "s6.large.2"}},
                                 "worker": {"node_config": {"flavor": "c7.xlarge.2"}}}})
    placement = ClusterPlacement(Store(tmp_path / "state"), CloudTik(state_dir=str(tmp_path)))
    req = placement.request_for(cfg, "worker", 1, "ann")
    assert req.filters == ["max_price", "capabilities"]
    assert req.capabilities == {"flavor": "c7.xlarge.2"}


def test_the_full_cluster_config_of_docs_huaweicloud_md_is_valid_and_placeable(emu, tmp_path):
    """docs/huaweicloud.md's config for a real account, as written: every option passes
    the schema, and its 4 c7.xlarge.2 workers and s6.large.2 head place on the emulator's
    offers in the zone it names, at its own price table.  (A real `up` of it needs an
    image id and key pair of an account; tests/huaweicloud run `up` with the emulator's.)"""
    import doc_examples
    import yaml

    from jupyter_cloudtik.clusters.placing import ClusterPlacement
    from jupyter_cloudtik.core.config import build_config
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.placement.engine import Engine

    text = doc_examples.block("docs/huaweicloud.md", "Clusters", 0, lang="yaml").text
    cfg = build_config(yaml.safe_load(text))
    worker = cfg["available_node_types"]["worker"]
    assert (worker["min_workers"], worker["max_workers"]) == (4, 50)
    assert worker["resources"]["CPU"] == 4  # from the flavor's name
    placement = ClusterPlacement(Store(tmp_path / "state"), CloudTik(state_dir=str(tmp_path)))
    engine = Engine(placement.settings)
    offers = offer_set(_clients(emu), prices=cfg["provider"]["prices"])
    for node_type, count, flavor, price in (("head", 1, "s6.large.2", 0.05),
                                            ("worker", 4, "c7.xlarge.2", 0.132)):
        plan = engine.place(offers.offers, placement.request_for(cfg, node_type, count, "ann"),
                            offers.pools)
        got = [next(o for o in offers.offers if o.key == c.offer) for c in plan.choices]
        assert [(o.flavor, o.price_per_hour) for o in got] == [(flavor, price)] * count
        if node_type == "worker":
            assert {o.availability_zone for o in got} == {"cn-north-4a"}


def test_the_image_is_the_newest_ubuntu_of_the_flavors_architecture_for_ecs(emu):
    """IMS lists newer Kunpeng (arm) and bare-metal (Ironic) Ubuntu builds beside the x86
    ECS ones: the lookup asks IMS's architecture and virtual_env_type filters, and an x86
    ECS server gets an x86 ECS image (the emulator refuses a mismatch with Ecs.0007, as
    ECS does: "adjust the flavor or image type")."""
    from jupyter_cloudtik.providers.huaweicloud.bootstrap import latest_ubuntu

    c = _clients(emu)
    assert latest_ubuntu(c, "x86").name == "Ubuntu 22.04 server 64bit"
    assert latest_ubuntu(c, "arm").name == "Ubuntu 24.04 server 64bit for Kunpeng"
    # the old lookup (platform and type only, highest version) chose a build that an x86
    # ECS flavor cannot boot
    from huaweicloudsdkims.v2 import ListImagesRequest

    every = c.call("ims", "list_images", ListImagesRequest(
        platform="Ubuntu", imagetype="gold", status="active", limit=100)).images
    newest = max(every, key=lambda i: i.os_version)
    image = next(i for i in emu.cloud.images if i["name"] == newest.name)
    assert image["arch"] == "arm" or image["env"] == "Ironic", image
    # (the create's refusal of such an image: test_emulator.py's create refusals)


def test_the_default_image_has_the_clients_python_and_a_named_one_is_checked(emu):
    """A node refuses any Python major.minor but the client's (userdata.py), and IMS says
    an image's OS, never its Python: the default image is the newest Ubuntu, else Debian,
    whose release's python3 is the client's (the newest Ubuntu alone, 22.04 with 3.10,
    failed every node of a 3.11 client after its server was made); a named image is
    checked against the same table, and an OS outside it needs ``image_python``."""
    from jupyter_cloudtik.providers.huaweicloud.bootstrap import (
        check_image_python,
        default_image,
        find_image,
        image_python,
        public_images,
    )

    c = _clients(emu)
    # the table agrees with what the emulator's images carry (their release's python3)
    for img in [*public_images(c, "Ubuntu", "x86"), *public_images(c, "Debian", "x86")]:
        carried = next(i["python"] for i in emu.cloud.images if i["id"] == img.id)
        assert image_python(img) == carried, img.name
    assert default_image(c, "x86", "3.11").name == "Debian 12.0.0 64bit"
    assert default_image(c, "x86", "3.10").name == "Ubuntu 22.04 server 64bit"
    assert default_image(c, "arm", "3.12").name == "Ubuntu 24.04 server 64bit for Kunpeng"
    field = "available_node_types.head.node_config.image_id"
    with pytest.raises(ConfigError) as e:
        default_image(c, "x86", "3.13", field)
    assert e.value.field == field and "\n" not in e.value.message
    assert "no public Ubuntu or Debian ECS image for x86 has Python 3.13" in e.value.message
    assert "Ubuntu 22.04 has 3.10" in e.value.message and "Debian 12 has 3.11" in e.value.message
    jammy = next(i["id"] for i in emu.cloud.images if i["name"].startswith("Ubuntu 22.04"))
    with pytest.raises(ConfigError) as e:
        check_image_python(c, find_image(c, jammy), jammy, None, "3.11", field)
    assert e.value.message.startswith(
        f"{field}: image 'Ubuntu 22.04 server 64bit' has Python 3.10 and the client has "
        "Python 3.11"), e.value.message
    centos = next(i["id"] for i in emu.cloud.images if i["name"].startswith("CentOS"))
    with pytest.raises(ConfigError) as e:
        check_image_python(c, find_image(c, centos), centos, None, "3.11", field)
    assert "is not known; set image_python: '3.11'" in e.value.message
    check_image_python(c, find_image(c, centos), centos, "3.11", "3.11", field)  # declared
    with pytest.raises(ConfigError) as e:  # an id IMS does not list is not waved through
        check_image_python(c, find_image(c, "0" * 36), "0" * 36, None, "3.11", field)
    assert "an image IMS does not list" in e.value.message


@pytest.mark.parametrize("name, machine, problem", [
    ("msgpack-1.0.8-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "x86_64",
     None),
    ("six-1.17.0-py2.py3-none-any.whl", "aarch64", None),
    ("msgpack-1.0.8-cp311-cp311-macosx_11_0_arm64.whl", "x86_64", "macosx_11_0_arm64"),
    ("msgpack-1.0.8-cp311-cp311-win_amd64.whl", "x86_64", "win_amd64"),
    ("msgpack-1.0.8-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "aarch64",
     "manylinux2014_x86_64"),
    ("msgpack-1.0.8-cp311-cp311-musllinux_1_1_x86_64.whl", "x86_64", "musllinux_1_1_x86_64"),
])
def test_wheels_are_checked_against_the_nodes_platform(name, machine, problem):
    from jupyter_cloudtik.runtime.environment import wheel_platform_problem

    got = wheel_platform_problem(name, machine)
    assert (got is None) if problem is None else (problem in got and machine in got), got


def test_tags_go_to_the_tag_service_of_the_accounts_site(emu):
    """TMS has one endpoint per site (Chinese, international, Europe, each dedicated
    region), not per region, and an account exists on one site: the tags of a server in
    ap-southeast-3 go to the international site's TMS, never to one pinned region's (the
    old code sent every region's to cn-north-4's, and in the emulator to the regional
    address, which publishes no TMS API).  A site the region does not tell is set with
    ``tms_endpoint``; a 401 there says so in one line."""
    from huaweicloudsdkcore.auth.credentials import GlobalCredentials
    from huaweicloudsdkcore.exceptions import exceptions as sdk_exc
    from huaweicloudsdkcore.http.http_config import HttpConfig
    from huaweicloudsdktms.v1 import (
        CreateResourceTagRequest,
        CreateTagRequest,
        ReqCreateTag,
        ResourceTagBody,
        TmsClient,
    )

    from jupyter_cloudtik.providers.huaweicloud.clients import tms_endpoint

    assert tms_endpoint("cn-north-4") == tms_endpoint("cn-east-3") == \
        "https://tms.myhuaweicloud.com"
    assert tms_endpoint("ap-southeast-3") == tms_endpoint("af-south-1") == \
        "https://tms-intl.myhuaweicloud.com"
    assert tms_endpoint("eu-west-101") == "https://tms.eu-west-101.myhuaweicloud.eu"
    assert tms_endpoint("my-kualalumpur-1") == "https://tms.my-kualalumpur-1.myhuaweicloud.com"
    assert tms_endpoint("cn-north-4", "https://tms.example.org/") == "https://tms.example.org"

    o = emu.options

    def body(project=o.project_id):
        return CreateResourceTagRequest(body=ReqCreateTag(
            project_id=project, tags=[CreateTagRequest(key="k", value="v")],
            resources=[ResourceTagBody(resource_id="no-such-server", resource_type="ecs")]))

    # the regional address (where the old provider sent TMS in the emulator) has no TMS
    raw = TmsClient.new_builder().with_credentials(GlobalCredentials(
        o.access_key, o.secret_key, o.domain_id)).with_endpoints([emu.endpoint]) \
        .with_http_config(HttpConfig.get_default_config()).build()
    with pytest.raises(sdk_exc.ClientRequestException) as e:
        raw.create_resource_tag(body())
    assert (e.value.status_code, e.value.error_code) == (404, "APIGW.0101")

    # the site's TMS answers (for a server that does not exist: per resource, TMS.0005)
    got = _clients(emu).call("tms", "create_resource_tag", body())
    assert [f.error_code for f in got.failed_resources] == ["TMS.0005"]
    try:
        o.site = "intl"  # an international account in a cn-* region
        with pytest.raises(ConfigError) as e:
            _clients(emu).call("tms", "create_resource_tag", body())
        assert e.value.field == "provider.tms_endpoint" and "401" in e.value.message
        assert "https://tms.myhuaweicloud.com" in e.value.message
        assert o.secret_key not in e.value.message and "\n" not in e.value.message
        c = _clients(emu)
        c.config["tms_endpoint"] = "https://tms-intl.myhuaweicloud.com"
        got = c.call("tms", "create_resource_tag", body())
        assert [f.error_code for f in got.failed_resources] == ["TMS.0005"]
    finally:
        o.site = None
