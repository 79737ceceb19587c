"""Sweeps in the side panel's Jobs section, in a real JupyterLab driven in Debian's Chromium.

A small sweep submitted on the local backend (as ``%hpc sweep`` or ``POST jobs/sweeps``
would) shows as one row whose progress bar and counts follow its elements, not as one row
per element; the row expands to its elements; "Results" shows the table the notebook
recorded; "Retry failed" resubmits the one failed element; "Cancel" stops a running sweep.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json

import pytest

from cloudtik_emulators.browser import confirm

from .conftest import ARTIFACTS
from .test_jobs_api import _nb
from .test_sweeps_api import LONG

# fails for alpha == 3 until the gate file exists (the retry opens it)
GATED = _nb(
    ("alpha = 1\ngate = ''\nseconds = 2.0", ["parameters"]),
    (
        "import os, time\ntime.sleep(seconds)\n"
        "if alpha == 3 and not os.path.exists(gate):\n"
        "    raise ValueError('gate closed')\n"
        "from jupyter_cloudtik.hpc import record\nrecord('score', alpha * 10)",
        [],
    ),
)


@pytest.fixture(scope="module")
def page(browser, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    folder = lab.root / "sweeps-panel"
    folder.mkdir(exist_ok=True)
    (folder / "gated.ipynb").write_text(json.dumps(GATED))
    (folder / "long.ipynb").write_text(json.dumps(LONG))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{lab.url}lab/workspaces/sweeps-panel-test?token={lab.token}")
    page.wait_for_selector("li[data-id='jupyter-cloudtik-panel']", timeout=90_000)
    page.click("li[data-id='jupyter-cloudtik-panel']")
    page.wait_for_selector(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live", timeout=30_000)
    page.click(".jp-CloudTik-section[data-section='jobs'] .jp-CloudTik-sectionTitle")
    page.wait_for_selector(".jp-CloudTik-jobs")
    page.__errors = errors  # type: ignore[attr-defined]
    yield page
    context.close()


def _segments(page, sweep_id: str) -> dict[str, int]:
    return page.evaluate(
        """id => Object.fromEntries([...document.querySelectorAll(
             `.jp-CloudTik-sweep[data-sweep-id='${id}'] .jp-CloudTik-sweepSegment`)]
             .map(s => [s.dataset.state, Number(s.dataset.count)]))""",
        sweep_id,
    )


def test_a_sweep_is_one_row_with_progress_elements_results_and_retry(page, lab, tmp_path):
    gate = tmp_path / "gate"
    resp = lab.request(
        "POST",
        "jobs/sweeps",
        json={
            "notebook": "sweeps-panel/gated.ipynb",
            "grid": {"alpha": [1, 2, 3]},
            "parameters": {"gate": str(gate)},
            "max_concurrent": 2,
        },
    )
    assert resp.status_code == 201, resp.text
    sweep = resp.json()["sweep"]
    element_jobs = [e["job"] for e in sweep["elements"]]
    row = page.locator(f".jp-CloudTik-sweep[data-sweep-id='{sweep['id']}']")
    row.wait_for(timeout=30_000)  # pushed: its elements' events made the section refresh
    # while it runs, the bar has a running part (2 at once, each 2 s or more)
    page.wait_for_function(
        f"""() => !!document.querySelector(
             ".jp-CloudTik-sweep[data-sweep-id='{sweep['id']}'] "
             + ".jp-CloudTik-sweepSegment[data-state='running']")""",
        timeout=90_000,
    )
    page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "sweep-running.png"))
    row.locator(".jp-CloudTik-clusterHead .jp-CloudTik-badge[data-state='failed']").wait_for(
        timeout=120_000
    )
    assert _segments(page, sweep["id"]) == {"succeeded": 2, "failed": 1}
    assert row.locator(".jp-CloudTik-sweepCounts").inner_text() == "3/3 ended · 1 failed"
    # one row for the sweep: its elements are not listed as jobs of their own
    for job_id in element_jobs:
        assert page.locator(f".jp-CloudTik-jobList [data-job-id='{job_id}']").count() == 0

    # expanded: one line per element, with its parameters and state
    row.locator(".jp-CloudTik-name").click()
    elements = row.locator(".jp-CloudTik-sweepElement")
    elements.nth(2).wait_for()
    assert elements.count() == 3
    states = [elements.nth(i).get_attribute("data-state") for i in range(3)]
    assert states == ["succeeded", "succeeded", "failed"], states
    assert "alpha=3" in elements.nth(2).inner_text()

    # the results table: one row per element, the recorded score of those that succeeded
    row.locator(".jp-CloudTik-sweepResultsButton").click()
    table = row.locator(".jp-CloudTik-sweepResults")
    table.locator("tbody tr").nth(2).wait_for(timeout=30_000)
    headers = table.locator("th").all_inner_texts()
    assert headers[:3] == ["element", "state", "alpha"] and "score" in headers, headers
    scores = table.locator("td[data-column='score']").all_inner_texts()
    assert scores == ["10", "20", ""], scores
    page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "sweep-results.png"))

    # retry the failed element only, with its gate open now
    gate.write_text("open")
    row.locator(".jp-CloudTik-retrySweep").click()
    row.locator(".jp-CloudTik-clusterHead .jp-CloudTik-badge[data-state='succeeded']").wait_for(
        timeout=120_000
    )
    page.wait_for_function(
        f"""() => document.querySelector(
             ".jp-CloudTik-sweep[data-sweep-id='{sweep['id']}'] .jp-CloudTik-sweepSegment"
             )?.dataset.count === '3'""",
        timeout=30_000,
    )
    after = lab.get(f"jobs/sweeps/{sweep['id']}").json()
    assert [e["attempts"] for e in after["elements"]] == [1, 1, 2], after
    assert row.locator(".jp-CloudTik-retrySweep").count() == 0
    # results read again: the retried element's score is there
    row.locator(".jp-CloudTik-sweepResultsButton").click()  # hide
    row.locator(".jp-CloudTik-sweepResultsButton").click()  # read again
    page.wait_for_function(
        f"""() => [...document.querySelectorAll(
             ".jp-CloudTik-sweep[data-sweep-id='{sweep['id']}'] td[data-column='score']")]
             .map(td => td.textContent).join(',') === '10,20,30'""",
        timeout=30_000,
    )


def test_cancel_a_sweep_from_the_panel(page, lab):
    resp = lab.request(
        "POST", "jobs/sweeps",
        json={"notebook": "sweeps-panel/long.ipynb", "zip": {"seconds": [300, 301]}},
    )
    assert resp.status_code == 201, resp.text
    sweep = resp.json()["sweep"]
    row = page.locator(f".jp-CloudTik-sweep[data-sweep-id='{sweep['id']}']")
    row.wait_for(timeout=30_000)
    row.locator(".jp-CloudTik-clusterHead .jp-CloudTik-badge[data-state='running']").wait_for(
        timeout=90_000
    )
    confirm(page, row.locator(".jp-CloudTik-cancelSweep"), sweep["id"])
    row.locator(".jp-CloudTik-clusterHead .jp-CloudTik-badge[data-state='cancelled']").wait_for(
        timeout=60_000
    )
    assert _segments(page, sweep["id"]) == {"cancelled": 2}
    assert lab.get(f"jobs/sweeps/{sweep['id']}").json()["state"] == "cancelled"


def test_no_errors_in_the_browser_console(page):
    ours = [e for e in page.__errors if "cloudtik" in e.lower()]
    assert not ours, ours
