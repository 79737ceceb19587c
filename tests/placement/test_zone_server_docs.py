"""docs/placement.md's standalone zone server, run as written (a test folder for /srv, a
token for ``...``, a free port): it serves the zone API to its token only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import doc_examples

from cloudtik_emulators.hub import free_port
from cloudtik_emulators.zones import Zone

REQUEST = {"count": 1, "resources": {"CPU": 1}, "node_type": "worker", "cluster": "c",
           "user": "ann"}


def test_the_documented_zone_server_answers_its_token_only(tmp_path):
    b = doc_examples.block("docs/placement.md", "Zones", lang="bash")
    token, port = "zone-" + os.urandom(8).hex(), free_port()
    text = (b.text.replace("/srv/zone-b", str(tmp_path / "zone-b"))
            .replace("CLOUDTIK_ZONE_TOKEN=...", f"CLOUDTIK_ZONE_TOKEN={token}")
            .replace("--port 8870", f"--port {port}")
            .replace("python -m", f"exec {sys.executable} -m"))
    assert str(port) in text and token in text and "zone-b" in text
    assert token not in b.text  # the token is in the environment, not on the command line
    proc = subprocess.Popen(["bash", "-e", "-c", text], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")})
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"listening on http://127.0.0.1:{port} (zone 'b')"), (
            line + proc.stderr.read())
        zone = Zone("b", f"http://127.0.0.1:{port}", token, Path(tmp_path / "zone-b"), proc)
        status, _ = zone.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST},
                              token="")
        assert status in (401, 403)
        status, _ = zone.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST},
                              token="wrong-" + token)
        assert status in (401, 403)
        status, sel = zone.call("POST", "/cloudtik/api/zones/select", {"request": REQUEST})
        assert status == 200, sel
        assert (tmp_path / "zone-b").is_dir()  # its state folder is the one named
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert token.encode() not in f.read()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
