"""A newcomer's first minutes, in a real JupyterLab driven in Chromium: what the README's
Quick start and docs/panel.md promise is what the page shows.

A JupyterLab of this module's own (nothing recorded yet, as on a fresh install) serves
``examples/quickstart.ipynb`` copied as it is in the repository.  The newcomer opens the
notebook and the side panel's tab, looks at every section (each empty, saying what to do, in
the words docs/panel.md quotes), opens the New cluster and Add storage forms, then runs the
quick start: the first cells start the cluster, the panel shows it running with its usage
chart inside the panel's width, the rest compute the checked result and stop it, and the
panel is empty again.  The CLI's and the Huawei emulator's walkthroughs run as written in
tests/test_doc_examples.py and tests/huaweicloud/test_readme_walkthrough.py.
Screenshots: test-artifacts/newcomer-*.png.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ARTIFACTS, ROOT, Server, _start_server, _stop
from .lab_pages import open_notebook

# what the page records while the notebook runs: cluster rows with their badge, progress
# rows with their state, and whether the Clusters section ever said "No clusters" while an
# operation was still running (the row is what happens then)
OBSERVE = """
() => {
  const seen = window.__newcomer = {badges: [], ops: [], emptyWhileRunning: 0};
  const push = (list, text) => { if (!list.includes(text)) list.push(text); };
  const look = () => {
    const section = document.querySelector(".jp-CloudTik-section[data-section='clusters']");
    if (!section) return;
    for (const c of section.querySelectorAll('.jp-CloudTik-cluster')) {
      const badge = c.querySelector('.jp-CloudTik-badge');
      push(seen.badges, c.dataset.name + ' ' + (badge && badge.dataset.state));
    }
    let running = 0;
    for (const op of section.querySelectorAll('.jp-CloudTik-op')) {
      const title = op.querySelector('.jp-CloudTik-opTitle').textContent.trim();
      push(seen.ops, title + ' ' + op.dataset.state);
      if (!['succeeded', 'failed', 'cancelled'].includes(op.dataset.state)) running++;
    }
    if (running && section.querySelector('.jp-CloudTik-empty')) seen.emptyWhileRunning++;
  };
  look();
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true,
                                                     characterData: true, attributes: true});
}
"""

# the width of an input's placeholder text, and the room the input has for it
PLACEHOLDER_FIT = """
el => {
  const cs = getComputedStyle(el);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  return [ctx.measureText(el.placeholder).width,
          el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)];
}
"""


def panel_md_empty_texts() -> list[str]:
    """The empty-section sentences docs/panel.md quotes, without their markdown."""
    text = " ".join((ROOT / "docs" / "panel.md").read_text().split())
    found = re.findall(r"\*(No [a-z]+\. .*?\.)\*", text)
    return [re.sub(r"\*\*|`", "", s) for s in found]


@pytest.fixture(scope="module")
def fresh_lab(tmp_path_factory) -> Iterator[Server]:
    """JupyterLab as installed (the launcher prewarmed at start), with nothing recorded and
    the repository's examples/ in its root."""
    tmp = tmp_path_factory.mktemp("newcomer")
    (tmp / "root").mkdir()
    shutil.copytree(ROOT / "examples", tmp / "root" / "examples",
                    ignore=shutil.ignore_patterns("*.out.ipynb", ".ipynb_checkpoints"))
    server = _start_server(tmp, "lab", [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
        "--LocalProvider.prewarm=True",
    ], {})
    yield server
    problems = _stop(server)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(server.log_path, ARTIFACTS / "newcomer-server.log")
    assert not problems, problems


@pytest.fixture(scope="module")
def page(browser, fresh_lab) -> Iterator[Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_notebook(page, f"{fresh_lab.url}lab/tree/examples/quickstart.ipynb"
                        f"?token={fresh_lab.token}")
    page.__errors = errors  # type: ignore[attr-defined]
    yield page
    context.close()
    assert not errors, errors


def shot(page: Any, name: str, panel_only: bool = True) -> Path:
    path = ARTIFACTS / f"newcomer-{name}.png"
    (page.locator(".jp-CloudTik-panel") if panel_only else page).screenshot(path=str(path))
    return path


def section(page: Any, name: str) -> Any:
    return page.locator(f".jp-CloudTik-section[data-section='{name}']")


def test_the_panel_tab_and_every_section_as_docs_panel_md_says(page):
    tab = page.locator("li[data-id='jupyter-cloudtik-panel']")
    tab.wait_for()
    # the README and docs/panel.md call it by its tooltip
    assert tab.get_attribute("title") == "CloudTik: clusters, storage, jobs"
    assert "*CloudTik: clusters, storage, jobs*" in (ROOT / "docs" / "panel.md").read_text()
    open_panel(page)
    titles = page.locator(".jp-CloudTik-sectionTitle").all_inner_texts()
    assert [re.sub(r"^[▾▸]\s*", "", t).strip().lower() for t in titles] == [
        "clusters", "storage", "jobs"]
    # a page load opens Clusters only
    assert section(page, "clusters").get_attribute("class").endswith("jp-mod-open")
    assert "jp-mod-open" not in section(page, "storage").get_attribute("class")
    for name in ("storage", "jobs"):
        section(page, name).locator(".jp-CloudTik-sectionTitle").click()
    shown = []
    for name in ("clusters", "storage", "jobs"):
        empty = section(page, name).locator(".jp-CloudTik-empty")
        try:
            empty.wait_for(timeout=60_000)
        except Exception as e:  # say what the section shows instead
            raise AssertionError(f"the {name} section is not empty: "
                                 f"{section(page, name).inner_text()!r}") from e
        shown.append(" ".join(empty.inner_text().split()))
    assert shown == panel_md_empty_texts()
    shot(page, "sections")

    # New: the size fields say what empty means, readable whole in the panel's width
    section(page, "clusters").locator(".jp-CloudTik-new").click()
    form = page.locator(".jp-CloudTik-form")
    form.wait_for()
    assert form.locator("select[name='provider']").input_value() == "local"
    for key, placeholder in (("worker.CPU", "empty: provider default"),
                             ("worker.memory", "e.g. 2GiB; empty: default")):
        field = form.locator(f"input[name='{key}']")
        assert field.get_attribute("placeholder") == placeholder
        width, room = field.evaluate(PLACEHOLDER_FIT)
        assert width <= room, (key, placeholder, width, room)
    assert "cores / workers" in form.locator(
        "label.jp-CloudTik-field", has=page.locator("input[name='worker.CPU']")
    ).get_attribute("title")
    # the form stands in for the empty text while it is open
    assert section(page, "clusters").locator(".jp-CloudTik-empty").count() == 0
    shot(page, "new-cluster-form")
    form.locator("button", has_text="Cancel").click()
    form.wait_for(state="detached")

    # Add storage: a form made from rclone's backends
    section(page, "storage").locator("button", has_text="Add").click()
    backend = section(page, "storage").locator("select[name='storage-backend']")
    backend.locator("option[value='s3']").wait_for(state="attached", timeout=30_000)
    assert backend.input_value() == "s3"  # the first backend a newcomer looks for
    shot(page, "add-storage-form")
    section(page, "storage").locator("button", has_text="Cancel").click()
    section(page, "storage").locator(".jp-CloudTik-empty").wait_for()


def run_menu(page: Any, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def wait_output(page: Any, pattern: str, timeout: float = 120_000) -> None:
    page.wait_for_function(
        "p => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".some(e => new RegExp(p).test(e.textContent))", arg=pattern, timeout=timeout)


def open_panel(page: Any) -> None:
    page.locator("li[data-id='jupyter-cloudtik-panel']").wait_for()
    if not page.locator(".jp-CloudTik-panel").is_visible():
        page.click("li[data-id='jupyter-cloudtik-panel']")
    page.wait_for_selector(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live", timeout=30_000)


def test_the_quick_start_notebook_with_the_panel_open(page, fresh_lab):
    open_panel(page)
    page.evaluate(OBSERVE)
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    # Lab renders a notebook's cells progressively
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-NotebookPanel .jp-Cell').length === 7",
        timeout=30_000)
    # the first two code cells: %load_ext, then %cluster up
    cells.nth(0).click()  # the title (markdown): selected, not edited
    run = page.locator(".jp-NotebookPanel-toolbar "
                       "[data-command='notebook:run-cell-and-select-next']")
    for n in range(3):  # the toolbar's ▶, as a newcomer runs a cell and moves on
        run.click()
        page.wait_for_function(
            "n => document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[n]"
            ".classList.contains('jp-mod-active')", arg=n + 1, timeout=30_000)
    wait_output(page, r"cluster ready in \d")
    # the progress names the dashboard as the table under it does: through this server
    # (it gave the head's own port, which a browser of a remote Lab cannot reach)
    up = cells.nth(2).locator(".jp-OutputArea").inner_text()
    assert "is running: 2 workers, dashboard /cloudtik/dashboard/quickstart/status" in up, up
    item = section(page, "clusters").locator(".jp-CloudTik-cluster[data-name='quickstart']")
    item.locator(".jp-CloudTik-badge[data-state='running']").wait_for(timeout=30_000)
    assert item.locator(".jp-CloudTik-workers").inner_text() == "2/2 workers"
    # the chart of its workers and cost fits the cluster's box, with its legend under it
    # (it began on the chart's line, and ran into the figures: "cost0.000 so far")
    chart = item.locator(".jp-CloudTik-workersChart")
    chart.wait_for(state="attached", timeout=30_000)
    box, outer = chart.bounding_box(), item.bounding_box()
    assert box["x"] + box["width"] <= outer["x"] + outer["width"], (box, outer)
    legend = item.locator(".jp-CloudTik-usageLegend").bounding_box()
    assert legend["y"] >= box["y"] + box["height"] - 1, (legend, box)
    assert re.search(r"cost: \d+\.\d{3} so far", item.locator(".jp-CloudTik-usage").inner_text())
    shot(page, "quickstart-running", panel_only=False)

    # the rest: from the markdown cell under the `up` cell to the end
    cells.nth(3).click()
    run_menu(page, "Run Selected Cell and All Below")
    wait_output(page, r"cluster 'quickstart' is stopped")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60_000)
    outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert "RESULT sum of squares below 2,000,000 = 2666664666667000000 (checked)" in outputs
    assert "computed on 2 workers" in outputs
    assert "Traceback" not in outputs and "Error" not in outputs, outputs
    item.wait_for(state="detached", timeout=60_000)
    section(page, "clusters").locator(".jp-CloudTik-empty").wait_for(timeout=30_000)
    shot(page, "quickstart-done", panel_only=False)

    seen = page.evaluate("window.__newcomer")
    assert "quickstart running" in seen["badges"], seen
    assert any(re.fullmatch(r"up\s*quickstart.* succeeded", s) for s in seen["ops"]), seen
    assert any(re.fullmatch(r"down\s*quickstart.* succeeded", s) for s in seen["ops"]), seen
    assert seen["emptyWhileRunning"] == 0, seen
    assert fresh_lab.get("clusters/quickstart").json()["state"] == "stopped"
