"""The README's notebook steps in a kernel of a real JupyterLab, and every address they
show (issue 28.2/28.3): a browser that reaches only the Jupyter server must be able to open
each one, so a shown URL is the server's own, or a path on it — never a node's port.

The storage step's form and the HPC block have tests of their own
(test_storage_notebook_browser.py, tests/test_doc_examples.py); this one runs the Python
API block statement by statement, as typed into cells, and the magics of the README's
table, and reads every output's every MIME type (text, HTML, widgets' state aside).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import doc_examples
import pytest

from tests.server.kernels import running_kernel

pytestmark = pytest.mark.slow

URL = re.compile(r"""(?:https?|wss?)://[^\s"'<>)\]]+""")
HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")


def _run(kernel: Any, code: str, shown: list[str], timeout: float = 180) -> None:
    errors: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            shown.append(content["text"])
        elif kind in ("execute_result", "display_data", "update_display_data"):
            shown.extend(str(v) for k, v in content["data"].items()
                         if not k.startswith("application/vnd.jupyter.widget"))
        elif kind == "error":
            errors.append(f"{content['ename']}: {content['evalue']}")

    reply = kernel.client.execute_interactive(code, timeout=timeout, output_hook=hook)
    assert not errors and reply["content"]["status"] == "ok", (code, errors)


def test_readme_steps_in_a_lab_kernel_show_only_addresses_on_the_server(lab):
    api = doc_examples.block("README.md", "Python API").text
    statements = [ast.get_source_segment(api, s) for s in ast.parse(api).body]
    magics = ["%load_ext jupyter_cloudtik", "m = %cluster up --name readme-magics --workers 1",
              "%cluster status readme-magics", "%cluster list", "m",
              "%cluster down readme-magics"]
    shown: list[str] = []
    with running_kernel(lab, "readme-steps.ipynb") as kernel:
        for code in statements + magics:
            _run(kernel, code, shown)
    text = "\n".join(shown)
    assert "6" in text  # the block's c.client().submit(sum, [1, 2, 3]).result()
    urls = URL.findall(text)
    assert urls or HREF.findall(text), text[:2000]  # the dashboard links are shown
    elsewhere = [u for u in urls if not u.startswith(lab.url.rstrip("/"))
                 and not u.startswith(("tcp://", "tls://"))]
    assert not elsewhere, elsewhere
    # links in HTML: a path on this server (the dashboard route), or the server's URL
    for href in HREF.findall(text):
        assert href.startswith(("/", lab.url, "#", "data:")), href
    dashboards = re.findall(r"/cloudtik/dashboard/[^\s\"'<>]+", text)
    assert dashboards, text[:2000]
