"""The Clusters side panel in a real JupyterLab, driven in Debian's Chromium by Playwright.

A user opens the panel, starts a local cluster from the New form and watches its live
progress until it runs, scales it, inserts client code into a notebook and runs it, shuts
the cluster down, and sees the server's own message when the input is wrong.  Screenshots
go to test-artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudtik_emulators.browser import confirm

from .conftest import ARTIFACTS, unique
from .lab_pages import open_notebook

RECORD_STEPS = """
() => {
  window.__cloudtikSteps = [];
  const seen = window.__cloudtikSteps;
  new MutationObserver(() => {
    for (const el of document.querySelectorAll('.jp-CloudTik-op')) {
      const text = el.getAttribute('data-state') + ' ' +
        el.querySelector('.jp-CloudTik-opStep').textContent + ' ' +
        el.querySelector('progress').value;
      if (seen[seen.length - 1] !== text) { seen.push(text); }
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true,
                             attributes: true});
}
"""


@pytest.fixture(scope="module")
def page(browser, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    nb = {"type": "notebook", "content": {
        "cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                 "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}}
    lab.session.put(lab.url + "api/contents/panel.ipynb", json=nb,
                    headers=lab.headers()).raise_for_status()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_notebook(page, f"{lab.url}lab/tree/panel.ipynb?token={lab.token}")
    page.click("li[data-id='jupyter-cloudtik-panel']")
    page.wait_for_selector(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live", timeout=30_000)
    page.__errors = errors  # type: ignore[attr-defined]
    yield page
    context.close()


def shot(page, name: str, panel_only: bool = False) -> Path:
    path = ARTIFACTS / f"{name}.png"
    if panel_only:
        page.locator(".jp-CloudTik-panel").screenshot(path=str(path))
    else:
        page.screenshot(path=str(path))
    return path


def test_panel_sections(page):
    titles = page.locator(".jp-CloudTik-sectionTitle").all_inner_texts()
    assert [re.sub(r"^[▾▸]\s*", "", t).strip().lower() for t in titles] == [
        "clusters", "storage", "jobs"]


def test_create_watch_scale_insert_shutdown(page, lab):
    name = unique("ui")
    page.evaluate(RECORD_STEPS)
    page.click(".jp-CloudTik-new")
    form = page.locator(".jp-CloudTik-form")
    form.wait_for()
    # the form comes from the local provider's schema, with its defaults
    assert form.locator("select[name='provider']").input_value() == "local"
    assert form.locator("input[name='provider.host']").input_value() == "127.0.0.1"
    form.locator("input[name='name']").fill(name)
    form.locator("input[name='workers']").fill("1")
    form.locator(".jp-CloudTik-start").click()

    item = page.locator(f".jp-CloudTik-cluster[data-name='{name}']")
    item.locator(".jp-CloudTik-badge[data-state='running']").wait_for(timeout=90_000)
    page.wait_for_function("() => window.__cloudtikSteps.some(s => s.startsWith('succeeded'))",
                           timeout=30_000)
    steps = page.evaluate("window.__cloudtikSteps")
    # live progress rows: the same steps the magics show, pushed while the cluster started
    assert any("workers connected" in s for s in steps), steps
    assert any(s.startswith("running") and "head" in s for s in steps), steps
    fractions = [float(s.rsplit(" ", 1)[1]) for s in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert item.locator(".jp-CloudTik-workers").inner_text() == "1/1 workers"
    assert item.locator(".jp-CloudTik-nodes").inner_text() == "2 nodes"
    assert item.locator(".jp-CloudTik-dashboard").get_attribute("href") == (
        f"/cloudtik/dashboard/{name}/status")  # through the server, never the cluster's port
    assert item.locator(".jp-CloudTik-dashboard").get_attribute("target") == "_blank"
    shot(page, "panel", panel_only=True)
    shot(page, "lab-with-panel")
    # the panel and the REST API describe the same cluster
    assert lab.get(f"clusters/{name}").json()["state"] == "running"

    item.locator(".jp-CloudTik-scale").click()
    item.locator("input[name='scale-workers']").fill("2")
    item.locator(".jp-CloudTik-apply").click()
    page.wait_for_function(
        f"() => document.querySelector(\".jp-CloudTik-cluster[data-name='{name}'] "
        ".jp-CloudTik-workers\")?.textContent === '2/2 workers'", timeout=90_000)
    assert lab.get(f"clusters/{name}").json()["summary"]["workers"] == 2

    item.locator(".jp-CloudTik-insert").click()
    cell = page.locator(".jp-Notebook .jp-Cell").filter(has_text=f'Cluster.get("{name}")')
    cell.wait_for(timeout=10_000)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea-output")
    output.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".some(e => /Client/.test(e.textContent))", timeout=60_000)
    assert "Error" not in output.inner_text()
    shot(page, "client-code")

    confirm(page, item.locator(".jp-CloudTik-shutdown"), name)
    item.wait_for(state="detached", timeout=60_000)
    assert lab.get(f"clusters/{name}").json()["state"] == "stopped"


def test_oversubscription_warning_on_the_row(page, lab):
    """A worker with 3x this machine's cores starts (no refusal) and its row says why it
    may be slow; the REST operation carries the same warning."""
    from jupyter_cloudtik.providers.local.capacity import machine_cpus

    name = unique("over")
    page.click(".jp-CloudTik-new")
    form = page.locator(".jp-CloudTik-form")
    form.wait_for()
    form.locator("input[name='name']").fill(name)
    form.locator("input[name='workers']").fill("1")
    form.locator("input[name='worker.CPU']").fill(str(3 * machine_cpus()))
    form.locator(".jp-CloudTik-start").click()
    item = page.locator(f".jp-CloudTik-cluster[data-name='{name}']")
    item.locator(".jp-CloudTik-badge[data-state='running']").wait_for(timeout=90_000)
    warning = item.locator(".jp-CloudTik-clusterWarning")
    warning.wait_for(timeout=10_000)
    assert warning.inner_text().startswith("warning: oversubscribed: with 1 x worker")
    shot(page, "panel-oversubscribed", panel_only=True)
    last = lab.get(f"clusters/{name}").json()["last_operation"]
    assert last["warnings"] and last["warnings"][0] in warning.inner_text()
    op = lab.get(f"operations/{last['id']}").json()
    assert op["warnings"] == last["warnings"]
    lab.request("DELETE", f"clusters/{name}")


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "Bad_Name"}, "'Bad_Name' is not allowed"),
    ({"name": "too-big", "workers": "4096"}, "not enough capacity"),
    ({"name": "bad-memory", "worker.memory": "lots"}, "resources.memory"),
])
def test_server_errors_are_shown(page, lab, fields, message):
    page.click(".jp-CloudTik-new")
    form = page.locator(".jp-CloudTik-form")
    form.wait_for()
    for key, value in fields.items():
        form.locator(f"input[name='{key}']").fill(value)
    form.locator(".jp-CloudTik-start").click()
    error = form.locator(".jp-CloudTik-formError")
    error.wait_for(timeout=30_000)
    assert message in error.inner_text()
    shot(page, "panel-error", panel_only=True)
    form.locator("button", has_text="Cancel").click()
    assert fields["name"] not in [c["name"] for c in lab.get("clusters").json()["clusters"]]


def test_no_errors_in_the_browser_console(page):
    ours = [e for e in page.__errors if "cloudtik" in e.lower()]
    assert not ours, ours
