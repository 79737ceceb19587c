"""Kernels started by a real Jupyter server, driven over ZMQ like a frontend would."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from jupyter_client import BlockingKernelClient


class KernelError(AssertionError):
    pass


class RunningKernel:
    def __init__(self, client: BlockingKernelClient) -> None:
        self.client = client

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute ``code``; return what it printed and displayed as text, raise its error."""
        out: list[str] = []
        error: list[str] = []

        def hook(msg) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                error.append(f"{content['ename']}: {content['evalue']}")

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook)
        if error or reply["content"]["status"] != "ok":
            raise KernelError("; ".join(error) or str(reply["content"]))
        return "".join(out)


def connected_client(connection_file: str, timeout: float = 60) -> BlockingKernelClient:
    """A client of the kernel of ``connection_file``, once it answers ``kernel_info``.

    Without a heartbeat channel: a client not made by the kernel's manager judges the
    kernel alive by its heartbeat, and ``wait_for_ready`` called a kernel that was still
    starting on a loaded machine "died" when one beat came late (a CI run failed so in
    tests/hub/test_hub_docs_config.py, 1.7 s after the start).  Ready is what counts: a
    reply, or a timeout that says the kernel did not answer."""
    client = BlockingKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=timeout)
    except BaseException:
        client.stop_channels()
        raise
    return client


@contextlib.contextmanager
def running_kernel(server, path: str) -> Iterator[RunningKernel]:
    """A kernel started by ``server`` for notebook ``path`` (as JupyterLab starts them)."""
    resp = server.session.post(server.url + "api/sessions", headers=server.headers(), json={
        "path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}},
        timeout=60)
    resp.raise_for_status()
    session = resp.json()
    kernel_id = session["kernel"]["id"]
    runtime = Path(server.root).parent / "runtime"
    client = connected_client(str(runtime / f"kernel-{kernel_id}.json"))
    try:
        yield RunningKernel(client)
    finally:
        client.stop_channels()
        server.session.delete(server.url + f"api/sessions/{session['id']}",
                              headers=server.headers(), timeout=60)


@contextlib.contextmanager
def kernel_api_token(server, timeout: float = 30) -> Iterator[str]:
    """The ``CLOUDTIK_API_TOKEN`` a kernel of ``server`` finds in its environment (read
    from the kernel process, as code in it would), while that kernel runs."""
    import psutil
    import requests

    r = requests.post(server.url + "api/kernels", headers=server.headers(),
                      json={"name": "python3"}, timeout=30)
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    try:
        deadline = time.monotonic() + timeout
        token = None
        while token is None and time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline", "environ"]):
                if kid in " ".join(p.info["cmdline"] or []):
                    token = (p.info["environ"] or {}).get("CLOUDTIK_API_TOKEN") or None
                    if token:
                        break
            else:
                time.sleep(0.2)
        if token is None:
            raise AssertionError(f"no process of kernel {kid} with CLOUDTIK_API_TOKEN")
        yield token
    finally:
        requests.delete(server.url + f"api/kernels/{kid}", headers=server.headers(),
                        timeout=30)
