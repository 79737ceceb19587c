"""An HPC kernel from a real JupyterLab in Chromium that reaches only the Jupyter port
(issue 33): a notebook whose kernel is "Python 3 on daint — 1 core, 30 min" opens, its
kernel's Slurm job waits behind another job and the notebook's toolbar says so with
Slurm's reason (JupyterLab itself can only say "starting"); once the job runs, the toolbar
names the node and the wall time left, a cell typed in the page runs in the job on the
node, and shutting the kernel down from the page ends the job.  The screenshot of the
queued notebook is docs/images/hpc-kernel-queued.png (``make doc-images``)."""

from __future__ import annotations

import os
import re
import subprocess
from urllib.parse import urlsplit

import pytest

from .conftest import wait_for, write_hpc_kernel_config

pytestmark = pytest.mark.slow

NOTEBOOK = "on-daint.ipynb"
LABEL = "Python 3 on daint — 1 core, 30 min"


def _squeue(env: dict) -> dict[str, str]:
    r = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True,
                       env={**os.environ, **env})
    return {ln.split()[0]: ln for ln in r.stdout.splitlines()}


def _toolbar(page) -> tuple[str, str, str]:
    """The item's words, its state and its tooltip (the whole line)."""
    item = page.locator(".jp-CloudTikHpcKernel")
    if not item.count():
        return "", "none", ""
    first = item.first
    return (first.inner_text(), first.get_attribute("data-state") or "",
            first.get_attribute("title") or "")


def _panel_row(page, job: str):
    """The side panel's HPC kernels section, opened, and the row of ``job``'s kernel."""
    section = page.locator(".jp-CloudTik-section[data-section='hpc-kernels']")
    if not section.is_visible():
        page.click("li[data-id='jupyter-cloudtik-panel']")
        section.wait_for(timeout=30_000)
    if "jp-mod-open" not in (section.get_attribute("class") or ""):
        section.locator(".jp-CloudTik-sectionTitle").click()
    return section.locator(".jp-CloudTik-hpcKernel",
                           has=page.locator(".jp-CloudTik-hpcKernelLine", has_text=f"job {job}"))


def test_an_hpc_kernel_queues_runs_and_ends_from_jupyterlab(slurm, tmp_path):
    from cloudtik_emulators.browser import chromium
    from tests.server.conftest import ARTIFACTS, _start_server, _stop, doc_image

    write_hpc_kernel_config(tmp_path, slurm)
    lab = _start_server(tmp_path, "lab", [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"], {})
    blocker = None
    try:
        nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                         "execution_count": None,
                         "source": "import os, socket\n"
                                   "print(os.environ['SLURM_JOB_ID'], socket.gethostname())"}],
              "nbformat": 4, "nbformat_minor": 5,
              "metadata": {"kernelspec": {"name": "cloudtik-hpc-daint-debug",
                                          "display_name": LABEL, "language": "python"}}}
        lab.session.put(lab.url + f"api/contents/{NOTEBOOK}", headers=lab.headers(),
                        json={"type": "notebook", "content": nb}).raise_for_status()
        # the node's 2 CPUs are taken: the kernel's job waits for resources
        r = subprocess.run(["sbatch", "--parsable", "-c", "2", "-t", "10", "-o", "/dev/null",
                            "--chdir", str(tmp_path), "--wrap", "sleep 600"],
                           capture_output=True, text=True, env={**os.environ, **slurm.env},
                           check=True)
        blocker = r.stdout.strip().split(";")[0]
        ARTIFACTS.mkdir(exist_ok=True)
        with chromium(reach_only=urlsplit(lab.url).netloc) as browser:
            page = browser.new_context(viewport={"width": 1200, "height": 700}).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab.url}lab/workspaces/hpc-kernel/tree/{NOTEBOOK}?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)

            # queued: the toolbar says so, with Slurm's reason, while JupyterLab says starting
            # (the job's first look may come before Slurm has given it a reason)
            text, _, title = wait_for(lambda: (lambda t: t if t[1] == "queued" and "(" in t[0]
                                               else None)(_toolbar(page)), 90, interval=0.5,
                                      what="the toolbar to show the queued job and why")
            assert re.fullmatch(r"daint: queued \((Resources|Priority)\)", text), text
            m = re.fullmatch(r"HPC kernel \S+ \(profile debug of daint\): daint: job (\d+) "
                             r"queued \((Resources|Priority)\)", title)
            assert m, title
            job = m.group(1)
            assert page.locator(".jp-CloudTikHpcKernel").first.is_visible()
            # the status bar says the same, beside JupyterLab's own kernel status
            status = page.locator(".jp-StatusBar-Widget .jp-CloudTikHpcKernelStatus")
            wait_for(lambda: status.inner_text() == text, 30, interval=0.5,
                     what="the status bar to show the queued job")
            assert status.get_attribute("data-state") == "queued" and \
                status.get_attribute("title") == title
            assert "PENDING" in _squeue(slurm.env)[job]
            assert "Python 3 on daint" in page.locator(".jp-KernelName").first.inner_text()
            doc_image(page, "hpc-kernel-queued")  # docs/hpc.md shows it
            # the side panel lists it too, queued and why, with its notebook
            row = _panel_row(page, job)
            row.wait_for(timeout=30_000)
            assert row.get_attribute("data-state") == "queued"
            line = row.locator(".jp-CloudTik-hpcKernelLine").inner_text()
            assert re.fullmatch(rf"daint: job {job} queued \((Resources|Priority)\)", line), line
            assert row.locator(".jp-CloudTik-openKernelNotebook").get_attribute(
                "title") == NOTEBOOK
            assert row.locator(".jp-CloudTik-shutdownHpcKernel").is_enabled()
            doc_image(page, "hpc-kernels-panel")  # docs/hpc.md shows it

            # the node frees: the job runs, the toolbar says where and how long is left
            subprocess.run(["scancel", blocker], env={**os.environ, **slurm.env}, check=True)
            text, _, title = wait_for(lambda: (lambda t: t if t[1] == "running" else None)(
                _toolbar(page)), 120, interval=0.5, what="the toolbar to show the running job")
            assert re.fullmatch(r"daint: (\d+) min left", text), text
            wait_for(lambda: status.get_attribute("data-state") == "running", 30,
                     interval=0.5, what="the status bar to show the running job")
            assert 25 <= int(text.split()[1]) <= 30, text
            m = re.search(rf"daint: job {job} on (\S+) · (\d+) min left$", title)
            assert m, title
            node = m.group(1)
            wait_for(lambda: row.get_attribute("data-state") == "running", 30, interval=0.5,
                     what="the panel's row to show the running job")
            assert f"daint: job {job} on {node}" in row.inner_text()
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=60_000)

            # a cell typed in the page runs in the job, on the node
            page.locator(".jp-Notebook .jp-Cell").nth(0).locator(
                ".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            out = page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-OutputArea")
            seen = wait_for(lambda: out.inner_text().strip() or None, 60, interval=0.25,
                            what="the cell's output")
            assert seen.split()[0] == job, seen
            assert node in (seen.split()[1], "localhost"), (seen, node)

            # the kernel shut down from the page: its job ends, the toolbar item goes
            sessions = lab.session.get(lab.url + "api/sessions", headers=lab.headers(),
                                       timeout=30).json()
            (kid,) = [s["kernel"]["id"] for s in sessions if s["path"] == NOTEBOOK]
            page.locator(".jp-KernelName").first.click()  # the kernel's dialog opens
            dialog = page.locator(".jp-Dialog")
            dialog.wait_for(timeout=20_000)
            dialog.locator("select").select_option(label="No Kernel")
            dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
            wait_for(lambda: job not in _squeue(slurm.env), 60,
                     what="the kernel's job to end once the page shut its kernel down")
            wait_for(lambda: _toolbar(page)[1] == "none", 30, interval=0.5,
                     what="the toolbar item to go with the kernel")
            listed = lab.get("hpc/kernels").json()["kernels"]
            assert all(k["id"] != kid or k["state"] == "dead" for k in listed), listed
            assert not errors, errors
    finally:
        if blocker:
            subprocess.run(["scancel", blocker], env={**os.environ, **slurm.env})
        problems = _stop(lab)
    assert not problems, problems


def test_a_kernel_of_a_custom_size_from_the_launchers_form(slurm, tmp_path):
    """The launcher's "HPC kernel…" card: the form says what the admin allows, a size
    beyond it is refused above the form with what was typed kept, a size within opens a
    new notebook whose kernel's job has that size (docs/hpc.md, "Interactive kernels:
    custom sizes"; the form is docs/images/hpc-kernel-custom-size.png)."""
    from cloudtik_emulators.browser import chromium
    from tests.server.conftest import _start_server, _stop, doc_image

    write_hpc_kernel_config(tmp_path, slurm, custom={"cores": 2, "time": "1h",
                                                     "memory": "2GiB"})
    lab = _start_server(tmp_path, "lab", [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"], {})
    try:
        with chromium(reach_only=urlsplit(lab.url).netloc) as browser:
            page = browser.new_context(viewport={"width": 1200, "height": 760}).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab.url}lab/workspaces/hpc-size?token={lab.token}")
            card = page.locator(".jp-LauncherCard", has_text="HPC kernel…")
            card.wait_for(timeout=90_000)
            card.click()
            form = page.locator(".jp-Dialog .jp-CloudTikKernelSize")
            form.wait_for(timeout=20_000)
            assert form.locator(".jp-CloudTikKernelSize-bounds").inner_text() == (
                "Allowed: at most 2 cores, 1 h of wall time, 2 GiB of memory, no GPU (and "
                "what the partition has).")
            form.locator("input[name='cores']").fill("4")
            form.locator("input[name='time']").fill("45")
            page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
            error = page.locator(".jp-Dialog .jp-CloudTikKernelSize-error")
            error.wait_for(timeout=30_000)
            assert error.inner_text() == ("cores: 4 is more than profile 'debug' allows (at "
                                          "most 2)")
            # what was typed is kept for the fix
            assert form.locator("input[name='cores']").input_value() == "4"
            assert form.locator("input[name='time']").input_value() == "45"
            form.locator("input[name='cores']").fill("2")
            doc_image(page, "hpc-kernel-custom-size")
            page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()

            # a new notebook with the kernel of that size; its job runs with 2 CPUs
            page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
            wait_for(lambda: "2 cores, 45 min" in page.locator(
                ".jp-NotebookPanel .jp-KernelName").first.inner_text() or None, 60,
                interval=0.5, what="the new notebook's kernel name")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=120_000)
            cell = page.locator(".jp-Notebook .jp-Cell").nth(0)
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.type("import os; print(os.environ['SLURM_CPUS_PER_TASK'], "
                               "os.environ['SLURM_JOB_ID'])")
            page.keyboard.press("Shift+Enter")
            out = cell.locator(".jp-OutputArea")
            seen = wait_for(lambda: out.inner_text().strip() or None, 60, interval=0.25,
                            what="the cell's output")
            cpus, job = seen.split()
            assert cpus == "2", seen
            assert _squeue(slurm.env)[job].split()[1] == "RUNNING"
            limit = subprocess.run(["squeue", "-h", "-j", job, "-o", "%l"],
                                   capture_output=True, text=True,
                                   env={**os.environ, **slurm.env}).stdout.strip()
            assert limit == "45:00", limit
            (kernel,) = [k for k in lab.get("hpc/kernels").json()["kernels"]
                         if k["job"] == job]
            # shut down from the side panel (its confirm dialog first): the job ends
            row = _panel_row(page, job)
            row.wait_for(timeout=30_000)
            assert row.get_attribute("data-kernel-id") == kernel["id"]
            assert row.get_attribute("data-state") == "running"
            assert "debug · daint" in row.locator(".jp-CloudTik-name").inner_text()
            row.locator(".jp-CloudTik-shutdownHpcKernel").click()
            dialog = page.locator(".jp-Dialog")
            dialog.wait_for(timeout=20_000)
            assert f"its job {job}" in dialog.inner_text()
            dialog.locator(".jp-Dialog-button.jp-mod-warn").click()
            wait_for(lambda: job not in _squeue(slurm.env), 60,
                     what="the custom kernel's job to end once the panel shut it down")
            # a kernel shut down is gone from the list (one whose job ended by itself stays,
            # dead, with the reason)
            wait_for(lambda: row.count() == 0, 30, interval=0.5,
                     what="the panel's row to go with the kernel")
            assert not errors, errors
    finally:
        problems = _stop(lab)
    assert not problems, problems
