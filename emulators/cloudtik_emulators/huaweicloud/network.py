"""Realistic mode's network: every emulated server is a separate host in a network namespace.

Layout, per VPC (all names carry the emulator's short id, so emulators of parallel test
runs never share anything):

* a **router** namespace holding the VPC's bridge (``br0``) with each subnet's gateway
  address, and an uplink veth pair to this machine's root namespace with a random /30 from
  198.18.0.0/15 (RFC 2544: never routed on the internet).  The root end (``host_ip``) is
  "outside": the emulator's API/OBS endpoint and each server's metadata listener are bound
  there, and nothing else is reachable (there is no route beyond this machine);
* one namespace per **server**, a veth into the bridge, the private IP the emulator gave
  it in its subnet, a default route via the subnet's gateway, and its own
  ``/etc/resolv.conf`` (``ip netns exec`` bind-mounts ``/etc/netns/NS/resolv.conf``): the
  subnet's DNS servers, or empty for a subnet without any (no name resolution);
* traffic between servers of the VPC is forwarded freely (the workspace's security group
  lets members talk to each other);
* **egress** from a server to outside is forwarded only when its subnet has a SNAT rule of
  the VPC's NAT gateway (masqueraded to the router's uplink address) or the server has an
  EIP (source-NATed to its EIP); anything else is dropped by the router, as a private
  subnet without a NAT gateway is cut off on the real cloud;
* an **EIP** is an address of 198.18.0.0/15 routed from the root namespace to the router,
  which DNATs the ports the server's security groups open to the server only;
* ``169.254.169.254:80`` from a server is DNATed to that server's own metadata listener on
  ``host_ip`` (so a server only ever sees its own metadata, as the real service answers by
  the caller's address).

Everything is made with ``ip`` and ``iptables`` (iproute2, iptables) and removed by
``teardown``: namespaces, veths, routes, ``/etc/netns/NS`` folders.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..netns import random_slash30

METADATA_IP = "169.254.169.254"


class NetworkError(RuntimeError):
    pass


def available() -> str | None:
    """None when realistic mode can run here, else why not."""
    if os.geteuid() != 0:
        return "realistic mode needs root (network namespaces)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"realistic mode needs `{tool}` (scripts/install-system-deps.sh)"
    return None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def _in(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", "netns", "exec", ns, *argv], check=check)


@dataclass
class Vpc:
    vpc_id: str
    router: str
    uplink_host: str   # interface name in the root namespace
    host_ip: str       # root end of the uplink: "outside"
    router_ip: str
    gateways: dict[str, str] = field(default_factory=dict)  # subnet cidr -> gateway ip
    egress: tuple = ()  # applied egress rules (for change detection)


@dataclass
class Host:
    server_id: str
    vpc_id: str
    ns: str
    ip: str
    eip: str | None = None
    eip_ports: tuple[int, ...] = ()
    metadata_port: int | None = None


class Network:
    """The namespaces of one emulator's VPCs and servers."""

    def __init__(self, emulator_id: str) -> None:
        self.tag = emulator_id[:6]
        self.vpcs: dict[str, Vpc] = {}
        self.hosts: dict[str, Host] = {}
        self.lock = threading.RLock()
        self._n = 0

    def _name(self, kind: str) -> str:
        self._n += 1
        return f"ctk{self.tag}{kind}{self._n}"

    # VPCs --------------------------------------------------------------------------------
    def vpc(self, vpc_id: str) -> Vpc:
        with self.lock:
            v = self.vpcs.get(vpc_id)
            if v is not None:
                return v
            router = self._name("r")
            host_if, peer_if = f"ck{secrets.token_hex(5)}", f"ck{secrets.token_hex(5)}"
            host_ip, router_ip = random_slash30()
            _run(["ip", "netns", "add", router])
            v = Vpc(vpc_id, router, host_if, host_ip, router_ip)
            self.vpcs[vpc_id] = v
            _run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if])
            _run(["ip", "link", "set", peer_if, "netns", router])
            _run(["ip", "addr", "add", f"{host_ip}/30", "dev", host_if])
            _run(["ip", "link", "set", host_if, "up"])
            _in(router, "ip", "link", "set", "lo", "up")
            _in(router, "ip", "link", "set", peer_if, "name", "up0")
            _in(router, "ip", "addr", "add", f"{router_ip}/30", "dev", "up0")
            _in(router, "ip", "link", "set", "up0", "up")
            _in(router, "ip", "link", "add", "br0", "type", "bridge")
            _in(router, "ip", "link", "set", "br0", "up")
            _in(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            _in(router, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
            _in(router, "ip", "route", "add", "default", "via", host_ip)
            # inside the VPC: free; to the outside: only what egress rules allow
            _in(router, "iptables", "-P", "FORWARD", "DROP")
            _in(router, "iptables", "-A", "FORWARD", "-i", "br0", "-o", "br0", "-j", "ACCEPT")
            _in(router, "iptables", "-A", "FORWARD", "-m", "conntrack", "--ctstate",
                "ESTABLISHED,RELATED", "-j", "ACCEPT")
            _in(router, "iptables", "-N", "EGRESS")
            _in(router, "iptables", "-A", "FORWARD", "-i", "br0", "-o", "up0", "-j", "EGRESS")
            _in(router, "iptables", "-A", "FORWARD", "-i", "up0", "-o", "br0", "-m",
                "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT")
            _in(router, "iptables", "-t", "nat", "-N", "EGRESS_NAT")
            _in(router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "up0", "-j",
                "EGRESS_NAT")
            return v

    def subnet(self, vpc_id: str, cidr: str, gateway: str) -> None:
        v = self.vpc(vpc_id)
        with self.lock:
            if cidr in v.gateways:
                return
            prefix = ipaddress.ip_network(cidr).prefixlen
            _in(v.router, "ip", "addr", "add", f"{gateway}/{prefix}", "dev", "br0")
            v.gateways[cidr] = gateway

    def set_egress(self, vpc_id: str, snat_cidrs: list[str]) -> None:
        """Which subnets the NAT gateway serves (SNAT rules); servers with an EIP always
        reach out through it.  Rebuilt only when it changed."""
        with self.lock:
            v = self.vpcs.get(vpc_id)
            if v is None:
                return
            eips = sorted((h.ip, h.eip) for h in self.hosts.values()
                          if h.vpc_id == vpc_id and h.eip)
            meta = sorted((h.ip, h.metadata_port) for h in self.hosts.values()
                          if h.vpc_id == vpc_id and h.metadata_port)
            want = (tuple(sorted(snat_cidrs)), tuple(eips), tuple(meta))
            if want == v.egress:
                return
            filt, nat = [], []
            for ip, port in meta:  # the metadata service answers every server
                filt.append(f"-A EGRESS -s {ip} -d {v.host_ip} -p tcp --dport {port} "
                            "-j ACCEPT")
                nat.append(f"-A EGRESS_NAT -s {ip} -d {v.host_ip} -p tcp --dport {port} "
                           "-j MASQUERADE")
            for ip, eip in eips:
                filt.append(f"-A EGRESS -s {ip} -j ACCEPT")
                nat.append(f"-A EGRESS_NAT -s {ip} -j SNAT --to-source {eip}")
            for cidr in want[0]:
                filt.append(f"-A EGRESS -s {cidr} -j ACCEPT")
                nat.append(f"-A EGRESS_NAT -s {cidr} -j MASQUERADE")
            # one atomic replacement of both chains: no moment without the rules
            text = "\n".join(["*filter", ":EGRESS - [0:0]", *filt, "COMMIT", "*nat",
                              ":EGRESS_NAT - [0:0]", *nat, "COMMIT", ""])
            p = subprocess.run(["ip", "netns", "exec", v.router, "iptables-restore",
                                "--noflush"], input=text, capture_output=True, text=True,
                               timeout=30)
            if p.returncode != 0:
                raise NetworkError(f"iptables-restore in {v.router}: {p.stderr.strip()}")
            v.egress = want

    # servers -----------------------------------------------------------------------------
    def add_server(self, server_id: str, vpc_id: str, cidr: str, gateway: str, ip: str,
                   dns: list[str]) -> Host:
        self.subnet(vpc_id, cidr, gateway)
        v = self.vpcs[vpc_id]
        with self.lock:
            if server_id in self.hosts:
                return self.hosts[server_id]
            ns = self._name("s")
            br_if, srv_if = f"ck{secrets.token_hex(5)}", f"ck{secrets.token_hex(5)}"
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text("".join(f"nameserver {d}\n" for d in dns))
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{ip} {server_id}\n")
            _run(["ip", "netns", "add", ns])
            h = Host(server_id, vpc_id, ns, ip)
            self.hosts[server_id] = h
            _run(["ip", "link", "add", br_if, "type", "veth", "peer", "name", srv_if])
            _run(["ip", "link", "set", br_if, "netns", v.router])
            _run(["ip", "link", "set", srv_if, "netns", ns])
            _in(v.router, "ip", "link", "set", br_if, "master", "br0")
            _in(v.router, "ip", "link", "set", br_if, "up")
            prefix = ipaddress.ip_network(cidr).prefixlen
            _in(ns, "ip", "link", "set", "lo", "up")
            _in(ns, "ip", "link", "set", srv_if, "name", "eth0")
            _in(ns, "ip", "addr", "add", f"{ip}/{prefix}", "dev", "eth0")
            _in(ns, "ip", "link", "set", "eth0", "up")
            _in(ns, "ip", "route", "add", "default", "via", gateway)
            return h

    def metadata(self, server_id: str, port: int) -> None:
        """Send the server's 169.254.169.254:80 to its listener at host_ip:port."""
        with self.lock:
            h = self.hosts[server_id]
            v = self.vpcs[h.vpc_id]
            _in(v.router, "iptables", "-t", "nat", "-A", "PREROUTING", "-s", h.ip, "-d",
                METADATA_IP, "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination",
                f"{v.host_ip}:{port}")
            h.metadata_port = port

    def bind_eip(self, server_id: str, eip: str, ports: list[int]) -> None:
        with self.lock:
            h = self.hosts[server_id]
            v = self.vpcs[h.vpc_id]
            _run(["ip", "route", "replace", f"{eip}/32", "via", v.router_ip, "dev",
                  v.uplink_host])
            for p in ports:
                _in(v.router, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "up0", "-d",
                    eip, "-p", "tcp", "--dport", str(p), "-j", "DNAT", "--to-destination",
                    f"{h.ip}:{p}")
            h.eip, h.eip_ports = eip, tuple(ports)

    def remove_server(self, server_id: str) -> None:
        with self.lock:
            h = self.hosts.pop(server_id, None)
            if h is None:
                return
            v = self.vpcs.get(h.vpc_id)
            if h.eip:
                _run(["ip", "route", "del", f"{h.eip}/32"], check=False)
            if v is not None:
                rules = _in(v.router, "iptables", "-t", "nat", "-S", "PREROUTING",
                            check=False).stdout.splitlines()
                for r in rules:
                    if f"-s {h.ip}/32 " in r or (h.eip and f"-d {h.eip}/32 " in r):
                        _in(v.router, "iptables", "-t", "nat",
                            *r.replace("-A", "-D", 1).split(), check=False)
                v.egress = ()  # rebuilt on the next set_egress
            self._delete_ns(h.ns)

    @staticmethod
    def _delete_ns(ns: str) -> None:
        # a veth goes with its namespace; processes left inside would keep it alive
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        _run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    def remove_vpc(self, vpc_id: str) -> None:
        with self.lock:
            for sid in [h.server_id for h in self.hosts.values() if h.vpc_id == vpc_id]:
                self.remove_server(sid)
            v = self.vpcs.pop(vpc_id, None)
            if v is not None:
                _run(["ip", "link", "del", v.uplink_host], check=False)
                self._delete_ns(v.router)

    def exec_prefix(self, server_id: str) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[server_id].ns]

    def host_ip_of(self, vpc_id: str) -> str:
        return self.vpc(vpc_id).host_ip

    def teardown(self) -> None:
        with self.lock:
            for sid in list(self.hosts):
                self.remove_server(sid)
            for v in self.vpcs.values():
                _run(["ip", "link", "del", v.uplink_host], check=False)
                self._delete_ns(v.router)
            self.vpcs.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of this emulator that still exist (after teardown: none)."""
        out = _run(["ip", "netns", "list"], check=False).stdout.split()
        return [n for n in out if n.startswith(f"ctk{self.tag}")]
