"""Real Jupyter servers with the extension, started once per test session.

* ``lab``: JupyterLab on 127.0.0.1 with its own state, config, data and runtime folders;
  used by the REST, kernel, backend and browser tests.
* ``guarded``: a second Jupyter server with an authorizer that refuses resource
  ``cloudtik`` to requests carrying ``X-Deny-CloudTik``, and small limits; used by the
  permission tests and by schemathesis (which may try to start clusters).

At the end every cluster is shut down through the API and the session fails if any
process of their state folders is left behind.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from jupyter_cloudtik.core import ports

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
BIN = Path(sys.executable).parent

DENY_AUTHORIZER = '''
from jupyter_server.auth import Authorizer


class DenyCloudTikAuthorizer(Authorizer):
    """Refuses resource 'cloudtik' to requests that carry X-Deny-CloudTik."""

    def is_authorized(self, handler, user, action, resource):
        if resource == "cloudtik" and handler.request.headers.get("X-Deny-CloudTik"):
            return False
        return True
'''


def free_port() -> int:
    return ports.free_port()


@dataclass
class Server:
    """A running Jupyter server process and how to talk to it."""

    url: str  # http://127.0.0.1:PORT/
    token: str
    root: Path
    state_dir: Path
    proc: subprocess.Popen
    log_path: Path
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def api_url(self) -> str:
        return self.url + "cloudtik/api/"

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"token {self.token}", **extra}

    def request(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {**self.headers(), **kw.pop("headers", {})}
        return self.session.request(method, self.api_url + path, headers=headers,
                                    timeout=kw.pop("timeout", 60), **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.request("GET", path, **kw)

    def wait_operation(self, op_id: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            op = self.get(f"operations/{op_id}").json()
            if op["state"] in ("succeeded", "failed", "cancelled"):
                return op
            time.sleep(0.1)
        raise AssertionError(f"operation {op_id} did not finish in {timeout}s")

    def down_all(self) -> None:
        for c in self.get("clusters").json()["clusters"]:
            r = self.request("DELETE", f"clusters/{c['name']}")
            if r.status_code == 202:
                self.wait_operation(r.json()["operation"]["id"])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _start_server(tmp: Path, app: str, extra_args: list[str], extra_env: dict[str, str]
                  ) -> Server:
    for sub in ("state", "config", "data", "runtime", "root", "ipython", "workspaces"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    # no "get notified about Jupyter news?" toast over the screenshots
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # the side panel as built in this checkout: JUPYTER_PATH's labextensions come first
    # (before the virtualenv's), so a worktree's build is served, not the one the shared
    # venv's `jupyter labextension develop` link points at
    built = ROOT / "jupyter_cloudtik" / "labextension"
    jupyter_path = {}
    if (built / "package.json").is_file():
        (tmp / "jpath" / "labextensions").mkdir(parents=True, exist_ok=True)
        link = tmp / "jpath" / "labextensions" / "jupyter-cloudtik"
        if not link.exists():
            link.symlink_to(built.resolve(), target_is_directory=True)
        jupyter_path["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (str(tmp / "jpath"), os.environ.get("JUPYTER_PATH")) if p)
    token = secrets.token_hex(24)
    env = {
        **os.environ,
        "CLOUDTIK_STATE_DIR": str(tmp / "state"),
        "CLOUDTIK_LAUNCHER_IDLE": "3",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "CLOUDTIK_PROGRESS": "text",
        **jupyter_path,
        **extra_env,
    }
    for var in ("CLOUDTIK_API_URL", "CLOUDTIK_API_TOKEN", "JUPYTER_TOKEN"):
        env.pop(var, None)
    log_path = tmp / "server.log"
    return ports.start_with_free_port(
        lambda port: _start_on(port, tmp, app, token, extra_args, env, log_path))


def _start_on(port: int, tmp: Path, app: str, token: str, extra_args: list[str],
              env: dict[str, str], log_path: Path) -> Server:
    args = [
        str(BIN / f"jupyter-{app}"), "--no-browser", "--allow-root", "--ip=127.0.0.1",
        f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'root'}",
        *extra_args,
    ]
    if not any(a.startswith("--LocalProvider.prewarm=") for a in extra_args):
        # no launcher per server start (`lab` keeps it); one value only: traitlets refuses
        # a setting given twice when the provider reads its config
        args.append("--LocalProvider.prewarm=False")
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Server(url=f"http://127.0.0.1:{port}/", token=token, root=tmp / "root",
                    state_dir=tmp / "state", proc=proc, log_path=log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = server.log_text()
            if f"port {port} is not available" in text:  # taken between pick and bind
                raise ports.PortInUse(port)
            raise RuntimeError(f"jupyter {app} exited:\n{text[-3000:]}")
        try:
            if requests.get(server.url + "api/status", headers=server.headers(),
                            timeout=2).ok:
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    _stop(server)
    raise RuntimeError(f"jupyter {app} did not start:\n{server.log_text()[-3000:]}")


def stop_state_processes(state_dir: Path) -> list[str]:
    """Stop the daemons of a state folder; report (and kill) node processes still alive."""
    from cloudtik_emulators.processes import (
        cloudtik_processes,
        describe,
        kill_all,
        stop_launcher,
    )
    from jupyter_cloudtik.storage.mounts import stop_supervisor

    stop_launcher(state_dir)
    stop_supervisor(state_dir)  # the mount daemon, if a mount was asked for (it idles out)
    left = cloudtik_processes(state_dir)
    if not left:
        return []
    text = describe(left)
    kill_all(left)
    nodes = [line for line in text.splitlines()
             if "launcher" not in line and "reaper" not in line]
    return [f"node processes left behind:\n{chr(10).join(nodes)}"] if nodes else []


def _stop(server: Server) -> list[str]:
    """Shut down clusters, the server and the state folder's daemons; report leftovers."""
    problems: list[str] = []
    if server.proc.poll() is None:
        try:
            server.down_all()
        except Exception as e:  # report, but still stop everything
            problems.append(f"down_all failed: {e}")
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(5)
    return problems + stop_state_processes(server.state_dir)


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Server]:
    """JupyterLab with the extension (and the prebuilt side panel)."""
    tmp = tmp_path_factory.mktemp("lab")
    server = _start_server(tmp, "lab", [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
        "--LocalProvider.prewarm=True",  # as installed: the server's start starts the launcher
    ], {})
    yield server
    problems = _stop(server)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(server.log_path, ARTIFACTS / "lab-server.log")
    assert not problems, problems


@pytest.fixture(scope="session")
def guarded(tmp_path_factory) -> Iterator[Server]:
    """A server whose authorizer can refuse the cloudtik permission, with small limits."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "pylib").mkdir()
    (tmp / "pylib" / "cloudtik_test_auth.py").write_text(DENY_AUTHORIZER)
    server = _start_server(tmp, "server", [
        "--ServerApp.authorizer_class=cloudtik_test_auth.DenyCloudTikAuthorizer",
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
        "--CloudTik.max_clusters=1",
        "--CloudTik.max_workers_per_cluster=1",
        "--CloudTikServer.max_body_bytes=65536",
    ], {"PYTHONPATH": str(tmp / "pylib")})
    yield server
    problems = _stop(server)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(server.log_path, ARTIFACTS / "guarded-server.log")
    assert not problems, problems


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


DOC_IMAGES = ROOT / "docs" / "images"
DOC_IMAGE_LIMIT = 150_000


def doc_image(target: Any, name: str) -> Path:
    """Screenshot a page or locator to test-artifacts/NAME.png and, with
    ``CLOUDTIK_DOC_IMAGES=1`` (``make doc-images``), to docs/images/NAME.png: the README's
    pictures come from these tests, not from hand-made captures.  Kept under 150 KB
    (palette-reduced)."""
    from PIL import Image

    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    target.screenshot(path=str(path))
    if os.environ.get("CLOUDTIK_DOC_IMAGES") == "1":
        out = DOC_IMAGES / f"{name}.png"
        img = Image.open(path).convert("RGB").quantize(colors=128, method=Image.MEDIANCUT)
        img.save(out, optimize=True)
        assert out.stat().st_size < DOC_IMAGE_LIMIT, (out, out.stat().st_size)
    return path


# --------------------------------------------------------------------------- browsers
@pytest.fixture(scope="module")
def lab_only_browser(lab) -> Iterator[Any]:
    """Chromium (the plain one is ``browser``, tests/conftest.py) that reaches nothing but
    the ``lab`` server: a cluster's page it shows can
    only have come through the server's routes."""
    from cloudtik_emulators.browser import chromium

    with chromium(reach_only=urlsplit(lab.url).netloc) as b:
        yield b


def coloured_fraction(png: bytes) -> float:
    """The share of pixels that are neither white-ish nor grey background: plot content."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").resize((200, 150))
    raw = img.tobytes()
    pixels = [raw[i:i + 3] for i in range(0, len(raw), 3)]
    coloured = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 40)
    return coloured / len(pixels)


def wait_for_plot_content(page: Any, url: str, artifact: str, what: str,
                          timeout: float = 60) -> None:
    """Open a dashboard page and wait until its screenshot (kept as ``artifact``) shows
    plot content: the canvas alone is drawn before the websocket data arrives."""
    page.goto(url)
    page.wait_for_selector("canvas", timeout=60_000)
    deadline = time.monotonic() + timeout
    fraction = 0.0
    while time.monotonic() < deadline:
        fraction = coloured_fraction(page.screenshot(path=str(ARTIFACTS / artifact)))
        if fraction > 0.01:
            return
        time.sleep(1)
    raise AssertionError(f"{what} ({fraction:.4f})")


def panel_cluster_item(page: Any, lab: Server, workspace: str, name: str) -> Any:
    """Open JupyterLab in a workspace of the test's own (the layout it leaves is restored
    nowhere else), open the side panel and wait for cluster ``name``'s entry."""
    page.goto(f"{lab.url}lab/workspaces/{workspace}?token={lab.token}")
    page.wait_for_selector(".jp-LabShell", timeout=90_000)
    page.click("li[data-id='jupyter-cloudtik-panel']")
    item = page.locator(f".jp-CloudTik-cluster[data-name='{name}']")
    item.wait_for(timeout=30_000)
    return item


# --------------------------------------------------------------------------- openapi.yaml
@pytest.fixture(scope="session")
def spec_checker(lab) -> Any:
    """The OpenAPI document as the ``lab`` server serves it, pointed at that server."""
    import yaml
    from openapi_core import OpenAPI

    served = yaml.safe_load(lab.get("openapi.yaml").text)
    served["servers"] = [{"url": lab.api_url.rstrip("/")}]
    return OpenAPI.from_dict(served)


def checked(spec_checker: Any, resp: requests.Response) -> requests.Response:
    """Validate a real response against the OpenAPI document, then return it."""
    from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse

    spec_checker.validate_response(RequestsOpenAPIRequest(resp.request),
                                   RequestsOpenAPIResponse(resp))
    return resp
