"""The parameter check on notebooks as real tools save them (issue 28, point 1).

The check read notebooks with papermill's ``find_first_tagged_cell_index``, which needs a
``tags`` list on every cell (papermill adds one when it loads a notebook itself).
JupyterLab, VS Code and nbformat write ``"metadata": {}`` on untagged cells, so the helper
raised, the error was taken for "papermill cannot inspect this language", and a typo'd
``-p alpah 0.5`` was submitted unchecked; the job succeeded with the default.  Every
notebook here is written by the tool itself (a real Jupyter server's contents API,
``nbformat.write``, papermill) or byte for byte as the tool writes it (VS Code), and read
from disk the way a submission reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import requests
from IPython.core.error import UsageError

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.notebook import check_notebook, check_parameters, notebook_parameters

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3", "version": "3.11.9"}
PARAMS_SOURCE = "alpha = 1.0  # the weight\nn = 3"


def assert_checked(path: Path, names: list[str]) -> None:
    """A correct parameter passes, a typo'd one is refused naming the known names — read
    from the file as a submission reads it, with the job's default kernel."""
    nb = check_notebook(path)
    name = path.name
    assert notebook_parameters(nb, "python3") == names
    assert check_parameters(nb, {names[0]: 0.5}, notebook=name, kernel="python3") == []
    with pytest.raises(ConfigError) as e:
        check_parameters(nb, {"alpah": 0.5}, notebook=name, kernel="python3")
    assert e.value.field == "parameters.alpah"
    assert e.value.message == (
        f"parameters.alpah: alpah=0.5 is not a parameter of {name!r}; its cell tagged "
        f"`parameters` assigns: {', '.join(names)} (or pass --allow-unknown-parameters "
        "(allow_unknown_parameters: true) to inject it anyway)")


def untagged_metadata(path: Path) -> list:
    """The metadata of every cell that is not the parameters cell, as on disk."""
    cells = json.loads(path.read_text())["cells"]
    return [c.get("metadata") for c in cells
            if "parameters" not in (c.get("metadata") or {}).get("tags", [])]


# --- the project's own examples, as committed ------------------------------------------------

def test_examples_as_committed():
    analysis = EXAMPLES / "analysis.ipynb"
    assert untagged_metadata(analysis) == [{}, {}]  # the shape that broke the old check
    assert_checked(analysis, ["alpha"])
    nb = check_notebook(EXAMPLES / "quickstart.ipynb")  # no parameters cell at all
    with pytest.raises(ConfigError, match=r"^parameters\.alpha: 0\.5 cannot reach the "
                       r"notebook: 'quickstart\.ipynb' has no cell tagged 'parameters'"):
        check_parameters(nb, {"alpha": 0.5}, notebook="quickstart.ipynb", kernel="python3")


# --- nbformat.write ----------------------------------------------------------------------------

def _nbformat_notebook(minor: int, ids: bool):
    from nbformat import v4

    nb = v4.new_notebook(metadata={"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO})
    nb.nbformat_minor = minor
    nb.cells = [v4.new_markdown_cell("# Analysis"),
                v4.new_code_cell(PARAMS_SOURCE, metadata={"tags": ["parameters"]}),
                v4.new_code_cell("print(alpha * n)")]
    if not ids:
        for cell in nb.cells:
            del cell["id"]
    return nb


@pytest.mark.parametrize("minor,ids", [(4, False), (4, True), (5, True), (5, False)])
def test_nbformat_written(tmp_path, minor, ids):
    """v4.4 and v4.5, with and without cell ids (nbformat adds ids to a v4.5 notebook
    that has none, with a warning)."""
    import nbformat

    path = tmp_path / "written.ipynb"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cell is missing an id field" (v4.5 without)
        nbformat.write(_nbformat_notebook(minor, ids), str(path))
    saved = json.loads(path.read_text())
    assert saved["nbformat_minor"] == minor
    assert all(("id" in c) == (ids or minor == 5) for c in saved["cells"])
    assert untagged_metadata(path) == [{}, {}]
    assert_checked(path, ["alpha", "n"])


# --- JupyterLab: saved through a real Jupyter server's contents API --------------------------

@pytest.fixture(scope="module")
def jupyter_server(tmp_path_factory):
    """A plain Jupyter server (no extensions) whose contents API saves notebooks the way
    JupyterLab's save does: PUT /api/contents/PATH with the notebook model."""
    tmp = tmp_path_factory.mktemp("contents")
    for sub in ("root", "config", "data", "runtime"):
        (tmp / sub).mkdir()
    port = ports.free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_DATA_DIR": str(tmp / "data"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTER_PLATFORM_DIRS": "1"}
    off = ", ".join(f"'{x}': False" for x in (
        "jupyter_cloudtik", "jupyterlab", "jupyter_lsp", "notebook_shim",
        "jupyter_server_proxy", "jupyter_server_terminals"))
    with open(tmp / "server.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(BIN / "jupyter-server"), "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=t0ken",
             f"--ServerApp.root_dir={tmp / 'root'}",
             f"--ServerApp.jpserver_extensions={{{off}}}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            try:
                if requests.get(url + "api/status", headers={"Authorization": "token t0ken"},
                                timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the Jupyter server did not start"
            time.sleep(0.1)
        yield url, tmp / "root"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _jupyterlab_model() -> dict:
    """The notebook model JupyterLab 4 sends when saving: cells carry their ids, untagged
    cells ``"metadata": {}``, only the parameters cell has ``tags`` (set in the property
    inspector), sources as one string."""
    return {
        "cells": [
            {"cell_type": "markdown", "id": "5f2b6c1e-0d8a-4a57-9d3e-2b1f6a9c7e01",
             "metadata": {}, "source": "# Analysis\n\nRun with `-p alpha 0.5`."},
            {"cell_type": "code", "execution_count": None,
             "id": "8c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f",
             "metadata": {"tags": ["parameters"]}, "outputs": [], "source": PARAMS_SOURCE},
            {"cell_type": "code", "execution_count": 2,
             "id": "a1b2c3d4-e5f6-4789-8abc-def012345678", "metadata": {},
             "outputs": [{"name": "stdout", "output_type": "stream", "text": "3.0\n"}],
             "source": "print(alpha * n)"},
        ],
        "metadata": {"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO},
        "nbformat": 4, "nbformat_minor": 5,
    }


def test_jupyterlab_saved(jupyter_server):
    url, root = jupyter_server
    r = requests.put(url + "api/contents/lab.ipynb", headers={"Authorization": "token t0ken"},
                     json={"type": "notebook", "format": "json",
                           "content": _jupyterlab_model()}, timeout=30)
    assert r.status_code in (200, 201), r.text
    path = root / "lab.ipynb"
    saved = json.loads(path.read_text())
    assert [c["metadata"] for c in saved["cells"]] == [{}, {"tags": ["parameters"]}, {}]
    assert_checked(path, ["alpha", "n"])


# --- VS Code, byte for byte as its ipynb serializer writes ----------------------------------

VSCODE_OLD = """{
 "cells": [
  {
   "cell_type": "code",
   "execution_count": null,
   "metadata": {
    "tags": [
     "parameters"
    ]
   },
   "outputs": [],
   "source": [
    "alpha = 1.0  # the weight\\n",
    "n = 3"
   ]
  },
  {
   "cell_type": "code",
   "execution_count": 1,
   "metadata": {},
   "outputs": [
    {
     "name": "stdout",
     "output_type": "stream",
     "text": [
      "3.0\\n"
     ]
    }
   ],
   "source": [
    "print(alpha * n)"
   ]
  },
  {
   "cell_type": "code",
   "execution_count": null,
   "metadata": {
    "vscode": {
     "languageId": "shellscript"
    }
   },
   "outputs": [],
   "source": [
    "!ls"
   ]
  }
 ],
 "metadata": {
  "kernelspec": {
   "display_name": ".venv",
   "language": "python",
   "name": "python3"
  },
  "language_info": {
   "codemirror_mode": {
    "name": "ipython",
    "version": 3
   },
   "file_extension": ".py",
   "mimetype": "text/x-python",
   "name": "python",
   "nbconvert_exporter": "python",
   "pygments_lexer": "ipython3",
   "version": "3.11.9"
  },
  "orig_nbformat": 4,
  "vscode": {
   "interpreter": {
    "hash": "3c9f1f1bd5a5d3ad9c0e5e7f0d9b1b8e4b8c1f5d2a6e0c7b9a8d4f3e2c1b0a99"
   }
  }
 },
 "nbformat": 4,
 "nbformat_minor": 2
}
"""


def _vscode_new() -> str:
    """The newer serializer: cell ids, nbformat_minor 5, no ``orig_nbformat``."""
    nb = json.loads(VSCODE_OLD)
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"{i:08x}"
        nb["cells"][i] = dict(sorted(cell.items()))
    del nb["metadata"]["orig_nbformat"]
    nb["nbformat_minor"] = 5
    return json.dumps(nb, indent=1) + "\n"


@pytest.mark.parametrize("text", [VSCODE_OLD, _vscode_new()], ids=["minor2", "minor5-ids"])
def test_vscode_saved(tmp_path, text):
    path = tmp_path / "code.ipynb"
    path.write_text(text)
    assert untagged_metadata(path) == [{}, {"vscode": {"languageId": "shellscript"}}]
    assert_checked(path, ["alpha", "n"])


# --- executed by papermill: papermill metadata and an injected-parameters cell ---------------

def test_papermill_executed(tmp_path):
    import nbformat
    import papermill

    source, out = tmp_path / "in.ipynb", tmp_path / "in.out.ipynb"
    nbformat.write(_nbformat_notebook(5, True), str(source))
    papermill.execute_notebook(str(source), str(out), parameters={"alpha": 0.25},
                               kernel_name="python3", progress_bar=False)
    saved = json.loads(out.read_text())
    assert "papermill" in saved["metadata"]
    assert [c["metadata"]["tags"] for c in saved["cells"]] == [
        [], ["parameters"], ["injected-parameters"], []]
    assert_checked(out, ["alpha", "n"])  # the injected cell assigns, but is not the one


# --- when the names cannot be read ---------------------------------------------------------

def _with_kernel(tmp_path: Path, kernel: str, language: str) -> dict:
    path = tmp_path / "other.ipynb"
    nb = json.loads(VSCODE_OLD)
    nb["metadata"] = {"kernelspec": {"name": kernel, "language": language,
                                     "display_name": language}}
    path.write_text(json.dumps(nb))
    return check_notebook(path)


def test_a_language_papermill_cannot_inspect_is_said(tmp_path):
    """R: papermill injects (its R translator) but cannot inspect: submitted, with a
    warning that the names were not checked — not silence."""
    nb = _with_kernel(tmp_path, "ir", "R")
    assert check_parameters(nb, {"alpah": 0.5}, notebook="r.ipynb", kernel="ir") == [
        "parameters: the parameter names of an R notebook are not checked (papermill "
        "cannot inspect R code; it inspects Python): alpah is injected into 'r.ipynb' after "
        "its cell tagged `parameters`, whether that cell assigns it or not"]


def test_a_check_that_cannot_run_refuses(tmp_path):
    """No translator for the kernel (papermill could not inject either) or no kernel
    and no language: refused, naming the parameter, the cause and the opt-out."""
    nb = _with_kernel(tmp_path, "javascript", "javascript")
    with pytest.raises(ConfigError) as e:
        check_parameters(nb, {"alpah": 0.5}, notebook="js.ipynb", kernel="javascript")
    assert e.value.field == "parameters.alpah"
    assert e.value.message.startswith(
        "parameters.alpah: the parameters of 'js.ipynb' could not be checked: papermill "
        "cannot inject parameters into it (No parameter translator functions specified "
        "for kernel 'javascript' or language 'javascript'); pass --allow-unknown-parameters")
    assert "\n" not in e.value.message
    warnings = check_parameters(nb, {"alpah": 0.5}, notebook="js.ipynb",
                                kernel="javascript", allow_unknown=True)
    assert warnings == ["parameters: the parameters of 'js.ipynb' could not be checked "
                        "(papermill cannot inject parameters into it (No parameter "
                        "translator functions specified for kernel 'javascript' or language "
                        "'javascript')); submitted unchecked (allow_unknown_parameters)"]

    nb["metadata"] = {}
    with pytest.raises(ConfigError, match=r"^parameters\.alpah: the parameters of 'x\.ipynb' "
                       r"could not be checked: the notebook names no kernel and no language"):
        check_parameters(nb, {"alpah": 0.5}, notebook="x.ipynb")


# --- the public faces on examples/analysis.ipynb ---------------------------------------------

EXPECTED = ("parameters.alpah: alpah=0.5 is not a parameter of 'analysis.ipynb'; its cell "
            "tagged `parameters` assigns: alpha (or pass --allow-unknown-parameters "
            "(allow_unknown_parameters: true) to inject it anyway)")


def test_magic_refuses_a_typo_in_the_example(ip):
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("hpc", f"submit {EXAMPLES / 'analysis.ipynb'} -p alpah 0.5")
    assert str(e.value) == EXPECTED
    assert "No jobs" in repr(ip.run_line_magic("hpc", "status"))  # nothing was submitted


def test_magic_says_the_names_of_an_r_notebook_are_not_checked(ip, tmp_path, capsys):
    nb = json.loads(VSCODE_OLD)
    nb["metadata"] = {"kernelspec": {"name": "ir", "language": "R", "display_name": "R"}}
    (tmp_path / "r.ipynb").write_text(json.dumps(nb))
    # no R kernel here: the job fails at once, after the submission said its warning
    job = ip.run_line_magic("hpc", f"submit {tmp_path / 'r.ipynb'} -p beta 2 --kernel ir "
                                   "--wait")
    err = capsys.readouterr().err
    assert f"WARNING: job {job.id}: parameters: the parameter names of an R notebook are " \
           "not checked" in err
    assert "not checked" in job.info.warnings[0]


def test_cli_refuses_a_typo_in_the_example():
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", *args],
                              capture_output=True, text=True, timeout=120, env={**os.environ})

    r = cli("submit", str(EXAMPLES / "analysis.ipynb"), "-p", "alpah", "0.5")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {EXPECTED}"], r.stderr
    assert r.stdout == ""
    assert json.loads(cli("status", "--json").stdout) == []  # no job was created
