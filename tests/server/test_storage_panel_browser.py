"""The Storage section of the side panel in a real JupyterLab (Chromium via Playwright),
against a real `rclone serve s3`: add a storage from the form made of rclone's schema
(credentials in password fields), test it, browse it, mount and unmount it, remove it."""

from __future__ import annotations

import os

import pytest

from cloudtik_emulators.browser import confirm
from jupyter_cloudtik.storage.mounts import fuse_problem, mount_entry
from jupyter_cloudtik.storage.servers import start_server

from .conftest import ARTIFACTS, unique
from .test_panel_browser import shot


@pytest.fixture(scope="module")
def page(browser, lab):
    """JupyterLab with the side panel showing (its workspace may remember it open)."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.goto(f"{lab.url}lab?token={lab.token}")
    p.wait_for_selector("li[data-id='jupyter-cloudtik-panel']", timeout=90_000)
    live = p.locator(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live")
    tab = p.locator("li[data-id='jupyter-cloudtik-panel']")
    for _ in range(6):  # the restored workspace may open the panel by itself, late
        if live.is_visible():
            break
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        try:
            live.wait_for(timeout=5_000)
        except Exception:
            continue
    live.wait_for(timeout=30_000)
    yield p
    context.close()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    base = tmp_path_factory.mktemp("panel-s3")
    srv = start_server("s3", base / "root", workdir=base / "work")
    (srv.root / "panel-bucket" / "folder").mkdir(parents=True)
    (srv.root / "panel-bucket" / "top.csv").write_text("a,b\n")
    (srv.root / "panel-bucket" / "folder" / "inner.txt").write_text("inside")
    yield srv
    srv.stop()


def _open_storage(p):
    section = p.locator("section[data-section='storage']")
    if "jp-mod-open" not in (section.get_attribute("class") or ""):
        section.locator(".jp-CloudTik-sectionTitle").click()
    return section


def test_add_test_browse_mount_remove(page, lab, s3):
    name = unique("ui").replace("-", "_")
    section = _open_storage(page)
    section.locator(".jp-CloudTik-addStorage").click()
    form = section.locator(".jp-CloudTik-storageForm")
    form.wait_for()
    form.locator("input[name='storage-name']").fill(name)
    form.locator("select[name='storage-backend']").select_option("s3")
    form.locator("select[name='storage-provider']").select_option("Rclone")
    # the fields come from rclone's schema of s3 for that provider; secrets are masked
    secret = form.locator("input[name='opt-secret_access_key']")
    assert secret.get_attribute("type") == "password"
    assert form.locator("input[name='opt-access_key_id']").get_attribute("type") == "password"
    assert form.locator("input[name='opt-endpoint']").get_attribute("type") == "text"
    form.locator("input[name='opt-endpoint']").fill(s3.url)
    form.locator("input[name='opt-access_key_id']").fill(s3.user)
    secret.fill(s3.password)
    form.locator("input[name='storage-source']").fill("panel-bucket")
    shot(page, "storage-add-form", panel_only=True)
    form.locator(".jp-CloudTik-create").click()

    item = section.locator(f".jp-CloudTik-storageItem[data-name='{name}']")
    item.wait_for(timeout=30_000)
    assert item.locator(".jp-CloudTik-access").inner_text() == "read-only"
    stored = lab.get(f"storages/{name}").json()
    assert stored["options"]["secret_access_key"] == "<secret>"

    item.locator(".jp-CloudTik-test").click()
    page.wait_for_function(
        f"() => document.querySelector(\".jp-CloudTik-storageItem[data-name='{name}'] "
        ".jp-CloudTik-testResult\")?.textContent.startsWith('ok')", timeout=30_000)

    item.locator(".jp-CloudTik-browse").click()
    browser_ = item.locator(".jp-CloudTik-browser")
    browser_.locator(".jp-CloudTik-entry").first.wait_for(timeout=30_000)
    assert browser_.locator(".jp-CloudTik-entry").all_inner_texts()[0].endswith("folder")
    browser_.locator(".jp-CloudTik-entry[data-dir='1'] a").click()
    page.wait_for_function(
        f"() => document.querySelector(\".jp-CloudTik-storageItem[data-name='{name}'] "
        ".jp-CloudTik-browser\")?.getAttribute('data-path') === 'folder'", timeout=30_000)
    browser_.locator(".jp-CloudTik-entry", has_text="inner.txt").wait_for(timeout=30_000)
    shot(page, "storage-browse", panel_only=True)

    if fuse_problem() is None:
        item.locator(".jp-CloudTik-mount").click()
        page.wait_for_function(
            f"() => document.querySelector(\".jp-CloudTik-storageItem[data-name='{name}']\")"
            "?.getAttribute('data-mount') === 'mounted'", timeout=60_000)
        path = lab.get(f"storages/{name}").json()["mount_path"]
        assert mount_entry(path) is not None and sorted(os.listdir(path)) == [
            "folder", "top.csv"]
        shot(page, "storage-mounted", panel_only=True)
        item.locator(".jp-CloudTik-unmount").click()
        page.wait_for_function(
            f"() => document.querySelector(\".jp-CloudTik-storageItem[data-name='{name}']\")"
            "?.getAttribute('data-mount') === ''", timeout=60_000)
        assert mount_entry(path) is None

    confirm(page, item.locator(".jp-CloudTik-remove"), name)
    item.wait_for(state="detached", timeout=30_000)
    assert lab.get(f"storages/{name}").status_code == 404
    assert s3.password not in page.content()


def test_server_error_names_the_option(page, lab):
    section = _open_storage(page)
    section.locator(".jp-CloudTik-addStorage").click()
    form = section.locator(".jp-CloudTik-storageForm")
    form.wait_for()
    form.locator("input[name='storage-name']").fill("x; touch pwned")
    form.locator("select[name='storage-backend']").select_option("webdav")
    form.locator(".jp-CloudTik-create").click()
    error = form.locator(".jp-CloudTik-formError")
    error.wait_for(timeout=30_000)
    assert "'x; touch pwned' is not allowed: letters, digits" in error.inner_text()
    assert "jp-mod-invalid" in form.locator("input[name='storage-name']").get_attribute("class")
    form.locator("button", has_text="Cancel").click()
