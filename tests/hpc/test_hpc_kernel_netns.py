"""An interactive kernel whose compute node is another machine (issue 33): the node's
slurmd, and so the kernel's job, runs in a network namespace of its own (a veth pair:
the node is 198.18.x.2, this machine 198.18.x.1), with its own loopback and its own
sshd; the login node is an sshd on this machine; the job runs as another Unix account.
The kernel binds the node's loopback, which nothing outside the namespace reaches: the
server gets to it only through SSH to the node, through the login node."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from . import test_hpc_environment as _site
from .test_hpc_kernels import (
    _config,
    _manager,
    _run,
    _state,
    interrupt_and_shut_down,
    provisioner_registered,  # noqa: F401 (autouse fixture)
)
from .test_hpc_slurm_ssh import Sshd

pytestmark = pytest.mark.slow

ACCOUNT = _site.ACCOUNT
job_account, env_sshd = _site.job_account, _site.env_sshd


@pytest.fixture(scope="module")
def node_net():
    from cloudtik_emulators import netns

    why = netns.available() or (None if shutil.which("nsenter") else "needs nsenter")
    if why:
        pytest.skip(why)
    with netns.veth_peer() as peer:
        yield peer


@pytest.fixture(scope="module")
def ns_slurm(node_net):
    """The project's real Slurm with its one node, nid001, in ``node_net``; in a folder
    other accounts can reach (its config and munge socket), as ``site_slurm``."""
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs

    if missing_programs():
        pytest.skip("Slurm is not installed (scripts/install-system-deps.sh)")
    folder = Path(tempfile.mkdtemp(prefix="ct-ns-slurm-", dir="/var/tmp"))
    folder.chmod(0o711)
    cluster = SlurmCluster(folder, cpus=2, memory_mb=2000, max_time_minutes=60,
                           accounting=False, compute=node_net)
    try:
        cluster.start()
        (folder / "munge").chmod(0o711)
        (folder / "slurm.conf").chmod(0o644)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def node_sshd(node_net, env_sshd, tmp_path_factory):
    """The compute node's own sshd, in its namespace on its address; the account's keys
    are its own ~/.ssh (as env_sshd's)."""
    d = Sshd(tmp_path_factory.mktemp("sshd-node"), address=node_net.peer_ip,
             namespace=node_net.namespace)
    d.use_account_keys()
    d.start()
    yield d
    d.stop()


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_a_kernel_on_a_node_in_its_own_network_namespace_is_reached_only_through_ssh(
        ns_slurm, node_net, env_sshd, node_sshd, job_account, make_client, tmp_path):
    workdir = f"{job_account.pw_dir}/kn-{uuid.uuid4().hex[:8]}"
    # one known_hosts for both hops, as a user's ~/.ssh/known_hosts has them
    known = tmp_path / "known_hosts"
    known.write_bytes((env_sshd.folder / "known_hosts").read_bytes() + b"\n"
                      + (node_sshd.folder / "known_hosts").read_bytes())
    backend = {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port, "user": ACCOUNT,
               "known_hosts": str(known), "env": ns_slurm.env, "workdir": workdir,
               "environment": {"packages": ["ipykernel"]},
               # the login node names the node by Slurm's NodeAddr, as many sites do
               "kernel_node_address": "{addr}", "kernel_node_port": node_sshd.port}
    make_client({"site": backend}, {("site", "ssh_key"): env_sshd.private_key})
    config = _config({"site": backend},
                     [{"name": "small", "backend": "site", "cores": 1, "time": "10m"}])

    async def main():
        km = _manager(config, "cloudtik-hpc-site-small")
        await km.start_kernel()
        st = _state(km)
        assert st["state"] == "running" and st["node"] == "nid001", st
        assert km.provisioner.job.address == node_net.peer_ip
        # the kernel's own ports are on the node's loopback: not this machine's, and not
        # open on the node's address either
        kernel_ports = km.provisioner.job.ports()
        for port in kernel_ports.values():
            assert not _reachable(node_net.peer_ip, port), port
        info = km.get_connection_info()
        assert info["ip"] == "127.0.0.1"
        assert {info[p] for p in kernel_ports} & set(kernel_ports.values()) == set()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        reply, out = await _run(kc, "import getpass, os, socket\n"
                                    "print(getpass.getuser(), os.environ['SLURM_JOB_ID'], "
                                    "os.environ['SLURMD_NODENAME'], "
                                    "sorted(a for _, _, _, _, (a, *_) in "
                                    "socket.getaddrinfo(socket.gethostname(), None)))")
        assert reply["status"] == "ok", out
        user, job, node = out.split()[:3]
        assert (user, job, node) == (ACCOUNT, st["job"], "nid001"), out
        # the job sees the node's network: its address and loopback, nothing of ours
        reply, out = await _run(kc, "import subprocess\nprint(subprocess.run(['ip', '-brief',"
                                    " 'addr'], capture_output=True, text=True).stdout)")
        assert node_net.peer_ip in out and node_net.host_ip not in out, out
        await interrupt_and_shut_down(km, kc, ns_slurm.env, job, workdir)

    try:
        asyncio.run(main())
    finally:
        subprocess.run(["rm", "-rf", "--", workdir], check=False)
