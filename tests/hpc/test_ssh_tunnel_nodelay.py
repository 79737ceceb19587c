"""A kernel reached through SSH tunnels answers about as fast as one reached directly
(transport/shell.py, ``interactive``).

A connection that only forwards ports keeps Nagle's algorithm on sshd's side (OpenSSH
turns TCP_NODELAY on only for a session with a pty), and every small reply then waited
for Linux's 40 ms delayed ACK: issue 33's cell latency ratio of 2.27.  Here a real
ipykernel on this machine is reached directly and through ``SSHShell.forward_through``
(a real OpenSSH sshd as login node and as node, as ``benchmarks/hpc_kernel_tunnels.py``
does); and a site that refuses ptys still gets working tunnels, said once in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import statistics
import subprocess
import sys
import time

import pytest

from jupyter_cloudtik.core import ports
from tests.hpc.test_hpc_slurm_ssh import Sshd

pytestmark = [pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/usr/sbin/sshd"),
                                 reason="needs root and openssh-server"),
              pytest.mark.slow]

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def _free_port() -> int:
    return ports.free_port()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    base = tmp_path_factory.mktemp("tunnel-kernel")
    info = {"transport": "tcp", "ip": "127.0.0.1", "key": secrets.token_hex(16),
            "signature_scheme": "hmac-sha256", **{p: _free_port() for p in PORTS}}
    (base / "kernel.json").write_text(json.dumps(info))
    proc = subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f",
                             str(base / "kernel.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield info
    finally:
        proc.kill()
        proc.wait(10)


def _sshd(folder, *extra: str) -> Sshd:
    folder.mkdir()
    sshd = Sshd(folder)
    with open(folder / "sshd_config", "a") as f:
        f.writelines(line + "\n" for line in extra)
    return sshd.start()


def _shell(sshd: Sshd):
    from jupyter_cloudtik.transport.shell import SSHShell

    return SSHShell("127.0.0.1", user="root", port=sshd.port, private_key=sshd.private_key,
                    known_hosts=str(sshd.folder / "known_hosts"))


def _round_trips(info: dict, n: int) -> list[float]:
    from jupyter_client.asynchronous import AsyncKernelClient

    async def go() -> list[float]:
        kc = AsyncKernelClient()
        kc.load_connection_info(info)
        # no heartbeat: a bare client takes a heartbeat slower than 1 s (a loaded machine,
        # a fresh tunnel) for a dead kernel; here the round trips are what is measured
        kc.start_channels(hb=False)
        try:
            await kc.wait_for_ready(timeout=60)
            out = []
            for i in range(n + 3):
                t0 = time.perf_counter()
                reply = await kc.execute_interactive("pass", timeout=60)
                assert reply["content"]["status"] == "ok", reply
                if i >= 3:  # the first ones warm up
                    out.append(time.perf_counter() - t0)
            return out
        finally:
            kc.stop_channels()

    return asyncio.run(go())


def test_a_tunnelled_kernel_answers_without_nagle_delays(tmp_path, kernel):
    sshd = _sshd(tmp_path / "sshd")
    shell = _shell(sshd)
    try:
        tunnels = shell.forward_through("127.0.0.1", sshd.port, [kernel[p] for p in PORTS])
        via = {**kernel, **dict(zip(PORTS, tunnels.ports, strict=True))}
        direct, tunnelled = [], []
        for _ in range(2):  # interleaved: both see the same machine load
            direct += _round_trips(kernel, 10)
            tunnelled += _round_trips(via, 10)
        d, t = statistics.median(direct) * 1000, statistics.median(tunnelled) * 1000
        # with Nagle on sshd's side every round trip paid ~40 ms more than direct
        assert t < d + 20, f"through the tunnels {t:.1f} ms, direct {d:.1f} ms"
        tunnels.close()
    finally:
        shell.close()
        sshd.stop()


def test_a_site_without_ptys_still_forwards_and_says_so(tmp_path, kernel, caplog):
    sshd = _sshd(tmp_path / "sshd", "PermitTTY no")
    shell = _shell(sshd)
    try:
        with caplog.at_level(logging.INFO, logger="jupyter_cloudtik.transport.shell"):
            tunnels = shell.forward_through("127.0.0.1", sshd.port,
                                            [kernel[p] for p in PORTS])
        via = {**kernel, **dict(zip(PORTS, tunnels.ports, strict=True))}
        assert len(_round_trips(via, 2)) == 2
        said = [r.getMessage() for r in caplog.records if "gave no pty" in r.getMessage()]
        assert said and "Nagle" in said[0], caplog.text
        tunnels.close()
    finally:
        shell.close()
        sshd.stop()
