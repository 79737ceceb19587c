"""A whole cluster on the emulator in realistic mode: servers are separate hosts.

Head and two workers each in their own network namespace with their subnet's address;
the workers (private subnet) reach the metadata service, OBS and the head only as a real
VPC lets them; the client reaches the head at its EIP over mutual TLS only; after ``down``
no namespace, process or route is left.  Also the search for secrets on the nodes: their
folders, the environment and the command lines of their processes.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import json
import os
import subprocess
import sys

import psutil
import pytest
from hwc_helpers import cluster_config, leftovers, workspace_config

from cloudtik_emulators.huaweicloud import image, network
from cloudtik_emulators.huaweicloud.process import start_emulator

pytestmark = [pytest.mark.realistic, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif((network.available() or image.available()) is not None,
                                 reason=network.available() or image.available() or "")]


def test_the_docs_realistic_command_is_what_this_module_runs():
    """docs/huaweicloud.md's "Realistic mode" command, read by the emulator's own argument
    parser, asks for what the fixture below starts (realistic, image bookworm)."""
    import argparse
    import shlex

    import doc_examples

    from cloudtik_emulators.huaweicloud.cli import add_arguments

    (command,) = doc_examples.code(doc_examples.block("docs/huaweicloud.md",
                                                      "Realistic mode").text)
    words = shlex.split(command)
    assert words[:4] == ["jupyter", "cloudtik", "emulator", "huaweicloud"], words
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(words[4:])
    assert args.realistic and args.image == "bookworm", args


@pytest.fixture(scope="module")
def hwc(tmp_path_factory):
    """This module's own emulator, in realistic mode, servers booting the stock image."""
    import time

    from cloudtik_emulators.huaweicloud.image import ensure_image

    t0 = time.monotonic()
    ensure_image("bookworm")  # cold: debootstrap, ~3 min; cached: at once
    print(f"stock image ready in {time.monotonic() - t0:.1f}s")
    h = start_emulator(tmp_path_factory.mktemp("hwc-realistic"), realistic=True,
                       image="bookworm")
    yield h
    left = h.stop()
    assert not left, f"emulated server processes left behind: {left}"
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True,
                                text=True).stdout.split()
    mine = [n for n in namespaces if n.startswith(f"ctk{h.info['emulator_id'][:6]}")]
    assert not mine, f"namespaces left behind: {mine}"


def _node_processes(emulator_id: str) -> list[psutil.Process]:
    """Every process inside the emulator's namespaces (its servers' processes; their
    environment markers are no use here: Dask's setproctitle overwrites /proc/PID/environ)."""
    out = []
    for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                             text=True).stdout.split():
        if not ns.startswith(f"ctk{emulator_id[:6]}"):
            continue
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split():
            try:
                out.append(psutil.Process(int(pid)))
            except psutil.Error:
                continue
    return out


def _outside(hwc, vpc_id: str) -> str:
    """The address the VPC's servers reach "outside" at (through SNAT or an EIP)."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        net = hwc.ctl.state().get("network") or {}
        if vpc_id in net:
            return net[vpc_id]["outside"]
        time.sleep(0.2)
    raise AssertionError(f"no network for VPC {vpc_id}")


def test_cluster_of_separate_hosts(hwc, core, tmp_path):
    import time

    from jupyter_cloudtik.storage.manager import StorageManager
    from jupyter_cloudtik.storage.servers import start_server

    ws = "real"
    winfo = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    # a storage the nodes reach like the internet: outside the VPC, through the NAT gateway
    (tmp_path / "data" / "in").mkdir(parents=True)
    (tmp_path / "data" / "in" / "hello.txt").write_text("read on a worker")
    dav = start_server("webdav", tmp_path / "data", workdir=tmp_path,
                       host=_outside(hwc, winfo.resources["vpc_id"]))
    storage = StorageManager(settings=core.clusters.settings, store=core.clusters.store,
                             supervise=False)
    storage.add("shared", "webdav", dav.storage_options(), source="in")
    # a package the user asks for (pure Python; not on the stock image): the client's version
    config = {**cluster_config("real1", ws, workers=2), "storage": {"remotes": ["shared"]},
              "runtime": {"pip": ["six"]}}
    t0 = time.monotonic()
    cinfo = core.run(core.clusters.up(config))
    print(f"realistic up (stock image, head + 2 workers): {time.monotonic() - t0:.1f}s")
    assert cinfo.state == "running" and cinfo.running_workers == 2
    state = hwc.ctl.state()
    servers = [s for s in state["servers"] if s["tags"].get("cloudtik-cluster-name") == "real1"]
    vpc = ipaddress.ip_network("192.168.0.0/16")  # the workspace's default vpc_cidr
    for s in servers:  # addresses of the workspace's subnets, not loopback
        assert ipaddress.ip_address(s["private_ip"]) in vpc, s
    for s in servers:  # the figures of the docs: how long each node took to install
        console = (hwc.dir / "servers" / s["id"] / "console.log").read_text()
        print(s["name"], [ln for ln in console.splitlines() if "[cloudtik] runtime" in ln])
    head = next(n for n in cinfo.nodes if n.kind == "head")
    assert not ipaddress.ip_address(head.external_ip).is_loopback

    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    _, connect = core.clusters.connect_info("real1")
    client = HuaweiCloudNodeProvider.make_client(connect, timeout=30)
    try:
        assert client.submit(sum, range(101)).result(timeout=60) == 5050
        futures = client.map(lambda x: x * x, range(20))
        assert sum(client.gather(futures)) == sum(x * x for x in range(20))

        def facts():
            import importlib.metadata
            import importlib.util

            import cloudpickle
            import dask
            import distributed
            import msgpack

            return {"python": "{}.{}".format(*sys.version_info[:2]), "dask": dask.__version__,
                    "executable": sys.executable,
                    "pip": importlib.util.find_spec("pip") is not None,
                    "ensurepip": importlib.util.find_spec("ensurepip") is not None,
                    "distributed": distributed.__version__,
                    "cloudpickle": cloudpickle.__version__,
                    "msgpack": ".".join(map(str, msgpack.version)),
                    "six": importlib.metadata.version("six"),
                    "six_at": importlib.util.find_spec("six").origin,
                    "six_installer": importlib.metadata.distribution("six").read_text(
                        "INSTALLER"),
                    "netns": os.readlink("/proc/self/ns/net")}

        got = client.run(facts)
        assert len(got) == 2
        import cloudpickle
        import dask
        import distributed
        import msgpack

        mine = {"python": "{}.{}".format(*sys.version_info[:2]), "dask": dask.__version__,
                "distributed": distributed.__version__,
                "cloudpickle": cloudpickle.__version__,
                "msgpack": ".".join(map(str, msgpack.version)),
                "six": importlib.metadata.version("six")}
        for where, f in got.items():
            assert {k: f[k] for k in mine} == mine, where
            # the stock image's interpreter, which has neither pip nor ensurepip
            assert f["executable"] == "/usr/bin/python3" and not f["pip"], f
            assert not f["ensurepip"], f
            # six was not on the image: the node unpacked the client's wheel into its folder
            assert f["six_at"].startswith("/opt/cloudtik/python/site-packages/"), f
            assert f["six_installer"] is None, f  # unpacked, not by pip (which writes one)
        # each worker is a host of its own: another network namespace than ours and each other's
        nets = {f["netns"] for f in got.values()}
        assert len(nets) == 2 and os.readlink("/proc/self/ns/net") not in nets
        assert all(a.split("://")[1].split(":")[0] in {s["private_ip"] for s in servers}
                   for a in got)
        # the storage: its config reached the workers over TLS, on a tmpfs, 0600
        def read_storage():
            import stat
            import subprocess as sp

            conf = os.environ["RCLONE_CONFIG"]
            out = sp.run([os.environ["CLOUDTIK_RCLONE"], "cat", "shared:hello.txt"],
                         capture_output=True, text=True, timeout=60)
            return {"text": out.stdout, "err": out.stderr[-500:], "conf": conf,
                    "mode": oct(stat.S_IMODE(os.stat(conf).st_mode))}

        for where, r in client.run(read_storage).items():
            assert r["text"] == "read on a worker", (where, r)
            assert r["conf"].startswith("/run/cloudtik/") and r["mode"] == "0o600", r
    finally:
        client.close()

    from cloudtik_emulators.tlsprobe import attempts
    from jupyter_cloudtik.runtime.tls import make_cluster_tls

    other = make_cluster_tls("real1")
    for name, text in (("ca.pem", connect.credentials["ca"]), ("c.pem", other.client_cert),
                       ("k.pem", other.client_key)):
        (tmp_path / name).write_text(text)
    refused = attempts(f"tls://{head.external_ip}:8786", str(tmp_path / "ca.pem"),
                       str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    assert all(v.startswith("refused") for v in refused.values()), refused

    # --- secrets: none on the nodes (files, environment, command lines) but the node's
    # own TLS key in its 0600 file on /run
    creds = (hwc.dir / "credentials").read_text()
    secrets = {"AK": creds.split("access_key = ")[1].split()[0],
               "SK": creds.split("secret_key = ")[1].split()[0],
               "client TLS key": connect.credentials["key"].splitlines()[1],
               "storage password": dav.password}
    user_data = json.dumps([srv["user_data"] for srv in servers])
    for what, value in secrets.items():
        assert value not in user_data, f"the {what} is in the user data"
    procs = _node_processes(hwc.info["emulator_id"])
    read = 0
    for p in procs:
        try:
            text = json.dumps(p.environ()) + " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue  # a short-lived helper that ended between the listing and the read
        read += 1
        for what, value in secrets.items():
            assert value not in text, f"the {what} is in process {p.pid}'s environment/args"
    assert read >= 3, procs  # scheduler and two workers, read
    for s in servers:
        root = hwc.dir / "servers" / s["id"]
        for dirpath, dirs, files in os.walk(root):
            if dirpath == str(root):  # the image (read only) and the mounted view of it
                dirs[:] = [d for d in dirs if d != "root"]
            for f in files:
                path = os.path.join(dirpath, f)
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                with open(path, "rb") as fh:
                    data = fh.read()
                for what, value in secrets.items():
                    assert value.encode() not in data, f"the {what} is in {path}"
        key = root / "root" / "run" / "cloudtik" / "tls" / "key.pem"  # /run: a tmpfs
        assert (key.stat().st_mode & 0o777) == 0o600
        assert not (root / "disk" / "upper" / "run" / "cloudtik").exists()  # not on disk

    core.run(core.clusters.down("real1"))
    dav.stop()
    assert "servers" not in leftovers(hwc, ws)
    assert _node_processes(hwc.info["emulator_id"]) == []
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}


def test_a_private_subnet_without_snat_fails_up_with_the_boot_log(hwc, core):
    """No SNAT rule for the private subnet: the workers (stock image) cannot reach OBS for
    their runtime's wheels, their start-up script ends, and ``up`` fails in bounded time saying why
    with the server's own console output; ``down`` then removes every host."""
    import time

    from huaweicloudsdknat.v2 import (
        DeleteNatGatewaySnatRuleRequest,
        ListNatGatewaySnatRulesRequest,
    )

    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.core.errors import NodeLaunchError
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    ws = "nosnat"
    info = core.run(core.workspaces.create(ws, workspace_config(hwc)))
    cfg = cfgmod.build_config(cluster_config("cut", ws, workers=1))
    clients = HuaweiCloudNodeProvider(cfg["provider"], "cut", core.clusters.context).clients
    nat = info.resources["nat_id"]
    for r in clients.call("nat", "list_nat_gateway_snat_rules", ListNatGatewaySnatRulesRequest(
            nat_gateway_id=[nat])).snat_rules:
        if r.network_id == info.resources["private_subnet_id"]:
            clients.call("nat", "delete_nat_gateway_snat_rule", DeleteNatGatewaySnatRuleRequest(
                nat_gateway_id=nat, snat_rule_id=r.id))
    started = time.monotonic()
    with pytest.raises(NodeLaunchError) as e:
        core.run(core.clusters.up(cluster_config("cut", ws, workers=1)))
    took = time.monotonic() - started
    message = str(e.value)
    assert "did not answer for cloudtik/clusters/cut/" in message, message
    assert "a private subnet needs a SNAT rule" in message, message
    assert "Traceback" not in message
    assert "console output ends with" in message
    assert took < 90, took
    core.run(core.clusters.down("cut"))
    assert "servers" not in leftovers(hwc, ws)
    assert _node_processes(hwc.info["emulator_id"]) == []
    core.run(core.workspaces.delete(ws))
    assert leftovers(hwc, ws) == {}
    print(f"up failed after {took:.1f}s: {message}")
