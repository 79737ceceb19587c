"""A sweep in the panel's jobs timeline, in a real JupyterLab driven in Debian's Chromium
(issue 31): one row for the whole sweep, not one per element, labelled with how many of
its elements ended and coloured by the sweep's state, its counts in the tooltip.

The sweep really runs (three elements of a notebook on the local backend, one of them
dividing by zero), over the panel's own REST API.
"""

from __future__ import annotations

import json

import pytest

from .test_sweeps_api import _nb, wait_sweep

pytestmark = pytest.mark.slow

DIVIDE = _nb(("d = 1", ["parameters"]), ("x = 1 / d", []))


def test_a_sweep_is_one_timeline_row_with_its_counts(browser, lab):
    folder = lab.root / "sweep-timeline"
    folder.mkdir(exist_ok=True)
    (folder / "divide.ipynb").write_text(json.dumps(DIVIDE))
    resp = lab.request("POST", "jobs/sweeps", json={
        "notebook": "sweep-timeline/divide.ipynb", "grid": {"d": [1, 0, 2]},
        "max_concurrent": 3})
    assert resp.status_code == 201, resp.text
    sweep = wait_sweep(lab, resp.json()["sweep"]["id"])
    assert sweep["state"] == "failed" and sweep["counts"]["failed"] == 1, sweep
    elements = {e["job"] for e in sweep["elements"]}

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{lab.url}lab/workspaces/sweep-timeline?token={lab.token}")
        page.wait_for_selector("li[data-id='jupyter-cloudtik-panel']", timeout=90_000)
        page.click("li[data-id='jupyter-cloudtik-panel']")
        page.click(".jp-CloudTik-section[data-section='jobs'] .jp-CloudTik-sectionTitle")
        timeline = page.locator(".jp-CloudTik-jobsTimeline")
        row = timeline.locator(f"g.jp-CloudTik-sweepRow[data-sweep-id='{sweep['id']}']")
        row.wait_for(state="attached", timeout=60_000)
        assert row.count() == 1
        # none of its elements has a row of its own
        jobs = timeline.locator("g.jp-CloudTik-jobRow").evaluate_all(
            "els => els.map(e => e.getAttribute('data-job-id')).filter(Boolean)")
        assert not elements & set(jobs), jobs
        label = row.locator("text.jp-CloudTik-jobLabel").text_content().strip()
        assert label.endswith(" 3/3") and label[:-4] in sweep["name"], label
        bar = row.locator("rect.jp-CloudTik-jobBar")
        assert bar.get_attribute("data-state") == "failed"
        assert "jp-mod-error" in bar.get_attribute("class")
        assert float(bar.get_attribute("width")) >= 1
        title = row.locator("title").text_content()
        assert "(sweep of 3): failed, 3/3 ended · 1 failed" in title, title
        assert not errors, errors
    finally:
        context.close()
