"""Zone servers on loopback, for tests and trying zones out: one process per zone.

``start_zone(root, name, offers, token)`` starts ``python -m jupyter_cloudtik.placement.server``
with its own state folder, config and offer catalog, and returns a ``Zone`` that can call
its API and run ``jupyter cloudtik`` as that zone's admin.  ``SilentServer`` accepts
connections and never answers (a hung zone).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_cloudtik.core import env as envnames


@dataclass
class Zone:
    name: str
    url: str
    token: str
    state_dir: Path
    proc: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)

    def call(self, method: str, path: str, body=None, token: str | None = None,
             timeout: float = 20.0):
        """(status, json) of a request to this zone's API, with its token by default."""
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        tok = self.token if token is None else token
        if tok:
            req.add_header("Authorization", f"token {tok}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "jupyter_cloudtik", *args], capture_output=True,
            text=True, timeout=60, env={**os.environ, **self.env, **(env or {})})

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_zone(root: Path, name: str, offers: list[dict], token: str,
               placement: dict | None = None, providers: str = "",
               config: dict | None = None) -> Zone:
    """``providers`` (comma-separated, e.g. ``"local"``) are the providers whose offers
    the zone places on and creates nodes with; ``config`` adds other sections of the
    zone's ``jupyter_cloudtik_config.json`` (e.g. ``{"LocalProvider": {...}}``)."""
    state = root / name / "state"
    conf = root / name / "config"
    state.mkdir(parents=True)
    conf.mkdir(parents=True)
    catalog = root / name / "catalog.json"
    catalog.write_text(json.dumps({"offers": offers}))
    (conf / "jupyter_cloudtik_config.json").write_text(
        json.dumps({**(config or {}),
                    "Placement": {"zone_name": name, **(placement or {})}}))
    env = {envnames.STATE_DIR: str(state), "JUPYTER_CONFIG_DIR": str(conf),
           envnames.ZONE_TOKEN: token, envnames.LAUNCHER_IDLE: "5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_cloudtik.placement.server", "--port", "0",
         "--zone-name", name, "--catalog", str(catalog), "--providers", providers],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env})
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"zone {name} did not start: {line}{proc.stderr.read()}")
    url = line.split()[2]
    return Zone(name, url, token, state, proc, env)


class SilentServer:
    """A TCP server that accepts connections and never answers (a hung child zone)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


def wait_until(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False
