"""Where an HPC kernel's cell latency goes: one ipykernel, reached four ways, no Slurm.

Issue 33 measured our kernel's round trip at 2-3x the by-hand one and suspected the
asyncssh port forwards (Python copies every ZMQ message).  It was sshd's Nagle on
connections without a pty session (see ``transport/shell.interactive``): ours now opens
one on both connections and matches a direct connection.  This reaches one local kernel

* directly (its own ports),
* ``openssh-jump``: ``ssh -N -L`` to the "node" through the "login node"
  (``ProxyCommand ssh -W``), as a user does it and as our tunnel is shaped,
* ``openssh-master``: ``ssh -N -L`` as a ControlMaster to the login node itself, no jump,
* ``openssh-mux``: ``ssh -N -L`` as the mux client of a ControlMaster that already ran
  commands, no jump (what benchmarks/hpc_kernel.py's baseline did by mistake before),
* ``asyncssh-jump``: ``SSHShell.forward_through`` in this process (ours),

through a real OpenSSH sshd on loopback (login node and node alike), one client at a time,
and prints the median round trip of ``pass`` for each.

    python benchmarks/hpc_kernel_tunnels.py [--rounds 6]

Needs root and openssh-server (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hpc_kernel import PORTS, ROOT, free_port


def wait_ports(ports, proc: subprocess.Popen) -> None:
    for p in ports:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", p), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("ssh -L did not come up") from None
                time.sleep(0.02)


async def round_trips(kc, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        reply = await kc.execute_interactive("pass", timeout=60)
        out.append(time.perf_counter() - t0)
        assert reply["content"]["status"] == "ok", reply
    return out


async def run(args, base: Path, sshd) -> None:
    from jupyter_client.asynchronous import AsyncKernelClient

    from jupyter_cloudtik.transport.shell import SSHShell

    info = {"transport": "tcp", "ip": "127.0.0.1", "key": secrets.token_hex(16),
            "signature_scheme": "hmac-sha256", **{p: free_port() for p in PORTS}}
    (base / "kernel.json").write_text(json.dumps(info))
    procs = [subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f",
                               str(base / "kernel.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    key = base / "id"  # OpenSSH reads its key from a file; this is a throwaway one
    key.write_text(sshd.private_key)
    key.chmod(0o600)
    opts = ["-i", str(key), "-o", f"UserKnownHostsFile={sshd.folder}/known_hosts",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(sshd.port),
            "-q"]
    shell = None
    try:
        ways = {"direct": dict(info)}

        def ssh_l(name: str, extra: list[str]) -> None:
            local = {p: free_port() for p in PORTS}
            fwd = [a for p in PORTS for a in ("-L", f"127.0.0.1:{local[p]}:127.0.0.1:{info[p]}")]
            proc = subprocess.Popen(["ssh", *extra, *opts, "-N", "-o", "ExitOnForwardFailure=yes",
                                     *fwd, "root@127.0.0.1"], stdin=subprocess.DEVNULL)
            procs.append(proc)
            wait_ports(local.values(), proc)
            ways[name] = {**info, **local}

        jump = " ".join(["ssh", *opts, "-W", "%h:%p", "root@127.0.0.1"])
        ssh_l("openssh-jump", ["-o", f"ProxyCommand={jump}"])
        ssh_l("openssh-master", ["-o", "ControlMaster=yes", "-o", f"ControlPath={base}/ctl"])
        # the old baseline: a master (-N), commands over it, then -L as its mux client
        ctl = ["-o", f"ControlPath={base}/mux"]
        procs.append(subprocess.Popen(["ssh", *ctl, *opts, "-o", "ControlMaster=yes", "-N",
                                       "root@127.0.0.1"], stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 15
        while subprocess.run(["ssh", *ctl, *opts, "root@127.0.0.1", "true"],
                             stdin=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the ControlMaster did not come up")
            time.sleep(0.1)
        ssh_l("openssh-mux", ctl)
        shell = SSHShell("127.0.0.1", user="root", port=sshd.port,
                         private_key=sshd.private_key,
                         known_hosts=str(sshd.folder / "known_hosts"))
        tunnels = shell.forward_through("127.0.0.1", sshd.port, [info[p] for p in PORTS])
        ways["asyncssh-jump"] = {**info, **dict(zip(PORTS, tunnels.ports, strict=True))}

        res: dict[str, list[float]] = {n: [] for n in ways}
        for _ in range(args.rounds):
            for name, ci in ways.items():
                kc = AsyncKernelClient()
                kc.load_connection_info(ci)
                kc.start_channels()
                await kc.wait_for_ready(timeout=60)
                await round_trips(kc, 3)
                res[name] += await round_trips(kc, 10)
                kc.stop_channels()
        print(f"round trip of `pass`, median of {10 * args.rounds} (p10, p90):")
        for name, v in res.items():
            v.sort()
            print(f"  {name:15s} {statistics.median(v) * 1000:7.2f} ms "
                  f"({v[len(v) // 10] * 1000:.2f}, {v[9 * len(v) // 10] * 1000:.2f})")
        tunnels.close()
    finally:
        if shell is not None:
            shell.close()
        for p in procs:
            p.kill()
            p.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if os.getuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        sys.exit("needs root and openssh-server (scripts/install-system-deps.sh)")
    sys.path.insert(0, str(ROOT))
    from tests.hpc.test_hpc_slurm_ssh import Sshd  # the tests' sshd on loopback

    base = Path(tempfile.mkdtemp(prefix="cloudtik-bench-tunnels-"))
    (base / "sshd").mkdir()
    sshd = Sshd(base / "sshd").start()
    try:
        asyncio.run(run(args, base, sshd))
    finally:
        sshd.stop()
        subprocess.run(["rm", "-rf", "--", str(base)], check=False)


if __name__ == "__main__":
    main()
