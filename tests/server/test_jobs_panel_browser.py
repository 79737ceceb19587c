"""The side panel's Jobs section in a real JupyterLab, driven in Debian's Chromium.

Jobs submitted through the REST API (as a notebook's ``%hpc submit`` would) appear with
state badges; selecting one tails its log while it runs; a finished job's executed
notebook opens in JupyterLab; a running job is cancelled from the panel; a failing
notebook shows its error cell.  Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json

import pytest

from cloudtik_emulators.browser import confirm

from .conftest import ARTIFACTS
from .test_jobs_api import LONG, _nb

TICKS = _nb(("n = 8\ndelay = 0.8", ["parameters"]),
            ("import time\nfor i in range(n):\n    print(f'tick {i}', flush=True)\n"
             "    time.sleep(delay)", []))
FAIL = _nb(("x = 1", []), ("y = x / 0", []))


@pytest.fixture(scope="module")
def page(browser, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    folder = lab.root / "jobs-panel"
    folder.mkdir(exist_ok=True)
    for name, nb in (("ticks", TICKS), ("long", LONG), ("fail", FAIL)):
        (folder / f"{name}.ipynb").write_text(json.dumps(nb))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a workspace of its own: the layout this test leaves (panel open) is not restored in
    # the other browser tests, which use the default workspace
    page.goto(f"{lab.url}lab/workspaces/jobs-panel-test?token={lab.token}")
    page.wait_for_selector("li[data-id='jupyter-cloudtik-panel']", timeout=90_000)
    page.click("li[data-id='jupyter-cloudtik-panel']")
    page.wait_for_selector(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live", timeout=30_000)
    page.click(".jp-CloudTik-section[data-section='jobs'] .jp-CloudTik-sectionTitle")
    page.wait_for_selector(".jp-CloudTik-jobs")
    page.__errors = errors  # type: ignore[attr-defined]
    yield page
    context.close()


def submit(lab, notebook: str) -> str:
    resp = lab.request("POST", "jobs", json={"notebook": f"jobs-panel/{notebook}"})
    assert resp.status_code == 202, resp.text
    return resp.json()["job"]["id"]


def test_jobs_badges_live_log_and_result(page, lab):
    job_id = submit(lab, "ticks.ipynb")
    row = page.locator(f".jp-CloudTik-job[data-job-id='{job_id}']")
    row.wait_for(timeout=30_000)  # pushed: the job's events made the section refresh
    row.click()
    # the log grows while the badge says running
    page.wait_for_function(
        f"""() => {{
          const row = document.querySelector(".jp-CloudTik-job[data-job-id='{job_id}']");
          const badge = row?.querySelector('.jp-CloudTik-badge')?.dataset.state;
          const log = row?.querySelector('.jp-CloudTik-log')?.textContent ?? '';
          return badge === 'running' && log.includes('tick 1') && !log.includes('tick 7');
        }}""", timeout=90_000)
    page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "jobs-running.png"))
    row.locator(".jp-CloudTik-badge[data-state='succeeded']").wait_for(timeout=90_000)
    page.wait_for_function(
        f"() => document.querySelector(\".jp-CloudTik-job[data-job-id='{job_id}'] "
        ".jp-CloudTik-log\")?.textContent.includes('tick 7')", timeout=30_000)
    assert lab.get(f"jobs/{job_id}").json()["state"] == "succeeded"

    row.locator(".jp-CloudTik-openResult").click()
    tab = page.locator(".lm-TabBar-tabLabel", has_text="ticks.out.ipynb")
    tab.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".some(e => e.textContent.includes('tick 7'))", timeout=60_000)
    assert (lab.root / "hpc-jobs" / job_id / "ticks.out.ipynb").exists()
    page.screenshot(path=str(ARTIFACTS / "jobs-result.png"))


def test_cancel_from_the_panel(page, lab):
    job_id = submit(lab, "long.ipynb")
    row = page.locator(f".jp-CloudTik-job[data-job-id='{job_id}']")
    row.wait_for(timeout=30_000)
    row.click()
    row.locator(".jp-CloudTik-badge[data-state='running']").wait_for(timeout=90_000)
    confirm(page, row.locator(".jp-CloudTik-cancelJob"), job_id)
    row.locator(".jp-CloudTik-badge[data-state='cancelled']").wait_for(timeout=60_000)
    assert lab.get(f"jobs/{job_id}").json()["state"] == "cancelled"


def test_failing_notebook_shows_its_error_cell(page, lab):
    job_id = submit(lab, "fail.ipynb")
    row = page.locator(f".jp-CloudTik-job[data-job-id='{job_id}']")
    row.wait_for(timeout=30_000)
    row.locator(".jp-CloudTik-badge[data-state='failed']").wait_for(timeout=90_000)
    assert "ZeroDivisionError" in row.locator(".jp-CloudTik-jobReason").inner_text()
    row.click()
    cell = row.locator(".jp-CloudTik-errorCell")
    cell.wait_for()
    assert "y = x / 0" in cell.inner_text() and "division by zero" in cell.inner_text()
    page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "jobs-panel.png"))


def test_a_job_submitted_despite_unknown_parameters_shows_the_warning(page, lab):
    """Issue 20: a notebook without a cell tagged `parameters`, submitted with
    allow_unknown_parameters: its row says the parameter was not received (here the
    notebook's own ``x = 1`` overwrites the injected x)."""
    resp = lab.request("POST", "jobs", json={"notebook": "jobs-panel/fail.ipynb",
                                             "parameters": {"x": 2},
                                             "allow_unknown_parameters": True})
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job"]["id"]
    row = page.locator(f".jp-CloudTik-job[data-job-id='{job_id}']")
    row.wait_for(timeout=30_000)
    warning = row.locator(".jp-CloudTik-jobWarning")
    warning.wait_for(timeout=30_000)
    assert "no cell tagged 'parameters'" in warning.inner_text()


def test_no_errors_in_the_browser_console(page):
    ours = [e for e in page.__errors if "cloudtik" in e.lower()]
    assert not ours, ours
