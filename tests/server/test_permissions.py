"""Every route of the extension refuses a caller without login and a caller whose
authorizer denies the ``cloudtik`` permission; the kernel token opens these routes only."""

from __future__ import annotations

import re

import pytest
import requests

from jupyter_cloudtik.api.routes import build_routes, route_table

METHODS = ("get", "post", "put", "patch", "delete")
FILL = {"name": "some-cluster", "op_id": "some-op", "fmt": "yaml", "backend": "s3",
        "reservation_id": "some-reservation", "job_id": "some-job", "sweep_id": "some-sweep",
        "kid": "some-kernel"}
#: routes that take a token of their own, never the server's or a login: an HPC kernel's
#: node asks with that kernel's token (hpc/kernels/node_access.py; its own tests:
#: tests/hpc/test_hpc_kernel_storage.py)
OWN_TOKEN = {"KernelNodeLsHandler", "KernelNodeGetHandler", "KernelNodePutHandler"}


def _concrete(pattern: str) -> str:
    """A real path matching a route pattern."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: FILL[m.group(1)], pattern)
    path = path.replace(r"(?:/.*)?", "/not-a-route").replace("\\.", ".")
    assert re.fullmatch(pattern, path), (pattern, path)
    return path


def _routes() -> list[tuple[str, str, str]]:
    """(method, path, handler) for every method every handler of the extension defines."""
    from jupyter_server.base.handlers import APIHandler

    out = []
    for pattern, handler in route_table():
        for method in METHODS:
            impl = getattr(handler, method)
            if impl is not getattr(APIHandler, method):
                out.append((method.upper(), _concrete(pattern), handler.__name__))
    return out


ROUTES = _routes()


def test_the_extension_registers_exactly_these_routes():
    from jupyter_cloudtik.api.dashboard import DashboardHandler
    from jupyter_cloudtik.api.spark_ui import SparkUIHandler

    registered = build_routes("/base/")
    # the dashboard and Spark UI proxies (their own auth: tests/server/test_dashboard_proxy.py,
    # tests/server/test_spark_ui_browser.py), then the API
    proxies = (DashboardHandler, SparkUIHandler)
    dash = [(p, h) for p, h in registered if h is DashboardHandler]
    spark = [(p, h) for p, h in registered if h is SparkUIHandler]
    api = [(p, h) for p, h in registered if h not in proxies]
    assert dash and all(p.startswith("/base/cloudtik/dashboard/") for p, _h in dash)
    assert spark and all(p.startswith("/base/cloudtik/spark/") for p, _h in spark)
    assert [h for _p, h in api] == [h for _p, h in route_table()]
    assert all(p.startswith("/base/cloudtik/api") for p, _h in api)
    assert len(ROUTES) >= 17


@pytest.mark.parametrize(("method", "path", "handler"), ROUTES,
                         ids=[f"{m} {p}" for m, p, _h in ROUTES])
def test_route_rejects_without_login_and_without_permission(guarded, method, path, handler):
    url = guarded.url.rstrip("/") + "/cloudtik/api" + path
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None

    anonymous = requests.request(method, url, data=body, timeout=30)
    assert anonymous.status_code == 403, (handler, anonymous.text)
    assert "not authenticated" in anonymous.json()["message"]

    denied = requests.request(method, url, data=body, timeout=30,
                              headers=guarded.headers(**{"X-Deny-CloudTik": "1"}))
    assert denied.status_code == 403, (handler, denied.text)
    assert "not authorized" in denied.json()["message"] or handler in OWN_TOKEN

    # the same request with the permission is not refused (so the 403s above are ours);
    # a route of its own token refuses the server's too
    allowed = requests.request(method, url, data=body, timeout=30, headers=guarded.headers())
    if handler in OWN_TOKEN:
        assert allowed.status_code == 403, (handler, allowed.text)
    else:
        assert allowed.status_code != 403, (handler, allowed.text)


def test_wrong_token_and_cookie_without_xsrf_are_refused(guarded):
    url = guarded.api_url + "clusters"
    assert requests.get(url, headers={"Authorization": "token nope"},
                        timeout=30).status_code == 403
    # a browser session (login cookie) must send the XSRF token on writes
    s = requests.Session()
    s.get(guarded.url + f"login?token={guarded.token}", timeout=30)
    assert s.get(url, timeout=30).status_code == 200
    resp = s.post(url, data='{"nme": 1}', timeout=30)
    assert resp.status_code == 403 and "_xsrf" in resp.json()["message"]
    with_xsrf = s.post(url, data='{"nme": 1}', timeout=30,
                       headers={"X-XSRFToken": s.cookies["_xsrf"]})
    assert with_xsrf.status_code == 400  # past authentication, refused for its body


def test_kernel_token_opens_only_the_cloudtik_routes(lab):
    from jupyter_client.manager import KernelManager  # noqa: F401  (same env as kernels)

    kernel_token = _kernel_env(lab)["CLOUDTIK_API_TOKEN"]
    as_kernel = {"Authorization": f"token {kernel_token}"}
    assert requests.get(lab.api_url + "clusters", headers=as_kernel, timeout=30).ok
    for other in ("api/status", "api/contents", "api/kernels", "api/sessions", "lab/api/settings"):
        resp = requests.get(lab.url + other, headers=as_kernel, timeout=30)
        assert resp.status_code == 403, (other, resp.status_code)


def _kernel_env(lab) -> dict[str, str]:
    """The cloudtik variables a kernel of the server really gets (read from the kernel)."""
    from .kernels import running_kernel

    with running_kernel(lab, "perm.ipynb") as kernel:
        out = kernel.run("import os, json; print(json.dumps({k: v for k, v in os.environ"
                         ".items() if k.startswith('CLOUDTIK_API')}))")
    import json

    return json.loads(out.strip().splitlines()[-1])
