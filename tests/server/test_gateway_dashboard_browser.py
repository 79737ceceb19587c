"""A dask-gateway cluster's dashboard in Chromium that reaches only the Jupyter server.

A real dask-gateway-server (local backend) runs the cluster; the Jupyter server started
here brings it up through its REST API and serves its dashboard under
``cloudtik/dashboard/NAME/``.  Chromium's every connection goes to a proxy that does not
exist except the Jupyter server's own host:port, so neither the gateway's proxy nor the
scheduler is reachable for it (checked first); through the server the status page renders
with plot content from the workload's tasks, and its websocket-fed task stream shows them.
A busy scheduler answers 500 for its identity (task metrics Dask cannot serialise) and a
gateway's schedulers serve no ``/api/v1``: this test found the proxy refusing such a
cluster (404) and keeps it from coming back.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import pytest

from cloudtik_emulators.browser import chromium

from .conftest import ARTIFACTS, _start_server, _stop, wait_for_plot_content

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from cloudtik_emulators.dask_gateway import GatewayServer

    server = GatewayServer(tmp_path_factory.mktemp("gateway")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gwlab(tmp_path_factory, gateway):
    tmp = tmp_path_factory.mktemp("gwlab")
    server = _start_server(tmp, "lab", [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
    ], {"DASK_GATEWAY_PASSWORD": gateway.password})
    yield server
    problems = _stop(server)
    assert not problems, problems


def test_gateway_dashboard_only_through_the_server(gateway, gwlab):
    from dask_gateway import BasicAuth, Gateway

    config = {"cluster_name": "gwdash",
              "provider": {"type": "dask-gateway", "address": gateway.address,
                           "auth": {"type": "basic", "username": "alice"}},
              "available_node_types": {
                  "head": {"resources": {"CPU": 0}},
                  "worker": {"resources": {"CPU": 1}, "min_workers": 1, "max_workers": 2}},
              "head_node_type": "head"}
    r = gwlab.request("POST", "clusters", json={"config": config, "workers": 1})
    assert r.status_code == 202, r.text
    assert gwlab.wait_operation(r.json()["operation"]["id"], 180)["state"] == "succeeded"
    info = gwlab.get("clusters/gwdash").json()
    # the link every face shows is the server's, not the gateway's
    assert info["dashboard_link"] == "/cloudtik/dashboard/gwdash/status", info
    gw_name = gwlab.get("clusters/gwdash/connect").json()["connect_info"]["extra"][
        "gateway_cluster"]
    stop = threading.Event()

    def workload() -> None:  # the user's tasks, through the gateway as dask-gateway does
        g = Gateway(gateway.address, auth=BasicAuth("alice", gateway.password))
        cluster = g.connect(gw_name, shutdown_on_close=False)
        client = cluster.get_client(set_as_default=False)
        try:
            while not stop.is_set():
                client.gather(client.map(time.sleep, [0.05] * 20, pure=False))
        finally:
            client.close()
            cluster.close()
            g.close()

    t = threading.Thread(target=workload, daemon=True)
    t.start()
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        with chromium(reach_only=urlsplit(gwlab.url).netloc) as b:
            page = b.new_page()
            with pytest.raises(Exception, match="net::ERR_"):  # the gateway itself
                page.goto(gateway.address + "/api/health", timeout=15_000)
            page.close()
            context = b.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.goto(f"{gwlab.url}lab?token={gwlab.token}")  # the login cookie
            wait_for_plot_content(page, f"{gwlab.url}cloudtik/dashboard/gwdash/status",
                                  "gateway-dashboard.png", "no plot content")
            wait_for_plot_content(
                page, f"{gwlab.url}cloudtik/dashboard/gwdash/individual-task-stream",
                "gateway-task-stream.png", "task stream shows no tasks")
            context.close()
            # no login, no dashboard (a fresh context has no cookie)
            context = b.new_context()
            r = context.request.get(f"{gwlab.url}cloudtik/dashboard/gwdash/status",
                                    max_redirects=0)
            assert r.status in (302, 403), r.status
            context.close()
    finally:
        stop.set()
        t.join(30)
        r = gwlab.request("DELETE", "clusters/gwdash")
        if r.status_code == 202:
            gwlab.wait_operation(r.json()["operation"]["id"], 120)
