"""The README's emulated Huawei Cloud walkthrough, run as written.

Its first shell block starts the emulator (fast mode: servers are local processes, no
network needed — what a newcomer runs first) and creates the workspace; the Python block
runs in a real IPython kernel started with the shell's environment (the magics,
``c.client()`` over mutual TLS through the head's EIP, the sum); the last shell block
deletes the workspace and asks the emulator what is left ("resources  none").  Only
``/tmp/hwc`` is replaced by a folder of this test's own (other tests run at the same time).
Realistic mode (``--realistic --image bookworm``, the README's next sentence) is
docs/huaweicloud.md's block and tests/huaweicloud/test_realistic.py's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import doc_examples
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _bash(script: str, env: dict[str, str], log: Path, timeout: float = 400) -> str:
    # output to a file, not a pipe: the emulator the script starts in the background
    # keeps its copy of the descriptors open after the script ends
    with open(log, "w") as out:
        r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], env=env,
                           stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text()
    assert r.returncode == 0, text
    return text


def test_readme_huawei_walkthrough_runs_as_written(tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    from cloudtik_emulators.huaweicloud.control import EmulatorControl

    blocks = doc_examples.blocks("README.md", "Huawei Cloud (emulated)")
    assert [b.lang for b in blocks] == ["bash", "python", "bash"], blocks
    start, notebook, finish = (b.text for b in blocks)
    # the first command needs no root and no network: fast mode
    assert "--realistic" not in start and "--image" not in start, start
    root = tmp_path / "hwc"

    def ours(text: str) -> str:
        return text.replace("/tmp/hwc", str(root))

    home, state = tmp_path / "home", tmp_path / "state"
    home.mkdir()
    state.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUAWEICLOUD_")}
    env.update(HOME=str(home), CLOUDTIK_STATE_DIR=str(state),
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    # "started from the same shell": what the block exports, the kernel has
    exports = dict(re.findall(r"^export (\w+)=(\S+)", ours(start), re.M))
    assert "HUAWEICLOUD_CREDENTIALS_FILE" in exports, start
    emulator_id = None
    try:
        out = _bash(ours(start), env, tmp_path / "start.log")
        assert "workspace" in out.lower(), out
        emulator_id = json.loads((root / "emulator.json").read_text())["emulator_id"]
        for k, v in {**env, **exports}.items():
            monkeypatch.setenv(k, v)
        for k in [k for k in os.environ if k.startswith("HUAWEICLOUD_") and k not in exports]:
            monkeypatch.delenv(k)
        client = NotebookClient(new_notebook(), kernel_name="python3", timeout=300)
        outputs = []
        with client.setup_kernel():  # line by line, as typed into IPython
            for line in [ln for ln in notebook.splitlines() if ln.strip()]:
                cell = new_code_cell(line)
                client.nb.cells.append(cell)
                client.execute_cell(cell, len(client.nb.cells) - 1)
                outputs.append((line, [str(o.get("data", {}).get("text/plain", ""))
                                       for o in cell.outputs
                                       if o.get("output_type") == "execute_result"]))
        (answer,) = [out for line, out in outputs if "client.submit(" in line]
        assert answer == ["6"], outputs
        assert any(r["action"] == "ecs.create_post_paid_servers"
                   for r in EmulatorControl.from_dir(root).requests(0))
        out = _bash(ours(finish), {**env, **exports}, tmp_path / "finish.log")
        assert re.search(r"^resources\s+none$", out, re.M), out
    finally:
        info = root / "emulator.json"
        if info.exists():
            ctl = EmulatorControl.from_dir(root)
            try:
                ctl.shutdown()
            except Exception:
                pass
            pid = json.loads(info.read_text())["pid"]
            import psutil

            try:
                psutil.Process(pid).wait(timeout=60)
            except psutil.NoSuchProcess:
                pass
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert emulator_id and f"ctk{emulator_id[:6]}" not in left, left
