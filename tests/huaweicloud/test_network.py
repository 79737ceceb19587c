"""Realistic mode's network (cloudtik_emulators/huaweicloud/network.py) with real namespaces.

A VPC with a public and a private subnet, a head with an EIP, a worker without: the VPC is
one network, the EIP reaches the head's opened ports only, the private subnet reaches the
outside only once it has a SNAT rule, a subnet without DNS servers resolves nothing, and
teardown leaves no namespace.  "Outside" is the VPC uplink's address on this machine:
no probe here ever targets an address that is not on this machine.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cloudtik_emulators.huaweicloud import network

pytestmark = [pytest.mark.realistic,
              pytest.mark.skipif(network.available() is not None,
                                 reason=network.available() or "")]

PROBE = textwrap.dedent("""
    import socket, sys
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)
        print(s.recv(100).decode() or "connected")
    except OSError as e:
        print("unreachable", type(e).__name__)
""")
LISTEN = textwrap.dedent("""
    import socket, sys, threading
    def serve(port):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen()
        while True:
            c, a = s.accept(); c.sendall(f"{sys.argv[1]}:{port} from {a[0]}".encode()); c.close()
    for p in (8786, 9000):
        threading.Thread(target=serve, args=(p,)).start()
""")


def _in(ns: str, code: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _here(addr: str, port: int) -> str:
    try:
        with socket.create_connection((addr, port), 2) as s:
            return s.recv(100).decode()
    except OSError as e:
        return f"unreachable {type(e).__name__}"


def test_vpc_subnets_eip_snat_and_dns():
    net = network.Network("t" + str(time.time_ns())[-9:])
    procs = []
    try:
        net.subnet("vpc", "192.168.0.0/24", "192.168.0.1")
        head = net.add_server("head", "vpc", "192.168.0.0/24", "192.168.0.1", "192.168.0.11",
                              ["100.125.1.250"])
        worker = net.add_server("w1", "vpc", "192.168.1.0/24", "192.168.1.1", "192.168.1.11",
                                [])
        eip = f"198.19.{int(time.time()) % 250 + 1}.9"
        net.bind_eip("head", eip, [8786])
        net.set_egress("vpc", [])
        outside = net.host_ip_of("vpc")
        srv = socket.socket()
        srv.bind((outside, 0))
        srv.listen()
        port = srv.getsockname()[1]

        def accept():
            while True:
                try:
                    c, a = srv.accept()
                except OSError:
                    return
                c.sendall(f"outside from {a[0]}".encode())
                c.close()
        threading.Thread(target=accept, daemon=True).start()
        for h in (head, worker):
            procs.append(subprocess.Popen(["ip", "netns", "exec", h.ns, sys.executable, "-c",
                                           LISTEN, h.server_id]))
        time.sleep(0.6)

        # one VPC: the worker (private subnet) reaches the head (public subnet), any port
        assert _in(worker.ns, PROBE, "192.168.0.11", "9000") == "head:9000 from 192.168.1.11"
        # the EIP reaches the head, and only the ports opened for it
        assert _here(eip, 8786).startswith("head:8786 from ")
        assert _here(eip, 9000).startswith("unreachable")
        # egress: the head through its EIP; the private subnet not without a SNAT rule
        assert _in(head.ns, PROBE, outside, str(port)) == f"outside from {eip}"
        assert _in(worker.ns, PROBE, outside, str(port)).startswith("unreachable")
        net.set_egress("vpc", ["192.168.1.0/24"])
        assert _in(worker.ns, PROBE, outside, str(port)) == \
            f"outside from {net.vpcs['vpc'].router_ip}"
        # DNS: what the subnet says; none at all gives no name resolution
        resolv = subprocess.run(["ip", "netns", "exec", worker.ns, "cat", "/etc/resolv.conf"],
                                capture_output=True, text=True).stdout
        assert resolv == ""
        got = _in(worker.ns, "import socket\ntry: socket.getaddrinfo('example.com', 80)\n"
                  "except OSError as e: print('no resolution', e)")
        assert got.startswith("no resolution")
        assert "nameserver 100.125.1.250" in subprocess.run(
            ["ip", "netns", "exec", head.ns, "cat", "/etc/resolv.conf"],
            capture_output=True, text=True).stdout
        srv.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        net.teardown()
    assert net.leftovers() == []
    assert "ctk" + net.tag not in subprocess.run(["ip", "link"], capture_output=True,
                                                 text=True).stdout
