"""Opening a notebook in JupyterLab as a user does, for every browser test that runs cells.

On a loaded machine JupyterLab can open a notebook before it has the kernel specs and ask
which kernel to use (its Select Kernel dialog, modal): a click meant for a cell then lands
on the dialog's backdrop and times out (CI: test_storage_notebook_browser, 30 s of
"<dialog ...> intercepts pointer events").  Every test that opens a notebook goes through
:func:`open_notebook`, which answers that dialog as a user would, with the notebook's own
Python 3, and refuses any other dialog with its text (a dialog nobody expected is a
finding, not something to click away).
"""

from __future__ import annotations

import time
from typing import Any

KERNEL_LABEL = "Python 3 (ipykernel)"


def kernel_chosen(page: Any, timeout: float = 90) -> None:
    """Wait until the open notebook has its Python 3 kernel, idle."""
    deadline = time.monotonic() + timeout
    name = page.locator(".jp-KernelName").first
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog")
        if dialog.count():
            text = dialog.first.inner_text()
            assert "Select Kernel" in text, f"an unexpected dialog: {text!r}"
            dialog.locator("select").select_option(label=KERNEL_LABEL)
            dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
            dialog.first.wait_for(state="detached", timeout=10_000)
        if name.count() and "Python 3" in name.inner_text() and idle.count():
            return
        time.sleep(0.25)
    shown = name.inner_text() if name.count() else "no kernel name shown"
    raise AssertionError(f"the notebook has no idle Python 3 kernel after {timeout:.0f} s: "
                         f"{shown!r}")


def open_notebook(page: Any, url: str, timeout: float = 90) -> None:
    """Go to a notebook's ``url`` and wait until it can run cells."""
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel", timeout=timeout * 1000)
    kernel_chosen(page, timeout)
