"""The README's notebook steps typed into a real JupyterLab notebook, in Chromium that
reaches only the Jupyter port (issue 28: the walkthrough), and every address they show.

The cells are the README's own blocks, read through ``doc_examples`` (never copied): the
opening block as one cell, the Python API block one statement per cell (as typed, so each
value shows), the magics of the README's table with a name of the test's own, and the
Storage block as one cell.  Stand-in, as in tests/storage/test_storage_docs.py: the S3 of
``s3://my-bucket/project`` is the tests' ``rclone serve s3``, given as ``-o endpoint=``; its
keys are typed into the form ``--ask`` shows.  One cell before them turns the widget
progress back on (the tests' servers run with ``CLOUDTIK_PROGRESS=text``), so the notebook
shows what a user's does.

Every address shown must be one the browser can open: in the saved notebook's outputs (every
MIME type) and in the page (links, sources, text, widgets), a URL is the server's own or a
path on it; only the storage's own endpoint (typed in the cell) and Dask's ``tcp://``
scheduler addresses (for clients, not links) are other places.  The progress widget's
screenshot is docs/images/progress-widget.png (``make doc-images``).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import time

import doc_examples
import pytest
from ast_parse import parse
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from jupyter_cloudtik.storage.servers import start_server

from .conftest import ARTIFACTS, doc_image
from .lab_pages import kernel_chosen, open_notebook
from .test_newcomer_walkthrough import run_menu

pytestmark = pytest.mark.slow

URL = re.compile(r"""(?:https?|wss?)://[^\s"'<>)\]]+""")
HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
NOTEBOOK = "readme-walkthrough.ipynb"
MAGICS = [
    "m = %cluster up --name readme-magics --workers 1",
    "%cluster status readme-magics",
    "%cluster list",
    "m",
    "%cluster down readme-magics",
]

# every address the page shows in the notebook: links, sources, and URLs in its text
PAGE_ADDRESSES = """
() => {
  const nb = document.querySelector('.jp-Notebook');
  const links = [], texts = [];
  for (const el of nb.querySelectorAll('.jp-OutputArea [href], .jp-OutputArea [src]')) {
    links.push(el.getAttribute('href') ?? el.getAttribute('src'));
  }
  for (const el of nb.querySelectorAll('.jp-OutputArea')) { texts.push(el.innerText); }
  return {links, texts};
}
"""


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    base = tmp_path_factory.mktemp("walk-s3")
    srv = start_server("s3", base / "root", workdir=base / "work")
    inputs = srv.root / "my-bucket" / "project" / "inputs"
    inputs.mkdir(parents=True)
    (inputs / "x.csv").write_text("a,b\n1,2\n")
    yield srv
    srv.stop()


def _cell(source: str) -> dict:
    return {
        "cell_type": "code",
        "source": source,
        "metadata": {},
        "outputs": [],
        "execution_count": None,
    }


def _cells(s3_url: str) -> list[str]:
    intro = doc_examples.block("README.md", "jupyter_cloudtik", by=__name__).text
    api = doc_examples.block("README.md", "Python API", by=__name__).text
    storage = doc_examples.block("README.md", "Storage", by=__name__).text
    assert "s3://my-bucket/project " in storage
    statements = [ast.get_source_segment(api, s) for s in parse(api).body]
    return [
        "%env CLOUDTIK_PROGRESS=auto",
        intro.strip(),
        *statements,
        *MAGICS,
        storage.replace(
            "s3://my-bucket/project ", f"s3://my-bucket/project -o endpoint={s3_url} "
        ).strip(),
    ]


def _foreign(addresses: list[str], origin: str, allowed: tuple[str, ...]) -> list[str]:
    """The shown addresses that lead elsewhere than the Jupyter server."""
    bad = []
    for text in addresses:
        for url in URL.findall(text):
            if not url.startswith((origin, *allowed)):
                bad.append(url)
    return bad


def test_readme_notebook_steps_in_chromium_show_only_the_server(lab_only_browser, lab, s3):
    cells = _cells(s3.url)
    nb = {
        "cells": [_cell(c) for c in cells],
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    }
    lab.session.put(
        lab.url + f"api/contents/{NOTEBOOK}",
        headers=lab.headers(),
        json={"type": "notebook", "content": nb},
    ).raise_for_status()
    origin = lab.url.rstrip("/")
    # every cell in the page, not only those in view (JupyterLab 4 renders a window of
    # them): the prompts and outputs are read from the page
    tracker = lab.url + "lab/api/settings/@jupyterlab/notebook-extension:tracker"
    lab.session.put(
        tracker, headers=lab.headers(), json={"raw": json.dumps({"windowingMode": "none"})}
    ).raise_for_status()
    context = lab_only_browser.new_context(
        viewport={"width": 1200, "height": 900}, device_scale_factor=2
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        open_notebook(page, f"{lab.url}lab/workspaces/readme-walk/tree/{NOTEBOOK}"
                            f"?token={lab.token}")
        # Run All; again if nothing started within 20 s (on a loaded machine a first
        # click can reach a page still settling: no cell queued, no prompt [*])
        prompt = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt")
        for attempt in range(3):
            kernel_chosen(page)
            page.locator(".jp-Notebook .jp-Cell").first.click()
            run_menu(page, "Run All Cells")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not re.search(r"\[[\d*]+\]", prompt.inner_text()):
                time.sleep(0.5)
            if re.search(r"\[[\d*]+\]", prompt.inner_text()):
                break
            page.screenshot(path=str(ARTIFACTS / f"readme-walk-not-started-{attempt}.png"))
        # the storage step: its form, the keys typed, Add
        form = page.locator(".jp-CloudTik-storageAdd[data-name='data']")
        try:
            form.wait_for(timeout=240_000)
        except PlaywrightTimeout:
            page.screenshot(path=str(ARTIFACTS / "readme-walk-no-form.png"))
            raise AssertionError(page.locator(".jp-Notebook").inner_text()[-3000:]) from None
        first = page.locator(".jp-Notebook .jp-Cell").nth(1)
        form.locator("input[name='ask-access_key_id']").fill(s3.user)
        form.locator("input[name='ask-secret_access_key']").fill(s3.password)
        form.locator(".jp-CloudTik-storageAddButton").click()
        # every cell ran (Run All stops at the first error: a cell left unnumbered)
        deadline = time.monotonic() + 180
        prompts: list[str] = []
        while time.monotonic() < deadline:
            prompts = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").all_inner_texts()
            if len(prompts) == len(cells) and all(re.search(r"\[\d+\]", p) for p in prompts):
                break
            time.sleep(0.5)
        texts = page.locator(".jp-Notebook .jp-Cell .jp-OutputArea").all_inner_texts()
        assert all(re.search(r"\[\d+\]", p) for p in prompts), list(
            zip(prompts, texts, strict=False)
        )
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000
        )

        # what the steps show
        shown = "\n".join(texts)
        assert "6" in texts[cells.index("c.client().submit(sum, [1, 2, 3]).result()")]
        assert "storage 'data': s3 my-bucket/project (read-only)" in shown, shown
        assert "inputs" in shown  # %storage ls data:
        assert (lab.root / "inputs" / "x.csv").read_text() == "a,b\n1,2\n"
        # the progress widget: one compact line per operation, not a paragraph per step
        progress = first.locator(".cloudtik-progress")
        assert progress.count() == 2, progress.count()  # the intro's up and its down
        assert "done" in progress.first.inner_text()
        progress.first.locator("button", has_text="details").click()  # every step
        progress.first.locator("text=ready").first.wait_for(timeout=10_000)
        doc_image(first.locator(".jp-OutputArea"), "progress-widget")
        # %cluster status in a notebook: a table with a row per node
        status = page.locator(".jp-Notebook .jp-Cell").nth(cells.index(MAGICS[1]))
        nodes = status.locator("table.cloudtik-nodes tbody tr")
        assert nodes.count() == 2, status.inner_html()[:2000]  # the head and the worker
        assert sorted(nodes.locator("td:nth-child(2)").all_inner_texts()) == ["head", "worker"]

        # the addresses: in the page, and in the saved notebook's every MIME type
        page.keyboard.press("Escape")
        page.keyboard.press("Control+s")
        path = lab.root / NOTEBOOK
        deadline = time.monotonic() + 30
        while "storage 'data'" not in path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        saved = json.loads(path.read_text())
        in_file = [
            str(v)
            for c in saved["cells"]
            for o in c.get("outputs", [])
            for k, v in {**o.get("data", {}), "text": o.get("text", "")}.items()
            if not k.startswith("application/vnd.jupyter.widget")
        ]
        assert not [
            o for c in saved["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"
        ]
        in_page = page.evaluate(PAGE_ADDRESSES)
        allowed = (s3.url, "tcp://", "tls://")
        assert not _foreign(in_file, origin, allowed), _foreign(in_file, origin, allowed)
        assert not _foreign(in_page["texts"], origin, allowed), in_page["texts"]
        links = in_page["links"] + [h for t in in_file for h in HREF.findall(t)]
        assert links  # the dashboard's links at least
        for href in links:
            assert href.startswith(("/", origin, "#", "data:", "blob:", s3.url)), href
        dashboards = re.findall(r"/cloudtik/dashboard/[^\s\"'<>]+", "\n".join(in_file))
        assert dashboards, in_file[:20]  # the dashboard links are shown, on the server
        assert not errors, errors
    finally:
        context.close()
        lab.session.put(tracker, headers=lab.headers(), json={"raw": "{}"})
        # unmounted and forgotten (tests/server/test_storage_notebook_browser.py adds a
        # 'data' of its own): retried while the mount's own operation still runs
        deadline = time.monotonic() + 60
        while lab.request("DELETE", "storages/data").status_code not in (200, 404):
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        for name in ("default", "readme-magics"):
            r = lab.request("DELETE", f"clusters/{name}")
            if r.status_code == 202:
                lab.wait_operation(r.json()["operation"]["id"])
        shutil.rmtree(lab.root / "inputs", ignore_errors=True)
