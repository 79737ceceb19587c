"""A Spark cluster's UI through the Jupyter server, in Chromium that reaches only the server.

One Spark cluster (a master and one worker, real JVMs) started through the server's REST
API, and one application (a driver in this process) on it.  Chromium's every connection
goes to a proxy that does not exist except the server's own host:port, so the master's
UI port is unreachable for it (checked first).  Through ``{base_url}cloudtik/spark/NAME/``
the master page renders its workers table with every resource of the page loading; its
links lead, through the master's reverse proxy, to the worker's UI and to the running
application's UI (the driver's jobs page); the panel shows a "Spark UI" link, and its New
form a Runtime field with the installed runtimes.  The route
refuses what the dashboard route refuses (no login, unknown names) and a stopped cluster
is a 404.
"""

from __future__ import annotations

import json
import os
import sys
import time
from urllib.parse import urlsplit

import pytest
import requests

from .conftest import ARTIFACTS, panel_cluster_item, unique

pytestmark = [pytest.mark.slow, pytest.mark.spark]
pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark_cluster(lab):
    name = unique("sparkui")
    config = {"cluster_name": name, "runtime": {"types": ["spark"]},
              "available_node_types": {
                  "head": {"resources": {"CPU": 0, "memory": "1GiB"}},
                  "worker": {"resources": {"CPU": 1, "memory": "1GiB"},
                             "min_workers": 1, "max_workers": 1}}}
    r = lab.request("POST", "clusters", json={"config": config})
    assert r.status_code == 202, r.text
    op = lab.wait_operation(r.json()["operation"]["id"], timeout=240)
    assert op["state"] == "succeeded", op
    info = lab.get(f"clusters/{name}").json()
    yield name, info
    r = lab.request("DELETE", f"clusters/{name}")
    if r.status_code == 202:
        lab.wait_operation(r.json()["operation"]["id"])


@pytest.fixture(scope="module")
def application(spark_cluster):
    """A running Spark application (its driver in this process) with one finished job."""
    from pyspark.sql import SparkSession

    _, info = spark_cluster
    master = info["connect_info"]["extra"]["spark"]["master_url"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("ui-through-the-server")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
    yield spark
    spark.stop()


def ui(lab, name: str, path: str = "") -> str:
    return f"{lab.url}cloudtik/spark/{name}/{path}"


def test_spark_ui_link_is_the_servers_route(lab, spark_cluster):
    name, info = spark_cluster
    prefix = urlsplit(lab.url).path + f"cloudtik/spark/{name}/"
    assert info["spark_ui_link"] == prefix
    assert info["dashboard_link"] == prefix  # a Spark-only cluster: its UI is its dashboard
    r = requests.get(ui(lab, name, "json/"), headers=lab.headers(), timeout=30)
    assert r.status_code == 200, r.text[:300]
    state = r.json()  # the master's own JSON, through the server
    assert state["url"] == info["connect_info"]["extra"]["spark"]["master_url"]
    assert state["aliveworkers"] == 1
    # the route without its trailing slash: to the master page, under the route
    r = requests.get(f"{lab.url}cloudtik/spark/{name}", headers=lab.headers(),
                     allow_redirects=False, timeout=30)
    assert r.status_code == 302 and r.headers["Location"].endswith(prefix), r.headers


def test_refused_like_the_dashboard(lab, spark_cluster):
    name, _ = spark_cluster
    r = requests.get(ui(lab, name), allow_redirects=False, timeout=30)
    assert r.status_code in (302, 403) and "Spark Master" not in r.text
    bad = requests.get(ui(lab, name), headers={"Authorization": "token nope"},
                       allow_redirects=False, timeout=30)
    assert bad.status_code in (302, 403) and "Spark Master" not in bad.text
    for path in ("nope/", "127.0.0.1:22/", "..%2F..%2Fapi/status"):
        r = requests.get(f"{lab.url}cloudtik/spark/{path}", headers=lab.headers(), timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
        assert r.json()["reason"] == "not_found"


def test_master_ui_renders_its_workers_and_leads_to_the_worker_and_app_uis(
        lab_only_browser, lab, spark_cluster, application):
    name, info = spark_cluster
    prefix = urlsplit(lab.url).path + f"cloudtik/spark/{name}/"
    app_id = application.sparkContext.applicationId
    ARTIFACTS.mkdir(exist_ok=True)
    context = lab_only_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    failed: list[str] = []
    try:
        # the master's own port is out of the browser's reach
        with pytest.raises(Exception, match="net::ERR_"):
            page.goto(info["connect_info"]["extra"]["spark"]["ui"] + "/", timeout=15_000)
        page.close()
        page = context.new_page()
        # every request of the Spark pages (not the lab page left for them) must succeed
        page.on("response", lambda r: r.status >= 400 and "/cloudtik/spark/" in r.url
                and failed.append(f"{r.status} {r.url}"))
        # (a request cut short by the next navigation is not a failure of the route)
        page.on("requestfailed", lambda r: "/cloudtik/spark/" in r.url
                and "ERR_ABORTED" not in (r.failure or "")
                and failed.append(f"failed {r.url}: {r.failure}"))
        page.goto(f"{lab.url}lab?token={lab.token}")  # the login cookie
        page.goto(ui(lab, name))
        workers = page.locator("table tbody tr", has_text="ALIVE")
        workers.first.wait_for(timeout=60_000)
        assert workers.count() == 1
        link = workers.first.locator("a").first
        assert link.get_attribute("href").startswith(prefix + "proxy/worker-")
        # Spark's stylesheet, scripts and logo came through the route
        assert page.evaluate("getComputedStyle(document.querySelector('.navbar') "
                             "|| document.body).display") != ""
        assert page.locator(f"link[href='{prefix}static/bootstrap.min.css']").count() == 1
        page.screenshot(path=str(ARTIFACTS / "spark-master-ui.png"))
        apps = page.locator("table tbody tr", has_text=app_id)
        assert apps.count() >= 1
        # the worker's UI, through the master's reverse proxy
        link.click()
        page.wait_for_selector("text=Running Executors", timeout=60_000)
        assert urlsplit(page.url).path.startswith(prefix + "proxy/worker-")
        page.screenshot(path=str(ARTIFACTS / "spark-worker-ui.png"))
        # the application's UI (the driver's, in this process): its finished job
        page.goto(ui(lab, name))
        page.locator(f"a[href^='{prefix}proxy/{app_id}']").first.click()
        try:
            page.wait_for_selector("text=Completed Jobs", timeout=60_000)
        except Exception:
            (ARTIFACTS / "spark-app-ui.html").write_text(page.url + "\n" + page.content())
            raise
        assert urlsplit(page.url).path.startswith(f"{prefix}proxy/{app_id}/jobs/")
        assert page.locator("#completedJob-table tbody tr").count() >= 1
        page.screenshot(path=str(ARTIFACTS / "spark-app-ui.png"))
        assert failed == [], failed
    finally:
        context.close()


def test_panel_shows_a_spark_ui_link(lab_only_browser, lab, spark_cluster):
    name, info = spark_cluster
    context = lab_only_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        item = panel_cluster_item(page, lab, f"sparkui-{name}", name)
        link = item.locator("a.jp-CloudTik-sparkUI")
        assert link.get_attribute("href") == info["spark_ui_link"]
        assert link.inner_text() == "Spark UI"
        assert item.locator(".jp-CloudTik-plots").count() == 0  # no Dask plots to open
        with context.expect_page() as new:
            link.click()
        tab = new.value
        tab.locator("table tbody tr", has_text="ALIVE").first.wait_for(timeout=60_000)
        tab.close()
        # the New form's Runtime field: the installed runtimes, and both together
        page.click(".jp-CloudTik-new")
        runtime = page.locator(".jp-CloudTik-form select[name='runtime']")
        runtime.wait_for(timeout=30_000)
        options = runtime.locator("option").all_inner_texts()
        assert options == ["dask", "spark", "dask,spark"], options
        assert runtime.input_value() == "dask"
    finally:
        context.close()


def test_a_stopped_cluster_is_404(lab, spark_cluster):
    name, _ = spark_cluster
    r = lab.request("DELETE", f"clusters/{name}")
    assert r.status_code == 202, r.text
    lab.wait_operation(r.json()["operation"]["id"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = requests.get(ui(lab, name, "json/"), headers=lab.headers(), timeout=30)
        if r.status_code == 404:
            break
        time.sleep(0.5)
    assert r.status_code == 404, r.text[:200]
    assert json.loads(r.text)["reason"] == "not_found"
