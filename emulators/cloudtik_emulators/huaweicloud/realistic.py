"""Realistic mode: what the emulator does differently when servers are separate hosts.

Opt in with ``Options(realistic=True)`` (``--realistic`` on the command line,
``start_emulator(..., realistic=True)``).  The emulator then

* gives servers addresses of their subnet's CIDR (``Cloud.subnet_ips``) and EIPs from
  198.18.0.0/15 instead of loopback addresses;
* with ``image="bookworm"`` (``--image``), boots each server from a stock Debian root
  (image.py): a copy-on-write overlay of the cached image, chrooted, in its own PID
  namespace, with ``/run`` on a tmpfs;
* boots each server inside its own network namespace (network.py) with
  ``http://169.254.169.254`` as its metadata service (answering for that server only),
  and the API/OBS endpoint at the VPC's "outside" address, which a server reaches only
  through its EIP or its subnet's SNAT rule;
* keeps the routers' egress rules in step with the NAT gateways' SNAT rules;
* removes a server's namespace when it is deleted, and everything at shutdown.

Fast mode (the default) stays as it was: processes on loopback addresses.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from jupyter_cloudtik.core import env as envnames

from .network import METADATA_IP, Network

USER_DATA = "/var/lib/cloud/instance/user-data"  # where cloud-init keeps it on a real image
# PID 1 of the server: runs the user data (cloud-init), then lives as long as the runtime
# it started; a server whose runtime ended, or whose start-up failed, powers off (SHUTOFF),
# as in fast mode (the emulator's model of a node watchdog)
INIT = (f"{USER_DATA} || exit $?; "
        "while kill -0 \"$(cat /opt/cloudtik/runtime.pid 2>/dev/null)\" 2>/dev/null; "
        "do sleep 1; done")


def _mount(args: list[str]) -> None:
    p = subprocess.run(["mount", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {p.stderr.strip()}")

if TYPE_CHECKING:
    from .server import Emulator

log = logging.getLogger("jupyter_cloudtik.emulator")


def public_network() -> ipaddress.IPv4Network:
    """A random /24 of 198.19.0.0/16 for EIPs (uplinks use 198.18.0.0/15 /30s; a clash
    is one in thousands and only costs a failed route)."""
    return ipaddress.ip_network(f"198.19.{secrets.randbelow(254) + 1}.0/24")


class RealisticHosts:
    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.net = Network(emu.id)
        self.listeners: dict[str, tornado.httpserver.HTTPServer] = {}
        self.endpoints: dict[str, int] = {}  # vpc id -> port of the API on its host_ip
        self.roots: dict[str, Path] = {}  # server id -> its root (stock image mode)
        self.image: Path | None = None
        if emu.options.image:
            from .image import ensure_image

            self.image = ensure_image(emu.options.image)
        emu.cloud.subnet_ips = True

    # boot --------------------------------------------------------------------------------
    def prepare(self, srv: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """Make the server's host; returns (command prefix, environment additions)."""
        from .server import MetadataHandler

        cloud = self.emu.cloud
        with cloud.lock:
            sub = dict(cloud.r["subnet"][srv["subnet_id"]])
        dns = sub.get("dns_list")
        if dns is None:
            dns = [sub["primary_dns"]] if sub.get("primary_dns") else []
        host = self.net.add_server(srv["id"], srv["vpc_id"], sub["cidr"], sub["gateway_ip"],
                                   srv["private_ip"], list(dns))
        root = self.make_root(srv, list(dns)) if self.image is not None else None
        v = self.net.vpc(srv["vpc_id"])

        class Own(MetadataHandler):  # this server's metadata only, at the root path
            def get(self, path: str) -> None:  # type: ignore[override]
                super().get(srv["id"], path)

        app = tornado.web.Application([(r"/(.+)", Own, {"emu": self.emu})])
        server = tornado.httpserver.HTTPServer(app)
        sockets = tornado.netutil.bind_sockets(0, v.host_ip)
        server.add_sockets(sockets)
        self.listeners[srv["id"]] = server
        self.net.metadata(srv["id"], sockets[0].getsockname()[1])
        if srv["vpc_id"] not in self.endpoints:
            api = tornado.netutil.bind_sockets(self.emu.port, v.host_ip)
            assert self.emu._server is not None
            self.emu._server.add_sockets(api)
            self.endpoints[srv["vpc_id"]] = api[0].getsockname()[1]
        self.sync()
        env = {envnames.METADATA_URL: f"http://{METADATA_IP}",
               envnames.OBS_PROXY: f"http://{v.host_ip}:{self.endpoints[srv['vpc_id']]}"}
        prefix = ["ip", "netns", "exec", host.ns]
        if root is None:
            return prefix, env, None
        # the stock image: its own root (chroot into the overlay), its own process tree
        # (a PID namespace with its own /proc), its own paths
        env.update({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME": "/root", "TMPDIR": "/tmp", envnames.NODE_DIR: "/opt/cloudtik",
                    envnames.RUNTIME_DIR: "/run/cloudtik"})
        prefix += ["unshare", "--pid", "--fork", f"--mount-proc={root}/proc", "chroot",
                   str(root)]
        return prefix, env, (root / USER_DATA.lstrip("/"), ["/bin/bash", "-c", INIT])

    # the stock image ----------------------------------------------------------------------
    def make_root(self, srv: dict[str, Any], dns: list[str]) -> Path:
        """A copy-on-write view of the image for the server (overlayfs: what it writes
        lands in its ``disk/upper``), with /dev, a tmpfs /run and its own resolv.conf."""
        assert self.image is not None and self.emu.machines is not None
        d = self.emu.machines.server_dir(srv["id"])
        upper, work, root = d / "disk" / "upper", d / "disk" / "work", d / "root"
        for p in (upper, work, root):
            p.mkdir(parents=True, exist_ok=True)
        _mount(["-t", "overlay", "overlay", "-o",
                f"lowerdir={self.image},upperdir={upper},workdir={work}", str(root)])
        self.roots[srv["id"]] = root
        _mount(["--bind", "/dev", str(root / "dev")])
        _mount(["-t", "tmpfs", "-o", "mode=0755,size=64m", "tmpfs", str(root / "run")])
        (root / "etc" / "resolv.conf").write_text("".join(f"nameserver {x}\n" for x in dns))
        (root / "etc" / "hostname").write_text(srv["name"] + "\n")
        (root / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{srv['private_ip']} "
                                            f"{srv['name']}\n")
        (root / USER_DATA.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        return root

    def release_root(self, server_id: str) -> None:
        root = self.roots.pop(server_id, None)
        if root is None:
            return
        for sub in ("run", "dev", ""):
            subprocess.run(["umount", "-l", str(root / sub) if sub else str(root)],
                           capture_output=True)

    def bind_eip(self, srv: dict[str, Any], eip: str, ports: list[int]) -> None:
        self.net.bind_eip(srv["id"], eip, ports)
        self.sync()

    def deleted(self, server_id: str) -> None:
        server = self.listeners.pop(server_id, None)
        if server is not None:
            server.stop()
        self.net.remove_server(server_id)
        self.release_root(server_id)
        self.sync()

    def sync(self) -> None:
        """Egress rules of every VPC router from the cloud's SNAT rules."""
        cloud = self.emu.cloud
        with cloud.lock:
            vpcs = set(cloud.r["vpc"])
            per_vpc: dict[str, list[str]] = {}
            for r in cloud.r["snat"].values():
                nat = cloud.r["nat"].get(r["nat_gateway_id"]) or {}
                vpc = nat.get("router_id")
                sub = cloud.r["subnet"].get(r.get("network_id") or "")
                cidr = sub["cidr"] if sub else r.get("cidr")
                if vpc and cidr:
                    per_vpc.setdefault(vpc, []).append(cidr)
        for vpc_id in vpcs - set(self.net.vpcs):  # a VPC is a router from its creation on
            self.net.vpc(vpc_id)
        for vpc_id in set(self.net.vpcs) - vpcs:
            self.net.remove_vpc(vpc_id)
            self.endpoints.pop(vpc_id, None)
        for vpc_id in list(self.net.vpcs):
            self.net.set_egress(vpc_id, per_vpc.get(vpc_id, []))

    def shutdown(self) -> None:
        for server in self.listeners.values():
            server.stop()
        self.listeners.clear()
        self.net.teardown()
        for sid in list(self.roots):
            self.release_root(sid)
