"""The placement endpoints mounted in a real Jupyter server, behind Jupyter's own auth.

The server extension (jupyter_cloudtik/server/) mounts ``jupyter_server_handlers``; until it
lands, a one-function extension in this test does the same, in a real ``jupyter server``
process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("jupyter_server")

EXTENSION = textwrap.dedent('''
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.placement.handlers import jupyter_server_handlers
    from jupyter_cloudtik.placement.settings import Placement
    from jupyter_cloudtik.placement.zones import ZoneService

    def _jupyter_server_extension_points():
        return [{"module": "zone_ext"}]

    def _load_jupyter_server_extension(serverapp):
        settings = CloudTik(parent=serverapp)
        placement = Placement(parent=settings, zone_name="jz", zone_providers=[],
                              offer_catalog=serverapp.config.get("ZoneExt", {}).get("catalog", ""))
        service = ZoneService(Store(settings.state_dir), settings, placement)
        serverapp.web_app.add_handlers(
            ".*$", jupyter_server_handlers(service, serverapp.base_url))
''')


def call(url, body=None, token=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_endpoints_in_a_jupyter_server(state_dir, tmp_path):
    (tmp_path / "zone_ext.py").write_text(EXTENSION)
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"offers": [
        {"key": "jz-rack", "provider": "static", "price_per_hour": 0.2,
         "free": {"instances": 3}}]}))
    (tmp_path / "cfg.json").write_text(json.dumps({"ZoneExt": {"catalog": str(catalog)}}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--ServerApp.token=jt0k",
         f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.open_browser=False",
         "--ServerApp.jpserver_extensions={'zone_ext': True}", "--allow-root",
         f"--config={tmp_path / 'cfg.json'}", "--ServerApp.port_retries=0"],
        stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token=jt0k", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, "the jupyter server did not start"
                time.sleep(0.2)
        api = f"{url}/cloudtik/api/zones/select"
        req = {"request": {"count": 2, "resources": {"CPU": 1}}}
        status, _ = call(api, req)
        assert status == 403  # Jupyter's auth: no token, no answer
        status, sel = call(api, req, token="jt0k")
        assert status == 200 and sel["zone"] == "jz"
        assert [o["count"] for o in sel["options"]] == [2]
        status, boot = call(f"{url}/cloudtik/api/zones/boot",
                            {**req, "hints": [{"hint": sel["options"][0]["hint"],
                                               "count": 2}]}, token="jt0k")
        assert status == 200 and boot["instances"] == 2
        status, res = call(f"{url}/cloudtik/api/reservations/{boot['reservation_id']}",
                           token="jt0k")
        assert status == 200 and res["instances"] == 2
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
