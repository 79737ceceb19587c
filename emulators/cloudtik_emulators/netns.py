"""Network namespaces and veth pairs for tests that need a real non-loopback address.

A veth pair joins this machine (the root namespace, one end with ``host_ip``) to a new
network namespace (the other end with ``peer_ip``): the host end is a real interface
address that is not loopback, and the namespace is "another machine on the LAN" whose
connections arrive from ``peer_ip``.  Addresses come from 198.18.0.0/15 (RFC 2544,
benchmarking, never routed on the internet) and both ends live on this machine, so no
packet leaves it.  Names and addresses are random, so tests of several helpers or runs
can hold pairs at the same time.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

BENCH_NET = ipaddress.ip_network("198.18.0.0/15")


def available() -> str | None:
    """None if namespaces can be made here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    return None


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


@dataclass
class VethPeer:
    namespace: str
    host_if: str
    host_ip: str
    peer_ip: str

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace ("on the other machine")."""
        return subprocess.run(["ip", "netns", "exec", self.namespace, *argv], **kw)


def random_slash30() -> tuple[str, str]:
    n = secrets.randbelow(BENCH_NET.num_addresses // 4 - 2) + 1
    base = int(BENCH_NET.network_address) + 4 * n
    return str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))


@contextlib.contextmanager
def veth_peer() -> Iterator[VethPeer]:
    """A namespace joined to this machine by a veth pair; removed on exit."""
    tag = secrets.token_hex(3)
    ns, host_if, peer_if = f"ctk-{tag}", f"ctkh{tag}", f"ctkp{tag}"
    host_ip, peer_ip = random_slash30()
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        ip("link", "set", peer_if, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{peer_ip}/30", "dev", peer_if, ns=ns)
        ip("link", "set", peer_if, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
        yield VethPeer(ns, host_if, host_ip, peer_ip)
    finally:
        ip("link", "del", host_if, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
