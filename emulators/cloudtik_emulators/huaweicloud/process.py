"""The emulator as its own process, for test fixtures (Huawei Cloud tests, hub tests).

It runs apart from the code under test, like the real cloud: killing a test's process
mid-``up`` does not touch it, and the emulated servers' processes are its children.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .control import EmulatorControl


@dataclass
class EmulatorProcess:
    info: dict[str, Any]     # endpoint, region, admin token, emulator id
    dir: Path
    proc: subprocess.Popen
    ctl: EmulatorControl

    def credentials(self) -> dict[str, str]:
        """The account's keys, as the emulator wrote them to its credentials file."""
        parser = configparser.ConfigParser()
        parser.read(self.dir / "credentials")
        return dict(parser["default"])

    def processes(self) -> list[int]:
        """Live processes of emulated servers."""
        from .machines import server_processes

        return server_processes(self.dir, self.info["emulator_id"])

    def stop(self) -> list[int]:
        """Stop it; returns the emulated servers' processes still alive (should be none)."""
        try:
            self.ctl.shutdown()
        except Exception:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.processes()


def start_emulator(root: Path, *, boot_seconds: float = 0.1, no_boot: bool = False,
                   timeout: float = 30, realistic: bool = False,
                   image: str | None = None, region: str | None = None,
                   bucket_release_seconds: float | None = None) -> EmulatorProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUAWEICLOUD_")}
    env["HOME"] = str(root)
    with open(root / "emulator.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cloudtik_emulators.huaweicloud", "--dir", str(root),
             "--boot-seconds", str(boot_seconds), *(["--no-boot"] if no_boot else []),
             *(["--realistic"] if realistic else []),
             *(["--image", image] if image else []),
             *(["--region", region] if region else [])],
            stdout=log, stderr=subprocess.STDOUT,
            env=env)
    deadline = time.monotonic() + timeout
    while not (root / "emulator.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the emulator did not start: "
                               + (root / "emulator.log").read_text()[-2000:])
        time.sleep(0.05)
    info = json.loads((root / "emulator.json").read_text())
    ctl = EmulatorControl(info["endpoint"], info["admin_token"])
    if bucket_release_seconds is not None:  # tests that reuse names need not wait 30 min
        ctl.set_options(bucket_release_seconds=bucket_release_seconds)
    return EmulatorProcess(info, root, proc, ctl)
