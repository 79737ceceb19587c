"""The slurm backend over SSH: a real OpenSSH sshd on loopback in front of the real Slurm,
with the private key in the secret store (never in a file the backend writes)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.errors import ProviderError
from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import wait_for

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    return ports.free_port()


class Sshd:
    def __init__(self, folder, address: str = "127.0.0.1", namespace: str | None = None
                 ) -> None:
        """An sshd on ``address``; with ``namespace``, inside that network namespace
        (another machine: a compute node reached at its own address)."""
        import asyncssh

        self.folder = folder
        self.address, self.namespace = address, namespace
        self.port = _free_port()
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "host_key").write_bytes(host_key.export_private_key())
        (folder / "host_key").chmod(0o600)
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "authorized_keys").write_bytes(
            self.client_key.export_public_key())
        (folder / "known_hosts").write_bytes(
            f"[{address}]:{self.port} ".encode() + host_key.export_public_key())
        (folder / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress {address}
HostKey {folder}/host_key
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
""")
        self.proc = None

    def use_account_keys(self) -> None:
        """Also read each account's own ~/.ssh/authorized_keys, as a site's sshd does."""
        conf = self.folder / "sshd_config"
        conf.write_text(conf.read_text().replace(
            "AuthorizedKeysFile ", "AuthorizedKeysFile .ssh/authorized_keys "))

    @property
    def private_key(self) -> str:
        return self.client_key.export_private_key().decode()

    def start(self) -> Sshd:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        inside = (["nsenter", f"--net=/var/run/netns/{self.namespace}"] if self.namespace
                  else [])
        self.proc = subprocess.Popen([*inside, SSHD, "-D", "-e", "-f",
                                      str(self.folder / "sshd_config")],
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(self.folder / "sshd.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.folder / "sshd.log").read_text()) from None
                time.sleep(0.05)
        raise RuntimeError("sshd did not listen")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not os.path.exists(SSHD) or os.getuid() != 0:
        pytest.skip("needs openssh-server and root (scripts/install-system-deps.sh)")
    d = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield d
    d.stop()


@pytest.fixture
def ssh_backend(sshd, slurm, tmp_path):
    if shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed")
    return {"type": "slurm", "host": "127.0.0.1", "port": sshd.port, "user": "root",
            "known_hosts": str(sshd.folder / "known_hosts"), "env": slurm.env,
            "workdir": str(tmp_path / "remote-jobs"),
            # root on this very machine: it can run the session's interpreter (a real
            # site's account cannot; test_hpc_environment.py builds the session's there)
            "environment": {"python": sys.executable}}


def test_slurm_over_ssh_runs_and_fetches(make_client, ssh_backend, sshd, notebooks, tmp_path):
    client = make_client({"remote": ssh_backend}, {("remote", "ssh_key"): sshd.private_key})
    backend = client.manager.backend("remote")
    assert not backend.shares_local_filesystem  # inputs go over SFTP
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 9},
                                    inputs=[str(notebooks["data"])], time="5m"), "remote")
    assert info.inputs[0]["mode"] == "upload"
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", (info.reason, client.logs(info.id).text[-1500:])
    assert "result 54" in client.logs(info.id).text
    got = {p.name: p for p in client.fetch(info.id, tmp_path / "got")}
    assert got["result.txt"].read_text() == "54"
    # the key lives only in the secret store: nothing under the state or job folders has it
    needle = sshd.private_key.splitlines()[1]
    for folder in (tmp_path,):
        for p in folder.rglob("*"):
            if p.is_file() and p.stat().st_size < 1_000_000:
                assert needle not in p.read_text(errors="ignore"), p


def test_ssh_login_problems_are_clear(make_client, ssh_backend, sshd, notebooks):
    import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    client = make_client({"remote": ssh_backend}, {("remote", "ssh_key"): other})
    with pytest.raises(ProviderError, match="refused the SSH login"):
        client.submit(build_spec(str(notebooks["param"])), "remote")
    unknown = dict(ssh_backend, known_hosts=str(sshd.folder / "authorized_keys"))
    client2 = make_client({"remote2": unknown}, {("remote2", "ssh_key"): sshd.private_key})
    with pytest.raises(ProviderError, match=r"host key of .* is not known"):
        client2.submit(build_spec(str(notebooks["param"])), "remote2")
    assert client.list() == []


def test_login_node_down_then_back(make_client, ssh_backend, sshd, notebooks):
    client = make_client({"remote": ssh_backend}, {("remote", "ssh_key"): sshd.private_key})
    info = client.submit(build_spec(str(notebooks["ticks"]), parameters={"n": 12,
                                                                        "delay": 0.5}), "remote")
    wait_for(lambda: client.get(info.id).state == "running", 60, what="running")
    sshd.stop()
    # the kept connection still works after sshd stops listening; drop it like a network
    # failure would, so the next poll must reconnect
    client.manager.backend("remote").shell._drop()
    try:
        j = wait_for(lambda: (j := client.get(info.id)).state == "unknown" and j, 30,
                     what="unknown")
        assert "cannot connect" in j.reason
    finally:
        sshd.start()
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
