"""The CLI in a JupyterLab terminal shows dashboards through the server (issue 28.3).

A browser of a remote JupyterLab reaches only the Jupyter server: a terminal of that
server must print the server's dashboard path, not the node's own ``127.0.0.1:PORT``.
The terminal is a real one of the real server (its REST API and websocket), the CLI runs
in it as a user would type it.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest
from tornado.websocket import websocket_connect


async def _run_in_terminal(lab, command: str, timeout: float = 90) -> str:
    """Type ``command`` into a new terminal of ``lab``; everything it printed."""
    r = lab.session.post(lab.url + "api/terminals", headers=lab.headers(), timeout=30)
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    ws_url = lab.url.replace("http://", "ws://") + f"terminals/websocket/{name}"
    conn = await websocket_connect(ws_url + f"?token={lab.token}")
    out = ""
    try:
        conn.write_message(json.dumps(["stdin", f"{command}; echo __DONE$((6*7))__\r"]))
        deadline = time.monotonic() + timeout
        while "__DONE42__" not in out:
            msg = await asyncio.wait_for(conn.read_message(), deadline - time.monotonic())
            assert msg is not None, out
            kind, *rest = json.loads(msg)
            if kind == "stdout":
                out += rest[0]
    finally:
        conn.close()
        lab.session.delete(lab.url + f"api/terminals/{name}", headers=lab.headers(),
                           timeout=30)
    return out


@pytest.mark.slow
def test_cli_in_a_lab_terminal_shows_the_servers_dashboard_path(lab):
    name = "termlinks"
    r = lab.request("POST", "clusters", json={"name": name, "workers": 0})
    assert r.status_code == 202, r.text
    assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
    try:
        # the venv's jupyter (a login shell's PATH may not have it first)
        jupyter = Path(sys.executable).parent / "jupyter"
        text = asyncio.run(_run_in_terminal(lab, f"{jupyter} cloudtik status {name}"))
        line = next((ln for ln in text.splitlines() if ln.startswith("dashboard ")), None)
        assert line is not None, text
        shown = line.split()[1]
        assert shown == f"{lab.url}cloudtik/dashboard/{name}/status", line
        # ...which is the server's own route: it serves this cluster's dashboard
        page = lab.session.get(shown, headers=lab.headers(), timeout=60)
        assert page.status_code == 200 and "Dask" in page.text, page.status_code
        # no web address but the server's in what the terminal printed
        urls = re.findall(r"https?://[^\s]+", text)
        assert urls and all(u.startswith(lab.url) for u in urls), urls
        assert "this machine only" not in text
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])


def test_cli_without_a_server_labels_a_node_address(state_dir, capsys):
    """No Jupyter server serves this state folder: the node's own address, said to be
    this machine's only."""
    from jupyter_cloudtik.cli import main

    try:
        with pytest.raises(SystemExit) as done:
            main(["up", "--name", "plainlinks", "--workers", "0"])
        assert done.value.code == 0, capsys.readouterr()
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["status", "plainlinks"])
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if ln.startswith("dashboard "))
        assert re.match(r"dashboard\s+http://127\.0\.0\.1:\d+/status  \(this machine only\)$",
                        line), line
    finally:
        with pytest.raises(SystemExit):
            main(["down", "plainlinks"])
