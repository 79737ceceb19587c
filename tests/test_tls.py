"""Mutual TLS with per-cluster certificates (runtime/tls.py) on a real non-loopback address.

The local provider bound to an address that is not loopback is reachable from other
machines, so its scheduler and workers must refuse anyone without the cluster's client
certificate.  The address is the host end of a veth pair into a network namespace that
stands for "another machine on the LAN" (cloudtik_emulators/netns.py); nothing leaves this machine.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from cloudtik_emulators import netns
from jupyter_cloudtik import Cluster
from jupyter_cloudtik.runtime import tls

pytestmark = pytest.mark.skipif(netns.available() is not None,
                                reason=netns.available() or "")

def _probe(argv_prefix: list[str], address: str, ca: str, cert: str = "",
           key: str = "") -> dict[str, str]:
    out = subprocess.run([*argv_prefix, sys.executable, "-m",
                          "cloudtik_emulators.tlsprobe", address, ca,
                          *([cert, key] if cert else [])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_certificates_are_per_cluster_and_the_ca_key_is_not_kept(tmp_path):
    from cryptography import x509

    a = tls.ensure_cluster_tls(tmp_path, "a")
    b = tls.ensure_cluster_tls(tmp_path, "b")
    assert a.ca != b.ca
    assert tls.ensure_cluster_tls(tmp_path, "a") == a  # made once
    d = tls.tls_dir(tmp_path, "a")
    assert sorted(p.name for p in d.iterdir()) == sorted(tls.FILES)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for name in ("node-key.pem", "client-key.pem"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(a.ca.encode())
    for pem in (a.node_cert, a.client_cert):
        x509.load_pem_x509_certificate(pem.encode()).verify_directly_issued_by(ca)
    with pytest.raises(ValueError):
        x509.load_pem_x509_certificate(a.node_cert.encode()).verify_directly_issued_by(
            x509.load_pem_x509_certificate(b.ca.encode()))
    assert tls.is_loopback("127.0.0.1") and tls.is_loopback("localhost")
    assert tls.is_loopback("127.0.0.2") and tls.is_loopback("::1")
    assert not tls.is_loopback("0.0.0.0") and not tls.is_loopback("198.18.0.1")
    tls.remove_cluster_tls(tmp_path, "a")
    assert not d.exists()


@pytest.mark.slow
def test_local_cluster_off_loopback_speaks_tls_only(backend, state_dir, tmp_path):
    with netns.veth_peer() as lan:
        c = Cluster.up(workers=1, name="lan", progress=False, backend=backend,
                       config={"provider": {"type": "local", "host": lan.host_ip}})
        info = c.refresh()
        assert info.scheduler_address.startswith(f"tls://{lan.host_ip}:")
        # our client gets the certificate through the connect info and works
        with c.client() as client:
            assert client.submit(lambda x: x + 1, 41).result(timeout=30) == 42
            assert all(a.startswith(f"tls://{lan.host_ip}:")
                       for a in client.scheduler_info()["workers"])
        # the dashboard (no authentication of its own) is on loopback only
        assert info.dashboard_link.startswith("http://127.0.0.1:")
        dash_port = int(info.dashboard_link.split(":")[2].split("/")[0])
        import socket

        with pytest.raises(OSError), socket.create_connection((lan.host_ip, dash_port), 2):
            pass

        ca = str(tls.tls_dir(state_dir, "lan") / "ca.pem")
        other = tls.ensure_cluster_tls(tmp_path / "other", "lan")  # same name, another CA
        for f, text in (("c.pem", other.client_cert), ("k.pem", other.client_key)):
            (tmp_path / f).write_text(text)
        # from this machine and from another machine on the LAN: refused without the cert
        here = _probe([], info.scheduler_address, ca, str(tmp_path / "c.pem"),
                      str(tmp_path / "k.pem"))
        there = _probe(["ip", "netns", "exec", lan.namespace], info.scheduler_address, ca)
        for got in (here, there):
            assert got["plain"].startswith("refused"), got
            assert got["tls-no-cert"].startswith("refused"), got
        assert here["tls-other-ca"].startswith("refused"), here

        # the client's key is nowhere but its 0600 file: not in the store, logs or ps
        key = tls.load_cluster_tls(state_dir, "lan").client_key
        body = key.splitlines()[1]
        for root, _dirs, files in os.walk(state_dir):
            for f in files:
                path = os.path.join(root, f)
                if f == "client-key.pem" or not os.path.isfile(path) or os.path.islink(path):
                    continue
                with open(path, "rb") as fh:
                    assert body.encode() not in fh.read(), path
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert body not in ps
        assert body not in json.dumps(c.refresh().connect_info or {})

        c.down(progress=False)
        assert not tls.tls_dir(state_dir, "lan").exists()
