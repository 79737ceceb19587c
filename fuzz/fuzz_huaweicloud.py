"""The Huawei Cloud emulator's request handling (cloudtik_emulators/huaweicloud): request signatures
as the API gateway and OBS check them (signing.py, before anything else reads a request)
and the cloud's actions (cloud.py) given any path parameters, query and JSON body.

The emulator is what the huaweicloud provider's tests and the demo run against, and it can
be run by users (``jupyter-cloudtik-emulator``): a request it cannot handle must be the
cloud's own error answer, not a 500 that no real Huawei Cloud gives.

Properties: a signature check raises nothing but ``SignatureError`` (headers as tornado
hands them: latin-1 text); an action raises nothing but the cloud's ``ApiError`` and
answers JSON.
"""

from __future__ import annotations

import ipaddress
import json
import logging

import atheris
from _harness import choose, instrumented, main

with instrumented():
    from cloudtik_emulators.huaweicloud.cloud import Call, Cloud, dispatch, dumps
    from cloudtik_emulators.huaweicloud.errors import ApiError
    from cloudtik_emulators.huaweicloud.server import ROUTES
    from cloudtik_emulators.huaweicloud.signing import (
        SignatureError,
        verify_obs_signature,
        verify_sdk_signature,
    )

SECRETS = {"AK123": "SK456"}
logging.getLogger("cloudtik_emulators.huaweicloud").disabled = True  # 400s, each logged
PRIVATE = ipaddress.ip_network("127.200.0.0/26")
PUBLIC = ipaddress.ip_network("127.200.1.0/28")


def _latin1(fdp: atheris.FuzzedDataProvider, n: int = 80) -> str:
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, n)).decode("latin-1")


def _signatures(fdp: atheris.FuzzedDataProvider) -> None:
    headers = {"authorization": _latin1(fdp, 160), "x-sdk-date": _latin1(fdp, 20),
               "host": _latin1(fdp, 20), _latin1(fdp, 12).lower(): _latin1(fdp, 20)}
    if fdp.ConsumeBool():
        headers["x-sdk-date"] = "20261201T200000Z"
    query = [(_latin1(fdp, 10), _latin1(fdp, 10)) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    path = "/" + _latin1(fdp, 40)
    try:
        verify_sdk_signature("GET", path, query, headers, fdp.ConsumeBytes(20), SECRETS)
    except SignatureError:
        pass
    headers["authorization"] = "OBS AK123:" + _latin1(fdp, 40) if fdp.ConsumeBool() \
        else headers["authorization"]
    try:
        verify_obs_signature("PUT", _latin1(fdp, 20) or None, _latin1(fdp, 30), query,
                             headers, SECRETS)
    except SignatureError:
        pass


def _account() -> tuple[Cloud, dict[str, str]]:
    """A fresh account with a VPC, a subnet and a security group, and their ids: a
    parameter or body text ``@vpc``, ``@subnet``, ``@sg`` or ``@project`` becomes one."""
    cloud = Cloud(region="r1", project_id="p1", domain_id="d1", private_net=PRIVATE,
                  public_net=PUBLIC, boot_seconds=0, settle_seconds=0)

    def call(action: str, body: dict) -> dict:
        return getattr(cloud, action)(Call(action=action, service="vpc", project_id="p1",
                                           body=body))[1]

    vpc = call("create_vpc", {"vpc": {"name": "v", "cidr": "192.168.0.0/16"}})["vpc"]["id"]
    subnet = call("create_subnet", {"subnet": {"name": "s", "vpc_id": vpc,
                                               "cidr": "192.168.1.0/24",
                                               "gateway_ip": "192.168.1.1"}})["subnet"]["id"]
    sg = call("create_security_group",
              {"security_group": {"name": "g", "vpc_id": vpc}})["security_group"]["id"]
    return cloud, {"@vpc": vpc, "@subnet": subnet, "@sg": sg, "@project": "p1"}


def _ids(text: str, ids: dict[str, str]) -> str:
    for k, v in ids.items():
        text = text.replace(k, v)
    return text


def _action(data: bytes) -> None:
    """ROUTE-BYTE BODY [NUL PARAM]... (params in the route's order)."""
    route, rest = choose(data, len(ROUTES))
    _method, template, action, service = ROUTES[route]
    body_bytes, *param_bytes = rest.split(b"\0")
    cloud, ids = _account()
    names = [p.split("}")[0] for p in template.split("{")[1:]]
    given = [_ids(b.decode("latin-1"), ids) for b in param_bytes]
    params = {n: (given[i] if i < len(given) else ("p1" if n == "project_id" else "x"))
              for i, n in enumerate(names)}
    try:
        body = json.loads(_ids(body_bytes.decode("utf-8", "replace"), ids))
    except (ValueError, RecursionError):  # the server answers 400 before the cloud sees it
        body = None
    call = Call(action=action, service=service, project_id="p1", params=params, body=body,
                headers={})
    try:
        with cloud.lock:
            cloud.advance()
            _status, out = dispatch(cloud, call)
    except ApiError as e:
        assert 400 <= e.status < 500, (e.status, e.message)
        return
    if isinstance(out, dict):
        out.pop("_stopped", None)
    dumps(out)


def one(data: bytes) -> None:
    which, rest = choose(data, 2)
    if which == 0:
        _signatures(atheris.FuzzedDataProvider(rest))
    else:
        _action(rest)


if __name__ == "__main__":
    main(one)
