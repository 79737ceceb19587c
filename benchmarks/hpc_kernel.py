"""An interactive kernel on a real single-node Slurm, over SSH: ours against one by hand.

Ours: jupyter_client's ``AsyncKernelManager`` with the ``cloudtik-hpc`` provisioner
(hpc/kernels/) on a Slurm backend over SSH (a real OpenSSH sshd on loopback as the login
node, and as the compute node: ``kernel_node_address`` 127.0.0.1).  It submits the kernel
as a batch job through its kept SSH connection, waits for it to run and bind its ports on
the node's loopback, and forwards them through SSH to the node (asyncssh).

Baseline, by hand, as a user does it with OpenSSH: a connection file (ports 0 on
127.0.0.1) and a batch script ``exec python -m ipykernel_launcher -f kernel.json`` already
in place on the system; ``ssh login sbatch``, ``ssh login squeue`` until it runs, ``ssh
login cat kernel.json`` until the kernel wrote its ports, then ``ssh -N -L ...`` to the
node through the login node (``ProxyCommand ssh -W``), all over one ControlMaster
connection kept for the whole run (as a user's ``~/.ssh/config`` would), and a kernel
client on the local ends.

Both poll the queue every ``--poll`` seconds and run the same interpreter (this one, named
by the backend's ``environment.python``: the environment is not built, which is another
benchmark, hpc_env.py).  Measured, interleaved, in one run:

* start: from asking for the kernel to the reply of the first executed cell (median of
  ``--starts``, after one warm-up of each);
* cell latency: the round trip of ``pass`` (execute to reply and idle), median of
  ``--cells`` on one kernel of each.

Target: ours / baseline <= 1.2 for each.

Both really jump (a second SSH connection, to the node, carried by the first).  A
connection that only forwards ports keeps Nagle's algorithm on sshd's side (OpenSSH turns
TCP_NODELAY on only for a session with a pty), which put about 40 ms (Linux's delayed ACK)
on every round trip, OpenSSH's ``ssh -N -L`` and asyncssh alike; ours now opens a pty
session on both connections first (``transport/shell.interactive``), the baseline does
what a user types and still pays it.
benchmarks/hpc_kernel_tunnels.py measures these ways side by side.

    python benchmarks/hpc_kernel.py [--starts 3] [--cells 50] [--poll 0.5]

Needs root, openssh-server and Debian's slurm-wlm + munge (scripts/install-system-deps.sh);
everything runs in a temporary folder and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
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

from jupyter_cloudtik.core import ports

ROOT = Path(__file__).resolve().parents[1]
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def free_port() -> int:
    return ports.free_port()


class ByHand:
    """The user's way: OpenSSH with a ControlMaster, sbatch, squeue, ssh -L."""

    def __init__(self, base: Path, sshd, env: dict[str, str], poll: float) -> None:
        self.base, self.sshd, self.env, self.poll = base, sshd, env, poll
        key = base / "id_ed25519"
        key.write_text(sshd.private_key)
        key.chmod(0o600)
        self.ctl = base / "ctl"
        self.opts = ["-i", str(key), "-o", f"UserKnownHostsFile={sshd.folder}/known_hosts",
                     "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                     "-o", f"ControlPath={self.ctl}", "-p", str(sshd.port),
                     "-q"]  # no "open failed" lines while a client redials a kernel that exited
        self.master = subprocess.Popen(["ssh", *self.opts, "-o", "ControlMaster=yes",
                                        "-o", "ControlPersist=no", "-N", "root@127.0.0.1"])
        deadline = time.monotonic() + 15
        while self.ssh("true").returncode != 0:
            if time.monotonic() > deadline or self.master.poll() is not None:
                raise RuntimeError("the ControlMaster connection did not come up")
            time.sleep(0.1)
        self.tunnel: subprocess.Popen | None = None
        self.job: str | None = None
        slurm = " ".join(f"{k}={v}" for k, v in env.items())
        self.slurm = f"env {slurm} "

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *self.opts, "root@127.0.0.1", command],
                              capture_output=True, text=True, timeout=60)

    def prepare(self, n: int, key: str) -> Path:
        """What is in place before the clock starts: the script and the connection file."""
        folder = self.base / f"k{n}"
        folder.mkdir()
        info = {"transport": "tcp", "ip": "127.0.0.1", "key": key,
                "signature_scheme": "hmac-sha256", **dict.fromkeys(PORTS, 0)}
        (folder / "kernel.json").write_text(json.dumps(info))
        (folder / "kernel.json").chmod(0o600)
        (folder / "kernel.sh").write_text(
            f"#!/bin/bash\n#SBATCH --job-name=by-hand\n#SBATCH --cpus-per-task=1\n"
            f"#SBATCH --time=10\n#SBATCH --output={folder}/slurm.out\n"
            f"exec {sys.executable} -m ipykernel_launcher -f {folder}/kernel.json\n")
        return folder

    def start(self, folder: Path) -> dict:
        r = self.ssh(f"{self.slurm}sbatch --parsable {folder}/kernel.sh")
        if r.returncode != 0:
            raise RuntimeError(f"sbatch: {r.stderr}")
        self.job = r.stdout.strip().split(";")[0]
        while True:
            state = self.ssh(f"{self.slurm}squeue -h -j {self.job} -o %T").stdout.strip()
            if state == "RUNNING":
                info = json.loads(self.ssh(f"cat {folder}/kernel.json").stdout or "{}")
                if all(info.get(p) for p in PORTS):
                    break
            elif state not in ("PENDING", "CONFIGURING"):
                raise RuntimeError(f"job {self.job}: {state or 'gone'}")
            time.sleep(self.poll)
        local = {p: free_port() for p in PORTS}
        forwards = [a for p in PORTS for a in ("-L", f"127.0.0.1:{local[p]}:127.0.0.1:{info[p]}")]
        jump = " ".join(["ssh", *self.opts, "-W", "%h:%p", "root@127.0.0.1"])
        # ControlPath=none before self.opts: ssh keeps the first value of each option, so
        # after them it would be ignored, the forwards would go through the ControlMaster
        # to the login node and the node would never be reached through the jump
        self.tunnel = subprocess.Popen(["ssh", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                                        *self.opts, "-o", f"ProxyCommand={jump}",
                                        "-o", "ExitOnForwardFailure=yes", "-N", *forwards,
                                        "root@127.0.0.1"])
        for p in PORTS:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", local[p]), timeout=0.2).close()
                    break
                except OSError:
                    if self.tunnel.poll() is not None:
                        raise RuntimeError("ssh -L exited") from None
                    time.sleep(0.01)
        return {**info, **local, "ip": "127.0.0.1"}

    def stop(self) -> None:
        if self.tunnel is not None:
            self.tunnel.terminate()
            self.tunnel.wait(10)
            self.tunnel = None
        if self.job:
            self.ssh(f"{self.slurm}scancel {self.job}")
            self.job = None

    def close(self) -> None:
        self.stop()
        self.master.terminate()
        self.master.wait(10)


async def first_cell(kc) -> None:
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    reply = await kc.execute_interactive("pass", timeout=60)
    assert reply["content"]["status"] == "ok", reply


async def latencies(kc, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        reply = await kc.execute_interactive("pass", timeout=60)
        out.append(time.perf_counter() - t0)
        assert reply["content"]["status"] == "ok", reply
    return out


def wait_idle(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                           env={**os.environ, **env})
        if not r.stdout.strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"jobs left in the queue: {r.stdout}")


async def run(args, base: Path, cluster, sshd) -> None:
    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.provisioning import KernelProvisionerFactory
    from traitlets.config import Config

    from jupyter_cloudtik.core.secrets import SecretStore
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.hpc.kernels import HPCKernelSpecManager
    from jupyter_cloudtik.hpc.kernels.provisioner import close_registries

    factory = KernelProvisionerFactory.instance()
    if "cloudtik-hpc" not in factory.provisioners:  # a checkout installed before it existed
        factory.provisioners["cloudtik-hpc"] = md.EntryPoint(
            "cloudtik-hpc", "jupyter_cloudtik.hpc.kernels:HPCKernelProvisioner",
            "jupyter_client.kernel_provisioners")
    state = Path(os.environ["CLOUDTIK_STATE_DIR"])
    SecretStore(Store(state)).put("hpc:site", "ssh_key", sshd.private_key)
    backend = {"type": "slurm", "host": "127.0.0.1", "port": sshd.port, "user": "root",
               "known_hosts": str(sshd.folder / "known_hosts"), "env": cluster.env,
               "workdir": str(base / "ours"), "environment": {"python": sys.executable},
               "kernel_node_address": "127.0.0.1", "kernel_node_port": sshd.port}
    config = Config({"HPC": {"backends": {"site": backend}},
                     "HPCKernels": {"profiles": [{"name": "one", "backend": "site",
                                                  "cores": 1, "time": "10m"}],
                                    "poll_interval": args.poll}})
    ksm = HPCKernelSpecManager(config=config)
    hand = ByHand(base, sshd, cluster.env, args.poll)

    async def ours_start(keep: bool = False):
        km = AsyncKernelManager(kernel_name="cloudtik-hpc-site-one", kernel_spec_manager=ksm,
                                config=config)
        t0 = time.perf_counter()
        await km.start_kernel()
        kc = km.client()
        await first_cell(kc)
        took = time.perf_counter() - t0
        if keep:
            return took, km, kc
        kc.stop_channels()
        await km.shutdown_kernel()
        return took, None, None

    n = 0

    async def hand_start(keep: bool = False):
        nonlocal n
        n += 1
        key = secrets.token_hex(32)
        folder = hand.prepare(n, key)
        t0 = time.perf_counter()
        info = await asyncio.to_thread(hand.start, folder)
        kc = AsyncKernelClient()
        kc.load_connection_info(info)
        await first_cell(kc)
        took = time.perf_counter() - t0
        if keep:
            return took, kc
        await stop_by_hand(kc)
        return took, None

    async def stop_by_hand(kc) -> None:
        kc.shutdown()
        await asyncio.sleep(0.5)
        kc.stop_channels()
        await asyncio.to_thread(hand.stop)

    try:
        await ours_start()  # warm-up: imports, the kept SSH connection, slurmd's first job
        wait_idle(cluster.env)
        await hand_start()
        wait_idle(cluster.env)
        ours, raw = [], []
        for _ in range(args.starts):
            ours.append((await ours_start())[0])
            wait_idle(cluster.env)
            raw.append((await hand_start())[0])
            wait_idle(cluster.env)
        # cell latency: one kernel of each, alive at the same time, interleaved
        _, km, okc = await ours_start(keep=True)
        _, hkc = await hand_start(keep=True)
        await latencies(okc, 5)
        await latencies(hkc, 5)
        ol, hl = [], []
        for _ in range(max(1, args.cells // 10)):
            ol += await latencies(okc, 10)
            hl += await latencies(hkc, 10)
        okc.stop_channels()
        await km.shutdown_kernel()
        await stop_by_hand(hkc)
    finally:
        hand.close()
        close_registries()

    so, sh = statistics.median(ours), statistics.median(raw)
    lo, lh = statistics.median(ol), statistics.median(hl)
    print(f"interactive kernel on Slurm over SSH (one node, sshd on loopback as login and "
          f"compute node; both poll every {args.poll} s)")
    print(f"  start -> first cell, median of {args.starts}: ours {so:.3f} s "
          f"({', '.join(f'{x:.2f}' for x in ours)}), by hand {sh:.3f} s "
          f"({', '.join(f'{x:.2f}' for x in raw)})")
    print(f"  cell round trip, median of {len(ol)}: ours {lo * 1000:.2f} ms, "
          f"by hand {lh * 1000:.2f} ms")
    print(f"hpc kernel start ratio {so / sh:.2f}, cell latency ratio {lo / lh:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    if os.getuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        sys.exit("needs root and openssh-server (scripts/install-system-deps.sh)")

    base = Path(tempfile.mkdtemp(prefix="cloudtik-bench-kernel-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(base / "state")
    (base / "state").mkdir()
    sys.path.insert(0, str(ROOT))
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs
    from tests.hpc.test_hpc_slurm_ssh import Sshd  # the tests' sshd on loopback

    if missing_programs():
        sys.exit(f"Slurm is not installed ({', '.join(missing_programs())}); run "
                 "scripts/install-system-deps.sh")
    (base / "sshd").mkdir()
    sshd = Sshd(base / "sshd").start()
    cluster = SlurmCluster(base / "slurm", cpus=2).start()
    try:
        asyncio.run(run(args, base, cluster, sshd))
    finally:
        cluster.stop()
        sshd.stop()
        subprocess.run(["rm", "-rf", "--", str(base)], check=False)


if __name__ == "__main__":
    main()
