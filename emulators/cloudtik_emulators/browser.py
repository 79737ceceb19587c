"""Headless Chromium for the panel's browser tests: Debian's /usr/bin/chromium driven by
Playwright, with the flags a container without a GPU or a sandbox needs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", "--disable-dev-shm-usage"]


@contextmanager
def chromium(reach_only: str | None = None) -> Iterator[Any]:
    """A headless Chromium.  ``reach_only`` ("host:port") sends every other connection to a
    proxy that does not exist (``--proxy-bypass-list`` without the implicit loopback
    bypass), so what the browser shows of a cluster can only have come through that
    server: its scheduler's and dashboard's own ports are out of reach."""
    from playwright.sync_api import sync_playwright

    args = ARGS if reach_only is None else [
        *ARGS, "--proxy-server=http://127.0.0.1:9",
        f"--proxy-bypass-list=<-loopback>;{reach_only}"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()


def confirm(page: Any, button: Any, names: str) -> None:
    """Click ``button`` (a Playwright locator) and accept the warning dialog it opens,
    which must name ``names``: what the panel is about to stop, cancel or remove."""
    button.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert names in dialog.inner_text(), dialog.inner_text()
    dialog.locator("button.jp-mod-warn").click()
