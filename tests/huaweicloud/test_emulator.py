"""The emulator checks what Huawei Cloud checks, with the official SDK as its client."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid

import pytest
from huaweicloudsdkcore.auth.credentials import BasicCredentials
from huaweicloudsdkcore.exceptions.exceptions import ClientRequestException
from huaweicloudsdkcore.http.http_config import HttpConfig

from cloudtik_emulators.huaweicloud import Emulator, EmulatorControl, Options


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    e = Emulator(tmp_path_factory.mktemp("emu"), Options(boot=False, boot_seconds=0.05))
    e.start()
    yield e
    e.stop()


def _client(emu, cls, sk=None, project=None):
    o = emu.options
    cred = BasicCredentials(o.access_key, sk or o.secret_key, project or o.project_id)
    return cls.new_builder().with_credentials(cred).with_endpoints([emu.endpoint]) \
        .with_http_config(HttpConfig.get_default_config()).build()


def test_wrong_secret_key_is_refused_with_401(emu):
    from huaweicloudsdkvpc.v2 import ListVpcsRequest, VpcClient

    with pytest.raises(ClientRequestException) as e:
        _client(emu, VpcClient, sk="not-the-key").list_vpcs(ListVpcsRequest())
    assert e.value.status_code == 401 and e.value.error_code == "APIGW.0301"


def test_other_project_is_refused(emu):
    from huaweicloudsdkvpc.v2 import ListVpcsRequest, VpcClient

    with pytest.raises(ClientRequestException) as e:
        _client(emu, VpcClient, project="0" * 32).list_vpcs(ListVpcsRequest())
    assert e.value.status_code == 403


def test_vpc_quota_and_marker_pagination(emu):
    from huaweicloudsdkvpc.v2 import (
        CreateVpcOption,
        CreateVpcRequest,
        CreateVpcRequestBody,
        DeleteVpcRequest,
        ListVpcsRequest,
        VpcClient,
    )

    vpc = _client(emu, VpcClient)
    made = [vpc.create_vpc(CreateVpcRequest(CreateVpcRequestBody(vpc=CreateVpcOption(
        name=f"p{i}", cidr="10.0.0.0/16")))).vpc.id for i in range(5)]
    with pytest.raises(ClientRequestException) as e:
        vpc.create_vpc(CreateVpcRequest(CreateVpcRequestBody(vpc=CreateVpcOption(
            name="p5", cidr="10.0.0.0/16"))))
    assert e.value.status_code == 400 and e.value.error_code == "VPC.0106"
    page1 = vpc.list_vpcs(ListVpcsRequest(limit=2)).vpcs
    page2 = vpc.list_vpcs(ListVpcsRequest(limit=2, marker=page1[-1].id)).vpcs
    page3 = vpc.list_vpcs(ListVpcsRequest(limit=2, marker=page2[-1].id)).vpcs
    assert [v.id for v in page1 + page2 + page3] == made
    for v in made:
        vpc.delete_vpc(DeleteVpcRequest(vpc_id=v))


def test_servers_build_then_active_jobs_tags_offset_pages_and_client_token(emu):
    from huaweicloudsdkecs.v2 import (
        CreatePostPaidServersRequest,
        CreatePostPaidServersRequestBody,
        DeleteServersRequest,
        DeleteServersRequestBody,
        EcsClient,
        ListServersDetailsRequest,
        PostPaidServer,
        PostPaidServerNic,
        PostPaidServerRootVolume,
        PostPaidServerTag,
        ServerId,
        ShowJobRequest,
    )
    from huaweicloudsdkvpc.v2 import (
        CreateSubnetOption,
        CreateSubnetRequest,
        CreateSubnetRequestBody,
        CreateVpcOption,
        CreateVpcRequest,
        CreateVpcRequestBody,
        VpcClient,
    )

    vpc_c = _client(emu, VpcClient)
    vpc = vpc_c.create_vpc(CreateVpcRequest(CreateVpcRequestBody(vpc=CreateVpcOption(
        name="srv", cidr="192.168.0.0/16")))).vpc
    sub = vpc_c.create_subnet(CreateSubnetRequest(CreateSubnetRequestBody(
        subnet=CreateSubnetOption(name="s", cidr="192.168.1.0/24", gateway_ip="192.168.1.1",
                                  vpc_id=vpc.id)))).subnet
    ecs = _client(emu, EcsClient)
    image = emu.cloud.images[0]["id"]
    body = CreatePostPaidServersRequestBody(server=PostPaidServer(
        name="t", count=7, flavor_ref="s6.small.1", image_ref=image, vpcid=vpc.id,
        nics=[PostPaidServerNic(subnet_id=sub.id)],
        server_tags=[PostPaidServerTag(key="k", value="v")],
        root_volume=PostPaidServerRootVolume(volumetype="SSD", size=40),
        user_data=base64.b64encode(b"#!/bin/sh\ntrue\n").decode()))
    token = str(uuid.uuid4())
    # a lag long enough that a loaded machine still lists before it ends (the default is
    # short to keep other tests fast)
    lag, emu.cloud.list_lag = emu.cloud.list_lag, 3.0
    r1 = ecs.create_post_paid_servers(CreatePostPaidServersRequest(x_client_token=token,
                                                                   body=body))
    r2 = ecs.create_post_paid_servers(CreatePostPaidServersRequest(x_client_token=token,
                                                                   body=body))
    assert r1.server_ids == r2.server_ids and len(r1.server_ids) == 7
    # eventual consistency: the servers are known at once, listed a moment later
    first = ecs.list_servers_details(ListServersDetailsRequest(tags="k=v", limit=100))
    assert first.count == 0
    from huaweicloudsdkecs.v2 import ShowServerRequest

    shown = ecs.show_server(ShowServerRequest(server_id=r1.server_ids[0])).server
    assert shown.status in ("BUILD", "ACTIVE")
    deadline = time.monotonic() + 10
    while ecs.show_job(ShowJobRequest(job_id=r1.job_id)).status != "SUCCESS":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while ecs.list_servers_details(ListServersDetailsRequest(tags="k=v")).count < 7:
        assert time.monotonic() < deadline  # listed a little after the job ended
        time.sleep(0.05)
    pages = [ecs.list_servers_details(ListServersDetailsRequest(tags="k=v", limit=3,
                                                                offset=p)).servers
             for p in (1, 2, 3)]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert {s.id for p in pages for s in p} == set(r1.server_ids)
    assert all(s.status == "ACTIVE" for p in pages for s in p)
    assert ecs.list_servers_details(ListServersDetailsRequest(tags="k=other")).count == 0
    job = ecs.delete_servers(DeleteServersRequest(body=DeleteServersRequestBody(
        servers=[ServerId(id=s) for s in r1.server_ids], delete_publicip=True))).job_id
    # deleting takes time: the servers are listed (task_state deleting) until the job ends
    during = ecs.list_servers_details(ListServersDetailsRequest(tags="k=v")).servers
    assert len(during) == 7 and {s.os_ext_st_stask_state for s in during} == {"deleting"}
    while ecs.show_job(ShowJobRequest(job_id=job)).status != "SUCCESS":
        assert time.monotonic() < deadline + 10
        time.sleep(0.05)
    assert ecs.list_servers_details(ListServersDetailsRequest(tags="k=v")).count == 0
    emu.cloud.list_lag = lag


def test_faults_and_request_log(emu):
    from huaweicloudsdkecs.v2 import EcsClient, ListFlavorsRequest

    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    ctl.inject("ecs.list_flavors", "throttle", times=1)
    ctl.inject("ecs.list_flavors", "error", times=1, status=503)
    ecs = _client(emu, EcsClient)
    with pytest.raises(ClientRequestException) as e:
        ecs.list_flavors(ListFlavorsRequest())
    assert e.value.status_code == 429
    with pytest.raises(Exception) as e:
        ecs.list_flavors(ListFlavorsRequest())
    assert e.value.status_code == 503
    assert len(ecs.list_flavors(ListFlavorsRequest()).flavors) >= 5
    log = [r for r in ctl.requests() if r["action"] == "ecs.list_flavors"]
    assert [r["status"] for r in log[-3:]] == [429, 503, 200]
    ctl.clear_faults()
    # the admin API wants its token
    req = urllib.request.Request(f"{emu.endpoint}/_emulator/state")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 401


def test_obs_lists_objects_by_prefix_in_pages(emu):
    """Listing Objects in a Bucket: alphabetical, prefix, marker, max-keys, IsTruncated and
    NextMarker, as the SDK reads them (what the provider pages through)."""
    from huaweicloudsdkobs.v1 import (
        CreateBucketRequest,
        CreateBucketRequestBody,
        ListObjectsRequest,
        ObsClient,
        PutObjectRequest,
    )
    from huaweicloudsdkobs.v1.obs_credentials import ObsCredentials

    from jupyter_cloudtik.providers.huaweicloud.clients import _HttpConfig
    from jupyter_cloudtik.providers.huaweicloud.nodes import _MemoryFile

    hc = _HttpConfig()
    hc.proxy_protocol, hc.proxy_host, hc.proxy_port = "http", "127.0.0.1", emu.port
    c = ObsClient.new_builder().with_credentials(ObsCredentials(
        emu.options.access_key, emu.options.secret_key)).with_endpoints(
        [emu.obs_endpoint]).with_http_config(hc).build()
    c.create_bucket(CreateBucketRequest(bucket_name="emu-list-1",
                                        body=CreateBucketRequestBody(location="cn-north-4")))
    for key in ("a/3", "a/1", "b/1", "a/2", "a/4"):
        c.put_object(PutObjectRequest(bucket_name="emu-list-1", object_key=key,
                                      stream=_MemoryFile(key.encode())))
    page = c.list_objects(ListObjectsRequest(bucket_name="emu-list-1", prefix="a/",
                                             max_keys=3))
    assert [o.key for o in page.contents] == ["a/1", "a/2", "a/3"]
    assert page.is_truncated is True and page.next_marker == "a/3"
    rest = c.list_objects(ListObjectsRequest(bucket_name="emu-list-1", prefix="a/",
                                             max_keys=3, marker=page.next_marker))
    # (the SDK turns IsTruncated "false" into True: bool("false"); NextMarker is what
    # callers can go by, and it is absent on the last page)
    assert [o.key for o in rest.contents] == ["a/4"] and not rest.next_marker
    everything = c.list_objects(ListObjectsRequest(bucket_name="emu-list-1", max_keys=5000))
    assert [o.key for o in everything.contents] == ["a/1", "a/2", "a/3", "a/4", "b/1"]
    emu.cloud.r["bucket"].pop("emu-list-1")


def test_obs_bucket_by_host_name_with_signature(emu):
    from huaweicloudsdkobs.v1 import (
        CreateBucketRequest,
        CreateBucketRequestBody,
        DeleteBucketRequest,
        GetBucketMetadataRequest,
        ObsClient,
    )
    from huaweicloudsdkobs.v1.obs_credentials import ObsCredentials

    from jupyter_cloudtik.providers.huaweicloud.clients import _HttpConfig

    hc = _HttpConfig()
    hc.proxy_protocol, hc.proxy_host, hc.proxy_port = "http", "127.0.0.1", emu.port

    def obs(sk):
        return ObsClient.new_builder().with_credentials(ObsCredentials(
            emu.options.access_key, sk)).with_endpoints([emu.obs_endpoint]) \
            .with_http_config(hc).build()

    good = obs(emu.options.secret_key)
    good.create_bucket(CreateBucketRequest(bucket_name="emu-bucket-1",
                                           body=CreateBucketRequestBody(location="cn-north-4")))
    good.get_bucket_metadata(GetBucketMetadataRequest(bucket_name="emu-bucket-1"))
    with pytest.raises(ClientRequestException) as e:
        obs("wrong").get_bucket_metadata(GetBucketMetadataRequest(bucket_name="emu-bucket-1"))
    assert e.value.status_code == 403
    with pytest.raises(ClientRequestException) as e:
        good.create_bucket(CreateBucketRequest(bucket_name="emu-bucket-1",
                                               body=CreateBucketRequestBody(
                                                   location="cn-north-4")))
    assert e.value.status_code == 409
    # listing: lexicographic, prefix, max-keys pages with NextMarker (obs_04_0022)
    from huaweicloudsdkobs.v1 import DeleteObjectRequest, ListObjectsRequest, PutObjectRequest

    from jupyter_cloudtik.providers.huaweicloud.nodes import _MemoryFile

    keys = ["cloudtik/b", "cloudtik/a", "user/x", "cloudtik/c"]
    for k in keys:
        good.put_object(PutObjectRequest(bucket_name="emu-bucket-1", object_key=k,
                                         stream=_MemoryFile(b"1")))
    seen, marker, pages = [], None, 0
    while True:
        got = good.list_objects(ListObjectsRequest(bucket_name="emu-bucket-1",
                                                   prefix="cloudtik/", marker=marker,
                                                   max_keys=2))
        pages += 1
        seen += [c.key for c in got.contents or []]
        # (the SDK reads IsTruncated "false" as True: bool("false"); NextMarker is the tell)
        if got.next_marker is None:
            break
        marker = got.next_marker
    assert (seen, pages) == (["cloudtik/a", "cloudtik/b", "cloudtik/c"], 2)
    with pytest.raises(ClientRequestException) as e:
        good.list_objects(ListObjectsRequest(bucket_name="emu-bucket-1", max_keys=-1))
    assert e.value.status_code == 400
    for k in keys:
        good.delete_object(DeleteObjectRequest(bucket_name="emu-bucket-1", object_key=k))
    good.delete_bucket(DeleteBucketRequest(bucket_name="emu-bucket-1"))
    assert emu.cloud.summary()["buckets"] == []
    for bad in ("-bucket", "ab", "bad_name", "x" * 64):
        with pytest.raises(ClientRequestException) as e:
            good.create_bucket(CreateBucketRequest(bucket_name=bad, body=CreateBucketRequestBody(
                location="cn-north-4")))
        assert e.value.status_code == 400, bad
        assert emu.requests[-1]["error"] == "InvalidBucketName", bad  # the XML error code


def test_state_summary_is_json(emu):
    json.dumps(emu.cloud.summary())


def _network(emu, name, dns=None):
    from huaweicloudsdkvpc.v2 import (
        CreateSubnetOption,
        CreateSubnetRequest,
        CreateSubnetRequestBody,
        CreateVpcOption,
        CreateVpcRequest,
        CreateVpcRequestBody,
        VpcClient,
    )

    EmulatorControl(emu.endpoint, emu.options.admin_token).set_options(quotas={"vpc": 100})
    c = _client(emu, VpcClient)
    vpc = c.create_vpc(CreateVpcRequest(CreateVpcRequestBody(vpc=CreateVpcOption(
        name=name, cidr="10.9.0.0/16")))).vpc
    sub = c.create_subnet(CreateSubnetRequest(CreateSubnetRequestBody(
        subnet=CreateSubnetOption(name=name, cidr="10.9.1.0/24", gateway_ip="10.9.1.1",
                                  vpc_id=vpc.id, primary_dns=dns[0] if dns else None,
                                  dns_list=dns)))).subnet
    return vpc, sub


def _server(emu, vpc, sub, count=1, name="t", tags=None, image=None):
    from huaweicloudsdkecs.v2 import (
        CreatePostPaidServersRequestBody,
        PostPaidServer,
        PostPaidServerNic,
        PostPaidServerRootVolume,
        PostPaidServerTag,
    )

    return CreatePostPaidServersRequestBody(server=PostPaidServer(
        name=name, count=count, flavor_ref="s6.small.1",
        image_ref=image or emu.cloud.images[0]["id"],
        vpcid=vpc.id, nics=[PostPaidServerNic(subnet_id=sub.id)],
        root_volume=PostPaidServerRootVolume(volumetype="SSD", size=40),
        server_tags=[PostPaidServerTag(key=k, value=v) for k, v in (tags or {}).items()]))


def _refused(fn, status, code):
    with pytest.raises(ClientRequestException) as e:
        fn()
    assert (e.value.status_code, e.value.error_code) == (status, code), e.value.error_msg
    return e.value.error_msg


def test_ecs_create_refuses_what_the_published_api_refuses(emu):
    """X-Client-Token format and reuse, count per call, batch names, tag characters,
    required root volume, quota: each with the documented status and code."""
    from huaweicloudsdkecs.v2 import CreatePostPaidServersRequest, EcsClient

    vpc, sub = _network(emu, "refusals")
    ecs = _client(emu, EcsClient)

    def create(body, token=None):
        return lambda: ecs.create_post_paid_servers(CreatePostPaidServersRequest(
            x_client_token=token, body=body))

    ok = _server(emu, vpc, sub)
    _refused(create(ok, uuid.uuid4().hex), 400, "Ecs.0123")        # 32 hex, no dashes
    _refused(create(ok, str(uuid.uuid4()).upper()), 400, "Ecs.0123")  # upper case
    token = str(uuid.uuid4())
    first = create(ok, token)()
    n_servers = len(emu.cloud.r["server"])
    again = create(_server(emu, vpc, sub), token)()  # same token, same body: same result
    assert (again.job_id, again.server_ids) == (first.job_id, first.server_ids)
    assert len(emu.cloud.r["server"]) == n_servers  # ...and nothing new was made
    _refused(create(_server(emu, vpc, sub, name="other"), token), 400, "Ecs.0122")
    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    ctl.set_options(token_ttl=0)  # a token is valid for 8 hours, then Ecs.0124
    try:
        _refused(create(_server(emu, vpc, sub), token), 400, "Ecs.0124")
    finally:
        ctl.set_options(token_ttl=8 * 3600)
    # an x86 ECS flavor boots neither a Kunpeng (arm) nor a bare-metal (Ironic) image
    for other in [i for i in emu.cloud.images if i["arch"] != "x86" or i["env"] != "FusionCompute"]:
        _refused(create(_server(emu, vpc, sub, image=other["id"])), 400, "Ecs.0007")
    assert "1 to 100" in _refused(create(_server(emu, vpc, sub, count=101)), 400, "Ecs.0005")
    _refused(create(_server(emu, vpc, sub, count=2, name="n" * 60)), 400, "Ecs.0005")
    create(_server(emu, vpc, sub, count=1, name="n" * 64))()          # 64 is fine alone
    _refused(create(_server(emu, vpc, sub, tags={"k": "a=b"})), 400, "Ecs.0005")
    _refused(create(_server(emu, vpc, sub, tags={"a/b": "v"})), 400, "Ecs.0005")
    _refused(create(_server(emu, vpc, sub, tags={f"k{i}": "v" for i in range(11)})), 400,
             "Ecs.0005")
    no_root = _server(emu, vpc, sub)
    no_root.server.root_volume = None
    _refused(create(no_root), 400, "Ecs.0005")
    meta = _server(emu, vpc, sub)
    meta.server.metadata = {f"k{i}": "v" for i in range(11)}
    _refused(create(meta), 400, "Ecs.0005")
    for data, ok_ in ((b"#!/bin/sh\n" + b"#" * (32 * 1024 - 10), True),
                      (b"#" * (32 * 1024 + 1), False)):
        body = _server(emu, vpc, sub)
        body.server.user_data = base64.b64encode(data).decode()
        if ok_:
            create(body)()  # 32 KB before encoding (about 43 KB encoded) is accepted
        else:
            _refused(create(body), 400, "Ecs.0014")
    body = _server(emu, vpc, sub)
    body.server.user_data = "not base64!"
    _refused(create(body), 400, "Ecs.0014")
    from huaweicloudsdkecs.v2 import (
        PostPaidServerEip,
        PostPaidServerEipBandwidth,
        PostPaidServerPublicip,
    )

    for eip, code in ((PostPaidServerEip(iptype="5_telcom", bandwidth=PostPaidServerEipBandwidth(
            size=5, sharetype="PER")), "Ecs.0005"),
                      (PostPaidServerEip(iptype="5_bgp", bandwidth=PostPaidServerEipBandwidth(
                          size=2001, sharetype="PER")), "Ecs.0005"),
                      (PostPaidServerEip(iptype="5_bgp", bandwidth=PostPaidServerEipBandwidth(
                          size=5, sharetype="PER", chargemode="hourly")), "Ecs.0005")):
        body = _server(emu, vpc, sub)
        body.server.publicip = PostPaidServerPublicip(eip=eip)
        _refused(create(body), 400, code)
    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    ctl.set_options(quotas={"instances": len(ctl.state()["servers"]) + 1})
    try:
        msg = _refused(create(_server(emu, vpc, sub, count=2)), 400, "Ecs.0001")
        assert "Insufficient ECS quota" in msg
    finally:
        ctl.set_options(quotas={"instances": 200})


def test_subnet_dns_is_blank_unless_given_and_servers_inherit_it(emu):
    """The VPC API leaves DNS empty when none is given: the emulator records it, and a server
    in that subnet is told of no name servers (metadata network_data.json)."""
    from huaweicloudsdkecs.v2 import CreatePostPaidServersRequest, EcsClient

    ecs = _client(emu, EcsClient)
    for name, dns in (("nodns", None), ("withdns", ["100.125.1.250", "100.125.129.250"])):
        vpc, sub = _network(emu, name, dns)
        assert sub.primary_dns == (dns[0] if dns else None)
        sid = ecs.create_post_paid_servers(CreatePostPaidServersRequest(
            x_client_token=str(uuid.uuid4()), body=_server(emu, vpc, sub, name=name))
        ).server_ids[0]
        with urllib.request.urlopen(f"{emu.endpoint}/_emulator/metadata/{sid}/openstack/"
                                    "latest/network_data.json") as r:
            services = json.loads(r.read())["services"]
        assert [s["address"] for s in services] == (dns or [])
        state = EmulatorControl(emu.endpoint, emu.options.admin_token).state()
        assert next(s for s in state["servers"] if s["id"] == sid)["dns_servers"] == (
            dns or [])
    # "Updating Subnet Information" (vpc_subnet01_0004): name mandatory, DNS as at create,
    # only under the subnet's own VPC; servers made afterwards get the new name servers
    from huaweicloudsdkvpc.v2 import (
        UpdateSubnetOption,
        UpdateSubnetRequest,
        UpdateSubnetRequestBody,
        VpcClient,
    )

    vpc_c = _client(emu, VpcClient)
    vpc, sub = _network(emu, "fixdns")

    def update(opt, vpc_id=vpc.id):
        return lambda: vpc_c.update_subnet(UpdateSubnetRequest(
            vpc_id=vpc_id, subnet_id=sub.id, body=UpdateSubnetRequestBody(subnet=opt)))

    good = ["100.125.1.250", "100.125.129.250"]
    _refused(update(UpdateSubnetOption(primary_dns=good[0])), 400, "VPC.0002")  # no name
    _refused(update(UpdateSubnetOption(name="fixdns", primary_dns="::1")), 400, "VPC.0002")
    _refused(update(UpdateSubnetOption(name="fixdns", primary_dns=good[0],
                                       dns_list=[good[1]])), 400, "VPC.0002")
    _refused(update(UpdateSubnetOption(name="fixdns", primary_dns=good[0]),
                    vpc_id=str(uuid.uuid4())), 404, "VPC.0202")
    update(UpdateSubnetOption(name="fixdns", primary_dns=good[0], secondary_dns=good[1],
                              dns_list=good))()
    sid = ecs.create_post_paid_servers(CreatePostPaidServersRequest(
        x_client_token=str(uuid.uuid4()), body=_server(emu, vpc, sub, name="fixdns"))
    ).server_ids[0]
    state = EmulatorControl(emu.endpoint, emu.options.admin_token).state()
    assert next(s for s in state["servers"] if s["id"] == sid)["dns_servers"] == good


def test_list_tag_filter_is_contains_and_limits(emu):
    """ListServersDetails' ``tags`` matches servers whose tags *contain* the value (the
    stricter reading of its docstring): cluster ``ana`` finds ``analysis`` too; limit is
    1..1000, delete takes at most 1000 servers, TMS at most 50 resources."""
    from huaweicloudsdkecs.v2 import (
        CreatePostPaidServersRequest,
        DeleteServersRequest,
        DeleteServersRequestBody,
        EcsClient,
        ListServersDetailsRequest,
        ServerId,
    )

    vpc, sub = _network(emu, "contains")
    ecs = _client(emu, EcsClient)
    for cluster in ("ana", "analysis"):
        ecs.create_post_paid_servers(CreatePostPaidServersRequest(
            x_client_token=str(uuid.uuid4()), body=_server(
                emu, vpc, sub, name=cluster, tags={"cloudtik-cluster-name": cluster})))
    deadline = time.monotonic() + 10
    while True:  # listings lag a moment behind creates
        got = ecs.list_servers_details(ListServersDetailsRequest(
            tags="cloudtik-cluster-name=ana", limit=1000)).servers
        if len(got) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert {s.name for s in got} == {"ana", "analysis"}
    _refused(lambda: ecs.list_servers_details(ListServersDetailsRequest(limit=1001)), 400,
             "Ecs.0005")
    _refused(lambda: ecs.delete_servers(DeleteServersRequest(body=DeleteServersRequestBody(
        servers=[ServerId(id=str(uuid.uuid4())) for _ in range(1001)]))), 400, "Ecs.0005")

    from huaweicloudsdkcore.auth.credentials import GlobalCredentials
    from huaweicloudsdktms.v1 import (
        CreateResourceTagRequest,
        CreateTagRequest,
        ReqCreateTag,
        ResourceTagBody,
        TmsClient,
    )

    from jupyter_cloudtik.providers.huaweicloud.clients import _HttpConfig

    o = emu.options
    cred = GlobalCredentials(o.access_key, o.secret_key, o.domain_id)
    hc = _HttpConfig()  # TMS is the site's host, through the emulator as the proxy
    hc.proxy_protocol, hc.proxy_host, hc.proxy_port = "http", "127.0.0.1", emu.port
    tms = TmsClient.new_builder().with_credentials(cred).with_endpoints(
        [emu.tms_endpoint]).with_http_config(hc).build()
    ids = [s.id for s in got]

    def tag(resources, key="k", project=o.project_id):
        return lambda: tms.create_resource_tag(CreateResourceTagRequest(body=ReqCreateTag(
            project_id=project, tags=[CreateTagRequest(key=key, value="v")],
            resources=[ResourceTagBody(resource_id=r, resource_type="ecs")
                       for r in resources])))

    _refused(tag(ids * 26), 400, "TMS.0001")          # 52 resources
    _refused(tag(ids, key="a.b"), 400, "TMS.0001")    # '.' is not a key character
    _refused(tag(ids, project=None), 400, "TMS.0001")
    tag(ids)()
    assert all(s.tags and "k=v" in s.tags for s in ecs.list_servers_details(
        ListServersDetailsRequest(tags="k=v")).servers)


def test_deletes_take_time_and_answer_409_while_dependents_drain(emu):
    """SNAT rules before the NAT gateway, the NAT gateway and ports before their subnet,
    security group and EIP: each refused with 409 while what uses it is still deleting."""
    from huaweicloudsdkecs.v2 import (
        CreatePostPaidServersRequest,
        DeleteServersRequest,
        DeleteServersRequestBody,
        EcsClient,
        ServerId,
        ShowJobRequest,
    )
    from huaweicloudsdkvpc.v2 import (
        CreateSecurityGroupOption,
        CreateSecurityGroupRequest,
        CreateSecurityGroupRequestBody,
        DeleteSecurityGroupRequest,
        DeleteSubnetRequest,
        VpcClient,
    )

    ctl = EmulatorControl(emu.endpoint, emu.options.admin_token)
    ctl.set_options(delete_seconds=2.0)  # long enough to see the 409s on a loaded machine
    try:
        vpc, sub = _network(emu, "drain")
        v = _client(emu, VpcClient)
        sg = v.create_security_group(CreateSecurityGroupRequest(CreateSecurityGroupRequestBody(
            security_group=CreateSecurityGroupOption(name="drain", vpc_id=vpc.id)))
        ).security_group
        ecs = _client(emu, EcsClient)
        body = _server(emu, vpc, sub, name="drain")
        from huaweicloudsdkecs.v2 import PostPaidServerSecurityGroup

        body.server.security_groups = [PostPaidServerSecurityGroup(id=sg.id)]
        sid = ecs.create_post_paid_servers(CreatePostPaidServersRequest(
            x_client_token=str(uuid.uuid4()), body=body)).server_ids[0]
        job = ecs.delete_servers(DeleteServersRequest(body=DeleteServersRequestBody(
            servers=[ServerId(id=sid)]))).job_id
        _refused(lambda: v.delete_security_group(DeleteSecurityGroupRequest(
            security_group_id=sg.id)), 409, "VPC.0602")
        _refused(lambda: v.delete_subnet(DeleteSubnetRequest(vpc_id=vpc.id,
                                                             subnet_id=sub.id)), 409,
                 "VPC.0210")
        deadline = time.monotonic() + 10
        while ecs.show_job(ShowJobRequest(job_id=job)).status != "SUCCESS":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        v.delete_security_group(DeleteSecurityGroupRequest(security_group_id=sg.id))

        from huaweicloudsdkeip.v2 import (
            CreatePublicipBandwidthOption,
            CreatePublicipOption,
            CreatePublicipRequest,
            CreatePublicipRequestBody,
            DeletePublicipRequest,
            EipClient,
        )
        from huaweicloudsdknat.v2 import (
            CreateNatGatewayOption,
            CreateNatGatewayRequest,
            CreateNatGatewayRequestBody,
            CreateNatGatewaySnatRuleOption,
            CreateNatGatewaySnatRuleRequest,
            CreateNatGatewaySnatRuleRequestOption,
            DeleteNatGatewayRequest,
            DeleteNatGatewaySnatRuleRequest,
            NatClient,
            ShowNatGatewayRequest,
        )

        nat_c, eip_c = _client(emu, NatClient), _client(emu, EipClient)
        nat = nat_c.create_nat_gateway(CreateNatGatewayRequest(CreateNatGatewayRequestBody(
            nat_gateway=CreateNatGatewayOption(name="drain", router_id=vpc.id,
                                               internal_network_id=sub.id, spec="1")))
        ).nat_gateway
        while nat_c.show_nat_gateway(ShowNatGatewayRequest(
                nat_gateway_id=nat.id)).nat_gateway.status != "ACTIVE":
            time.sleep(0.05)
        eip = eip_c.create_publicip(CreatePublicipRequest(CreatePublicipRequestBody(
            bandwidth=CreatePublicipBandwidthOption(name="drain", share_type="PER", size=5),
            publicip=CreatePublicipOption(type="5_bgp")))).publicip
        rule = nat_c.create_nat_gateway_snat_rule(CreateNatGatewaySnatRuleRequest(
            CreateNatGatewaySnatRuleRequestOption(snat_rule=CreateNatGatewaySnatRuleOption(
                nat_gateway_id=nat.id, network_id=sub.id, floating_ip_id=eip.id)))
        ).snat_rule
        nat_c.delete_nat_gateway_snat_rule(DeleteNatGatewaySnatRuleRequest(
            nat_gateway_id=nat.id, snat_rule_id=rule.id))
        # the rule is PENDING_DELETE: the gateway and the EIP are still in use
        _refused(lambda: nat_c.delete_nat_gateway(DeleteNatGatewayRequest(
            nat_gateway_id=nat.id)), 409, "NAT.0013")
        _refused(lambda: eip_c.delete_publicip(DeletePublicipRequest(publicip_id=eip.id)),
                 409, "VPC.0520")
        time.sleep(2.2)  # past delete_seconds: the dependent is gone
        nat_c.delete_nat_gateway(DeleteNatGatewayRequest(nat_gateway_id=nat.id))
        eip_c.delete_publicip(DeletePublicipRequest(publicip_id=eip.id))
        # the gateway is PENDING_DELETE: its subnet is still in use
        _refused(lambda: v.delete_subnet(DeleteSubnetRequest(vpc_id=vpc.id,
                                                             subnet_id=sub.id)), 409,
                 "VPC.0210")
        time.sleep(2.2)  # past delete_seconds: the dependent is gone
        v.delete_subnet(DeleteSubnetRequest(vpc_id=vpc.id, subnet_id=sub.id))
    finally:
        ctl.set_options(delete_seconds=0.3)


def test_other_request_shapes_are_checked(emu):
    """IMS sort keys, EIP bandwidth name and charge mode, NAT gateway names (no '.') and
    specs, subnet names: what the SDK docstrings allow, and no more."""
    from huaweicloudsdkeip.v2 import (
        CreatePublicipBandwidthOption,
        CreatePublicipOption,
        CreatePublicipRequest,
        CreatePublicipRequestBody,
        EipClient,
    )
    from huaweicloudsdkims.v2 import ImsClient, ListImagesRequest
    from huaweicloudsdknat.v2 import (
        CreateNatGatewayOption,
        CreateNatGatewayRequest,
        CreateNatGatewayRequestBody,
        NatClient,
    )

    ims = _client(emu, ImsClient)
    _refused(lambda: ims.list_images(ListImagesRequest(sort_key="created_at")), 400,
             "IMG.0001")
    assert ims.list_images(ListImagesRequest(platform="Ubuntu", imagetype="gold")).images
    eip = _client(emu, EipClient)

    def publicip(**bw):
        return lambda: eip.create_publicip(CreatePublicipRequest(CreatePublicipRequestBody(
            bandwidth=CreatePublicipBandwidthOption(share_type="PER", size=5, **bw),
            publicip=CreatePublicipOption(type="5_bgp"))))

    _refused(publicip(), 400, "VPC.0501")                      # PER needs a name
    _refused(publicip(name="bw", charge_mode="hourly"), 400, "VPC.0501")
    vpc, sub = _network(emu, "shapes")
    nat = _client(emu, NatClient)

    def gateway(name, spec="1"):
        return lambda: nat.create_nat_gateway(CreateNatGatewayRequest(
            CreateNatGatewayRequestBody(nat_gateway=CreateNatGatewayOption(
                name=name, router_id=vpc.id, internal_network_id=sub.id, spec=spec))))

    _refused(gateway("with.dot"), 400, "NAT.0003")
    _refused(gateway("ok", spec="6"), 400, "NAT.0003")
    from huaweicloudsdkvpc.v2 import (
        CreateSubnetOption,
        CreateSubnetRequest,
        CreateSubnetRequestBody,
        VpcClient,
    )

    _refused(lambda: _client(emu, VpcClient).create_subnet(CreateSubnetRequest(
        CreateSubnetRequestBody(subnet=CreateSubnetOption(
            name="bad name", cidr="10.9.2.0/24", gateway_ip="10.9.2.1", vpc_id=vpc.id)))),
        400, "VPC.0002")


def test_custom_policy_documents_are_checked_and_scope_obs_access(emu):
    """IAM "Creating a Custom Policy for Cloud Services" (iam_02_0013): display name, type
    AX/XA, description, Version "1.1", 1-8 statements of 1-100 service:type:operation
    actions, Effect Allow/Deny, 1-10 five-part resources of the actions' service; each
    refusal is a 400. A node's temporary agency credentials then reach what the granted
    policy names (its bucket's objects) and nothing else (403 AccessDenied)."""
    from huaweicloudsdkiam.v3 import (
        AssociateAgencyWithAllProjectsPermissionRequest,
        CreateAgencyOption,
        CreateAgencyRequest,
        CreateAgencyRequestBody,
        CreateCloudServiceCustomPolicyRequest,
        CreateCloudServiceCustomPolicyRequestBody,
        DeleteCustomPolicyRequest,
        IamClient,
        ServicePolicy,
        ServicePolicyRoleOption,
        ServiceStatement,
    )
    from huaweicloudsdkobs.v1 import (
        CreateBucketRequest,
        CreateBucketRequestBody,
        GetObjectRequest,
        ObsClient,
        PutObjectRequest,
    )
    from huaweicloudsdkobs.v1.obs_credentials import ObsCredentials

    from cloudtik_emulators.huaweicloud.agency_credentials import (
        issue_temporary_credential,
    )
    from jupyter_cloudtik.providers.huaweicloud.clients import _HttpConfig
    from jupyter_cloudtik.providers.huaweicloud.nodes import _MemoryFile

    iam = _client(emu, IamClient)

    def policy(statement=None, **role):
        st = {"effect": "Allow", "action": ["obs:object:GetObject"],
              "resource": ["obs:*:*:object:pol-bucket-a/*"], **(statement or {})}
        opt = {"display_name": "pol-a", "type": "AX", "description": "d",
               "policy": ServicePolicy(version="1.1", statement=[ServiceStatement(**st)]),
               **role}
        return lambda: iam.create_cloud_service_custom_policy(
            CreateCloudServiceCustomPolicyRequest(body=CreateCloudServiceCustomPolicyRequestBody(
                role=ServicePolicyRoleOption(**opt))))

    for bad in ({"type": "AA"}, {"display_name": ""}, {"description": None},
                {"policy": ServicePolicy(version="1.0", statement=[ServiceStatement(
                    effect="Allow", action=["obs:object:GetObject"])])},
                {"policy": ServicePolicy(version="1.1", statement=[ServiceStatement(
                    effect="Allow", action=["obs:object:GetObject"])] * 9)}):
        _refused(policy(**bad), 400, "1100")
    for bad in ({"effect": "Maybe"}, {"action": []}, {"action": ["OBS:object:GetObject"]},
                {"action": ["obs:GetObject"]}, {"action": ["obs:object:Get"] * 101},
                {"resource": ["obs:*:*:object"]}, {"resource": ["ecs:*:*:instance:x"]},
                {"resource": [f"obs:*:*:object:b{i}/*" for i in range(11)]}):
        _refused(policy(statement=bad), 400, "1100")
    made = policy()()
    _refused(policy(), 409, "1109")  # the same display name twice

    o = emu.options
    agency = iam.create_agency(CreateAgencyRequest(CreateAgencyRequestBody(
        agency=CreateAgencyOption(name="pol-agency", domain_id=o.domain_id,
                                  trust_domain_name="op_svc_ecs", duration="FOREVER")))).agency
    iam.associate_agency_with_all_projects_permission(
        AssociateAgencyWithAllProjectsPermissionRequest(
            domain_id=o.domain_id, agency_id=agency.id, role_id=made.role.id))
    hc = _HttpConfig()
    hc.proxy_protocol, hc.proxy_host, hc.proxy_port = "http", "127.0.0.1", emu.port

    def obs(ak, sk, token=None):
        cred = ObsCredentials(ak, sk)
        cred.security_token = token
        return ObsClient.new_builder().with_credentials(cred).with_endpoints(
            [emu.obs_endpoint]).with_http_config(hc).build()

    admin = obs(o.access_key, o.secret_key)
    for b in ("pol-bucket-a", "pol-bucket-b"):
        admin.create_bucket(CreateBucketRequest(bucket_name=b, body=CreateBucketRequestBody(
            location=o.region)))
        admin.put_object(PutObjectRequest(bucket_name=b, object_key="k",
                                          stream=_MemoryFile(b"v")))
    cred = issue_temporary_credential(
        emu, {"id": "pol-s", "metadata": {"agency_name": "pol-agency"}})["credential"]
    node = obs(cred["access"], cred["secret"], cred["securitytoken"])
    node.get_object(GetObjectRequest(bucket_name="pol-bucket-a", object_key="k"))
    for fn in (lambda: node.get_object(GetObjectRequest(bucket_name="pol-bucket-b",
                                                        object_key="k")),
               lambda: node.put_object(PutObjectRequest(bucket_name="pol-bucket-a",
                                                        object_key="x",
                                                        stream=_MemoryFile(b"v")))):
        with pytest.raises(ClientRequestException) as e:
            fn()
        assert e.value.status_code == 403
        assert emu.requests[-1]["error"] == "AccessDenied"
    iam.delete_custom_policy(DeleteCustomPolicyRequest(role_id=made.role.id))
    with pytest.raises(ClientRequestException) as e:  # the grant went with the policy
        node.get_object(GetObjectRequest(bucket_name="pol-bucket-a", object_key="k"))
    assert e.value.status_code == 403


def test_malformed_requests_are_the_services_4xx_not_a_500(emu):
    """Found by fuzz/fuzz_huaweicloud.py: a body of the wrong shape crashed the action
    (AttributeError: a 500), and an OBS signature with a non-ASCII character crashed
    hmac.compare_digest (TypeError: a 500)."""
    import http.client

    from huaweicloudsdkecs.v2 import DeleteServersRequest, DeleteServersRequestBody, EcsClient

    with pytest.raises(ClientRequestException) as e:
        _client(emu, EcsClient).delete_servers(
            DeleteServersRequest(body=DeleteServersRequestBody(servers=["not-an-object"])))
    assert e.value.status_code == 400 and e.value.error_code == "Ecs.0005"
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
    try:
        conn.putrequest("GET", "/", skip_host=True)
        conn.putheader("Host", f"b1.obs.{emu.options.region}.emulated.invalid")
        conn.putheader("Authorization", f"OBS {emu.options.access_key}:\u00e9".encode("latin-1"))
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 403 and b"SignatureDoesNotMatch" in r.read()
    finally:
        conn.close()
