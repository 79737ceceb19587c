"""The panel's charts in a real JupyterLab, driven in Debian's Chromium (issue 28.6).

A local cluster works (a Dask computation from here), two HPC jobs run (one fails, one
succeeds): the cluster's entry shows its workers' CPU and memory over time, measured by
its real Dask scheduler and sampled by the server, beside workers and cost; the Jobs
section shows a timeline with a bar per job coloured by its state.  Every chart has its
axes labelled (units, times of day).  Its screenshots are docs/images/panel-charts.png and
docs/images/jobs-timeline.png (``make doc-images``).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from .conftest import doc_image, unique
from .test_jobs_api import _nb

pytestmark = pytest.mark.slow

QUICK = _nb(("n = 3", ["parameters"]), ("import time\ntime.sleep(n)\nprint('done')", []))
FAIL = _nb(("x = 1", []), ("y = x / 0", []))

CLOCK = re.compile(r"^\d\d:\d\d(:\d\d)?$")

TEXTS = """el => [...el.querySelectorAll('text')].map(t => t.textContent.trim())"""


def _load_seen(lab, name: str, scheduler: str, timeout: float = 60) -> list[dict]:
    """Keep the cluster's worker computing until the server has sampled its CPU above
    idle (one of its two threads spinning: up to 50 %, less on a loaded machine; an idle
    worker reads 0-3 %), then stop; the samples measured so far."""
    from distributed import Client

    def spin(seconds: float) -> int:  # nested: pickled by value, the worker needs no tests
        end, n = time.time() + seconds, 0
        while time.time() < end:
            n += sum(range(1000))
        return n

    deadline = time.monotonic() + timeout
    with Client(scheduler, timeout=30) as client:
        fut = client.submit(spin, timeout, pure=False)
        try:
            while True:
                samples = lab.get(f"clusters/{name}/usage").json()["samples"]
                measured = [s for s in samples if s["cpu"] is not None]
                if any(s["cpu"] >= 5 for s in measured):
                    return measured
                assert fut.status == "pending", fut.exception()
                assert time.monotonic() < deadline, samples
                time.sleep(1)
        finally:
            fut.cancel()


def test_cluster_load_and_jobs_timeline_with_labelled_axes(browser, lab):
    name = unique("charts")
    folder = lab.root / "charts"
    folder.mkdir(exist_ok=True)
    (folder / "quick.ipynb").write_text(json.dumps(QUICK))
    (folder / "fail.ipynb").write_text(json.dumps(FAIL))
    r = lab.request("POST", "clusters", json={"name": name, "workers": 1})
    assert r.status_code == 202, r.text
    context = browser.new_context(viewport={"width": 1200, "height": 900}, device_scale_factor=2)
    try:
        assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
        jobs = {}
        for nb in ("quick", "fail"):
            resp = lab.request("POST", "jobs", json={"notebook": f"charts/{nb}.ipynb"})
            assert resp.status_code == 202, resp.text
            jobs[nb] = resp.json()["job"]["id"]
        scheduler = lab.get(f"clusters/{name}").json()["scheduler_address"]
        measured = _load_seen(lab, name, scheduler)
        assert all(0 <= s["cpu"] <= 100 and s["memory"] > 0 for s in measured), measured

        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{lab.url}lab/workspaces/charts-test?token={lab.token}")
        page.wait_for_selector("li[data-id='jupyter-cloudtik-panel']", timeout=90_000)
        page.click("li[data-id='jupyter-cloudtik-panel']")
        page.click(".jp-CloudTik-section[data-section='jobs'] .jp-CloudTik-sectionTitle")
        item = page.locator(f".jp-CloudTik-cluster[data-name='{name}']")
        item.wait_for(timeout=30_000)

        # the server has sampled the scheduler's metrics (every 10 s), the panel shows them
        load = item.locator(".jp-CloudTik-loadChart")
        load.wait_for(timeout=30_000)
        assert int(load.get_attribute("data-measured")) >= 1
        cpu = load.locator("polyline.jp-CloudTik-cpuLine")
        assert cpu.count() >= 1 and cpu.first.get_attribute("points")
        assert load.locator("polyline.jp-CloudTik-memoryLine").count() >= 1
        texts = load.evaluate(TEXTS)
        assert "CPU %" in texts and "100" in texts and "memory" in texts, texts
        assert any(re.fullmatch(r"\d+(\.\d)? (MiB|GiB)", t) for t in texts), texts
        assert len([t for t in texts if CLOCK.match(t)]) >= 2, texts  # times of day
        # the spin the server measured is drawn: the line's highest point is at least as
        # high as the highest CPU figure seen above (y from 34 at 0 % to 2 at 100 %)
        ys = [
            float(p.split(",")[1])
            for line in cpu.all()
            for p in line.get_attribute("points").split()
        ]
        assert min(ys) <= 34 - max(s["cpu"] for s in measured) / 100 * 32 + 0.1, ys
        workers = item.locator(".jp-CloudTik-workersChart")
        wtexts = workers.evaluate(TEXTS)
        assert "workers" in wtexts and "cost so far" in wtexts, wtexts
        assert len([t for t in wtexts if CLOCK.match(t)]) >= 2, wtexts
        legend = item.locator(".jp-CloudTik-loadLegend").inner_text()
        assert re.search(r"CPU \d+%", legend) and re.search(r"memory \d", legend), legend
        # both charts fit the cluster's box
        outer = item.bounding_box()
        for chart in (workers, load):
            box = chart.bounding_box()
            assert box["x"] + box["width"] <= outer["x"] + outer["width"] + 0.5, (box, outer)

        # the jobs timeline: a bar per job, coloured by its final state
        timeline = page.locator(".jp-CloudTik-jobsTimeline")
        for nb, state, kind in (("quick", "succeeded", "ok"), ("fail", "failed", "error")):
            bar = timeline.locator(
                f".jp-CloudTik-jobRow[data-job-id='{jobs[nb]}'] "
                f"rect.jp-CloudTik-jobBar[data-state='{state}']"
            )
            bar.wait_for(state="attached", timeout=120_000)
            assert f"jp-mod-{kind}" in bar.get_attribute("class")
            assert float(bar.get_attribute("width")) >= 1
        fills = {
            nb: timeline.locator(
                f".jp-CloudTik-jobRow[data-job-id='{jobs[nb]}'] rect.jp-CloudTik-jobBar"
            ).evaluate("el => getComputedStyle(el).fill")
            for nb in jobs
        }
        assert fills["quick"] != fills["fail"], fills  # green and red, not one colour
        ttexts = timeline.evaluate(TEXTS)
        assert "job" in ttexts and "quick" in ttexts and "fail" in ttexts, ttexts
        assert len([t for t in ttexts if CLOCK.match(t)]) >= 2, ttexts
        assert not errors, errors

        doc_image(item, "panel-charts")
        doc_image(page.locator(".jp-CloudTik-section[data-section='jobs']"), "jobs-timeline")
    finally:
        context.close()
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])
