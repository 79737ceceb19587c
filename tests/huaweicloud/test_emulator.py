"""The emulator checks what Huawei Cloud checks, with the official SDK as its client."""

from __future__ import annotations

import base64
import json
import time
import urllib.request

import pytest
from huaweicloudsdkcore.auth.credentials import BasicCredentials
from huaweicloudsdkcore.exceptions.exceptions import ClientRequestException
from huaweicloudsdkcore.http.http_config import HttpConfig

from jupyter_cloudtik.testing.huaweicloud import Emulator, EmulatorControl, Options


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
        user_data=base64.b64encode(b"#!/bin/sh\ntrue\n").decode()))
    r1 = ecs.create_post_paid_servers(CreatePostPaidServersRequest(x_client_token="tok",
                                                                   body=body))
    r2 = ecs.create_post_paid_servers(CreatePostPaidServersRequest(x_client_token="tok",
                                                                   body=body))
    assert r1.server_ids == r2.server_ids and len(r1.server_ids) == 7
    first = ecs.list_servers_details(ListServersDetailsRequest(tags="k=v", limit=100))
    assert first.count == 7 and {s.status for s in first.servers} == {"BUILD"}
    deadline = time.monotonic() + 10
    while ecs.show_job(ShowJobRequest(job_id=r1.job_id)).status != "SUCCESS":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pages = [ecs.list_servers_details(ListServersDetailsRequest(tags="k=v", limit=3,
                                                                offset=p)).servers
             for p in (1, 2, 3)]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert {s.id for p in pages for s in p} == set(r1.server_ids)
    assert all(s.status == "ACTIVE" for p in pages for s in p)
    assert ecs.list_servers_details(ListServersDetailsRequest(tags="k=other")).count == 0
    ecs.delete_servers(DeleteServersRequest(body=DeleteServersRequestBody(
        servers=[ServerId(id=s) for s in r1.server_ids], delete_publicip=True)))
    assert ecs.list_servers_details(ListServersDetailsRequest(tags="k=v")).count == 0


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
    good.delete_bucket(DeleteBucketRequest(bucket_name="emu-bucket-1"))
    assert emu.cloud.summary()["buckets"] == []


def test_state_summary_is_json(emu):
    json.dumps(emu.cloud.summary())
