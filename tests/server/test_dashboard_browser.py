"""A cluster's dashboard in Chromium that reaches only the Jupyter server.

Chromium is started with every connection going to a proxy that does not exist, except
the Jupyter server's own host:port (``--proxy-bypass-list`` without the implicit loopback
bypass): the cluster's scheduler and dashboard ports are unreachable for it, which the
test checks first.  Through the server the status page renders and its Bokeh plots (drawn
from websocket data) show the workload's tasks; an individual plot opens from the panel as
a JupyterLab tab and is back after a reload (the layout restorer).
"""

from __future__ import annotations

import threading
import time

import pytest

from .conftest import (
    ARTIFACTS,
    coloured_fraction,
    panel_cluster_item,
    unique,
    wait_for_plot_content,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(lab):
    name = unique("dashb")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 1})
    assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
    info = lab.get(f"clusters/{name}").json()
    stop = threading.Event()

    def workload() -> None:  # tasks keep the task stream and progress plots busy
        from distributed import Client

        with Client(info["scheduler_address"], timeout=30) as c:
            while not stop.is_set():
                futs = c.map(time.sleep, [0.05] * 20, pure=False)
                c.gather(futs)

    t = threading.Thread(target=workload, daemon=True)
    t.start()
    yield name, info
    stop.set()
    t.join(30)
    r = lab.request("DELETE", f"clusters/{name}")
    if r.status_code == 202:
        lab.wait_operation(r.json()["operation"]["id"])


def test_the_browser_cannot_reach_the_cluster_itself(lab_only_browser, lab, cluster):
    _, info = cluster
    page = lab_only_browser.new_page()
    try:
        with pytest.raises(Exception, match="net::ERR_"):
            page.goto(info["connect_info"]["http_address"] + "/status", timeout=15_000)
    finally:
        page.close()
    # a page of its own: the failed one may still be navigating to Chromium's error page
    page = lab_only_browser.new_page()
    try:
        page.goto(f"{lab.url}api/status?token={lab.token}")  # the server itself: reachable
        assert "started" in page.content()
    finally:
        page.close()


def test_status_page_renders_its_plots_through_the_server(lab_only_browser, lab, cluster):
    name, _ = cluster
    ARTIFACTS.mkdir(exist_ok=True)
    context = lab_only_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}")  # the login cookie
        wait_for_plot_content(page, f"{lab.url}cloudtik/dashboard/{name}/status",
                              "dashboard-status.png", "no plot content in the screenshot")
        # the task stream's own page: its plot comes over the websocket
        wait_for_plot_content(
            page, f"{lab.url}cloudtik/dashboard/{name}/individual-task-stream",
            "dashboard-task-stream.png", "task stream shows no tasks")
    finally:
        context.close()


def test_a_plot_opens_as_a_lab_tab_and_survives_reload(lab_only_browser, lab, cluster):
    name, _ = cluster
    context = lab_only_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        item = panel_cluster_item(page, lab, f"dash-{name}", name)
        item.locator(".jp-CloudTik-plots").select_option("individual-task-stream")
        tab = ".jp-CloudTik-dashboardTab[data-page='individual-task-stream']"
        page.wait_for_selector(tab, timeout=30_000)
        # a waiting state (JupyterLab's spinner) until the page has loaded, then the page
        # (read at once, in the page: the load may end between two reads)
        state, spinner = page.eval_on_selector(
            tab, "n => [n.dataset.state, !!n.querySelector('.jp-Spinner')]")
        assert (state, spinner) in (("loading", True), ("ready", False)), (state, spinner)
        page.wait_for_selector(f"{tab}[data-state='ready']", timeout=60_000)
        assert page.locator(f"{tab} .jp-Spinner").count() == 0
        frame = page.frame_locator(f"{tab} iframe")
        frame.locator("canvas").first.wait_for(timeout=60_000)
        page.wait_for_timeout(3000)  # the workspace is saved after a short delay
        shot = page.locator(tab).screenshot(path=str(ARTIFACTS / "dashboard-lab-tab.png"))
        assert coloured_fraction(shot) > 0.005
        page.reload()
        page.wait_for_selector(".jp-LabShell", timeout=90_000)
        page.wait_for_selector(tab, timeout=60_000)
        assert page.locator(".lm-TabBar-tabLabel", has_text=f"{name}: Task stream").count()
        page.frame_locator(f"{tab} iframe").locator("canvas").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "dashboard-lab-tab-restored.png"))
    finally:
        context.close()


def test_panel_adaptive_switch(lab_only_browser, lab, cluster):
    name, _ = cluster
    context = lab_only_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        item = panel_cluster_item(page, lab, f"adapt-{name}", name)
        # workers over the cluster's life, and cost so far, from the server's samples
        # "attached", not "visible": a steady worker count draws a flat line, whose
        # bounding box has no height, and Playwright calls a zero-height box hidden
        workers = item.locator(".jp-CloudTik-usageChart polyline.jp-CloudTik-workersLine")
        workers.wait_for(state="attached", timeout=30_000)
        points = workers.get_attribute("points")
        assert len(points.split()) >= 2, points
        assert "so far" in item.locator(".jp-CloudTik-cost").inner_text()
        # the second line, cost so far, on its own axis and labelled
        cost = item.locator(".jp-CloudTik-usageChart polyline.jp-CloudTik-costLine")
        assert len(cost.get_attribute("points").split()) >= 2
        assert "cost so far" in cost.locator("title").text_content()
        assert "cost so far" in item.locator(".jp-CloudTik-workersChart").get_attribute(
            "aria-label")
        assert "cost" in item.locator(".jp-CloudTik-usageLegend").inner_text()
        item.screenshot(path=str(ARTIFACTS / "panel-usage-chart.png"))
        item.locator(".jp-CloudTik-scale").click()
        item.locator(".jp-CloudTik-adaptive").check()
        item.locator("input[name='adapt-minimum']").fill("0")
        item.locator("input[name='scale-workers']").fill("1")
        item.locator(".jp-CloudTik-apply").click()
        deadline = time.monotonic() + 30
        spec = None
        while time.monotonic() < deadline and spec is None:
            spec = lab.get(f"clusters/{name}/adapt").json()["adaptive"]
            time.sleep(0.3)
        assert spec and (spec["minimum"], spec["maximum"]) == (0, 1), spec
        # beyond the cluster's max_workers: the server's message, nothing changed
        item.locator(".jp-CloudTik-scale").click()
        item.locator(".jp-CloudTik-adaptive").check()
        item.locator("input[name='scale-workers']").fill("9")
        item.locator(".jp-CloudTik-apply").click()
        page.wait_for_selector(".jp-CloudTik-error", timeout=30_000)
        assert "maximum: 9 is more than" in page.locator(".jp-CloudTik-error").first.inner_text()
        assert lab.get(f"clusters/{name}/adapt").json()["adaptive"]["maximum"] == 1
    finally:
        lab.request("DELETE", f"clusters/{name}/adapt")
        context.close()
