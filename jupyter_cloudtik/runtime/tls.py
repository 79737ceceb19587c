"""Per-cluster TLS for Dask: a CA made for one cluster, a node certificate, a client one.

Why: a Dask scheduler runs whatever a connected client sends it.  Off loopback (a cloud
head behind an EIP, a local cluster bound to a LAN address) nothing may answer without
authentication, so scheduler, workers and client speak mutual TLS (distributed's
``Security``): each side presents a certificate signed by the cluster's CA and refuses a
peer that does not.  A plain ``tcp://`` client, or a TLS client without the cluster's
client certificate, is refused during the handshake.

What is kept, and where:

* ``<state_dir>/tls/<cluster>/`` (0700) holds ``ca.pem`` (public), ``node.pem`` +
  ``node-key.pem`` (what scheduler and workers present) and ``client.pem`` +
  ``client-key.pem`` (what our client presents), keys 0600.
* The CA's private key is thrown away as soon as both certificates are signed: nothing can
  sign another certificate for this cluster afterwards, so a stolen state folder cannot
  mint new identities, and there is one key less to protect.
* Keys never go into the store's JSON (status views, logs): a ``ConnectInfo`` carries them
  in memory only (``ConnectInfo.credentials``) and only the authenticated ``connect``
  answer sends them to the caller.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed.security import Security

    from ..core.models import ConnectInfo

VALID_DAYS = 365
FILES = ("ca.pem", "node.pem", "node-key.pem", "client.pem", "client-key.pem")


@dataclass(frozen=True)
class ClusterTLS:
    """The PEM texts of one cluster's TLS material (the CA key is not among them)."""

    ca: str
    node_cert: str
    node_key: str
    client_cert: str
    client_key: str

    def client_credentials(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.client_cert, "key": self.client_key}

    def node_credentials(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.node_cert, "key": self.node_key}


def is_loopback(host: str | None) -> bool:
    """Is ``host`` reachable from this machine only (127.0.0.0/8, ::1, localhost)?

    ``0.0.0.0`` / ``""`` (every interface) is not loopback.
    """
    if host in (None, "", "0.0.0.0", "::"):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "jupyter_cloudtik"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def _pem_key(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def make_cluster_tls(cluster: str) -> ClusterTLS:
    """A new CA for ``cluster`` and two certificates it signs; the CA key is discarded."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"cloudtik cluster CA {cluster}")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=False, content_commitment=False, key_encipherment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=True,
              crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usages: list) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                               critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return _pem_cert(cert), _pem_key(key)

    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    node_cert, node_key = leaf(f"cloudtik node {cluster}", both)
    client_cert, client_key = leaf(f"cloudtik client {cluster}", both)
    return ClusterTLS(_pem_cert(ca), node_cert, node_key, client_cert, client_key)


def tls_dir(state_dir: str | os.PathLike[str], cluster: str) -> Path:
    return Path(state_dir) / "tls" / cluster


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def load_cluster_tls(state_dir: str | os.PathLike[str], cluster: str) -> ClusterTLS | None:
    d = tls_dir(state_dir, cluster)
    try:
        texts = [(d / f).read_text() for f in FILES]
    except OSError:
        return None
    return ClusterTLS(*texts)


def ensure_cluster_tls(state_dir: str | os.PathLike[str], cluster: str) -> ClusterTLS:
    """The cluster's TLS material, made (once) if it does not exist yet."""
    have = load_cluster_tls(state_dir, cluster)
    if have is not None:
        return have
    d = tls_dir(state_dir, cluster)
    d.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.mkdir(exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    tls = make_cluster_tls(cluster)
    for name, text in zip(FILES, (tls.ca, tls.node_cert, tls.node_key, tls.client_cert,
                                  tls.client_key), strict=True):
        _write_private(d / name, text, 0o644 if name == "ca.pem" else 0o600)
    return tls


def remove_cluster_tls(state_dir: str | os.PathLike[str], cluster: str) -> None:
    shutil.rmtree(tls_dir(state_dir, cluster), ignore_errors=True)


def node_files(state_dir: str | os.PathLike[str], cluster: str) -> dict[str, str]:
    """Paths of the CA and the node certificate and key (for processes on this machine)."""
    d = tls_dir(state_dir, cluster)
    return {"ca": str(d / "ca.pem"), "cert": str(d / "node.pem"), "key": str(d / "node-key.pem")}


def security(credentials: dict[str, str] | None) -> Security | None:
    """A ``distributed.Security`` from PEM texts (``ca``, ``cert``, ``key``), or None.

    distributed accepts certificate and key contents in place of file names, so the
    client's key never has to touch the disk of the machine the client runs on.
    """
    if not credentials:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=credentials["ca"], tls_client_cert=credentials["cert"],
                    tls_client_key=credentials["key"], require_encryption=True)


#: the ALPN protocol a client of a head's mutual-TLS web UI relay (Huawei Cloud:
#: ``cloudtik_node.py dashboard-relay``, port 8788) offers to be passed to the Spark
#: master's UI; one offering none is passed to the Dask dashboard (the relay's first)
SPARK_UI_ALPN = "cloudtik-spark"


def client_ssl_context(credentials: dict[str, str],
                       alpn: str | None = None) -> ssl.SSLContext:
    """A client ``SSLContext`` that trusts only the cluster's CA and presents its client
    certificate (for the scheduler's TLS port and the head's web UI relay).  ``alpn``
    names the UI the relay should pass the connection to (``cloudtik-spark`` for the
    Spark master's; none: the relay's first, Dask's dashboard).

    The cluster's certificates name no host (the CA is the cluster's own and signs nothing
    else), so the host name is not checked; ``ssl`` loads a key only from a file, which
    lives for the call in a private temporary folder."""
    import tempfile

    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=credentials["ca"])
    ctx.check_hostname = False
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "client.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(credentials["key"] + credentials["cert"])
        ctx.load_cert_chain(path)
    if alpn:
        ctx.set_alpn_protocols([alpn])
    return ctx


def client_security(info: ConnectInfo) -> Security | None:
    """The ``Security`` a client of this cluster needs; None for a plain-TCP cluster.

    Raises ``PermissionError`` for a TLS cluster whose connect info came without its
    client certificate (it would be refused anyway; this says why).
    """
    if not (info.extra or {}).get("tls"):
        return None
    if not info.credentials:
        raise PermissionError(
            "this cluster accepts TLS clients with its own certificate only, and the "
            "connect information came without it; get it from `Cluster(name).client()` "
            "or the server's /clusters/NAME/connect answer")
    return security(info.credentials)


def attach(info: ConnectInfo, state_dir: str | os.PathLike[str], cluster: str) -> ConnectInfo:
    """``info`` with the cluster's client credentials attached (in memory) if it uses TLS."""
    if (info.extra or {}).get("tls") and not info.credentials:
        tls = load_cluster_tls(state_dir, cluster)
        if tls is not None:
            info.credentials = tls.client_credentials()
    return info


def as_client_dict(info: ConnectInfo) -> dict[str, Any]:
    """The connect answer for an authenticated caller: credentials included."""
    out = info.to_dict()
    if info.credentials:
        out["tls_credentials"] = dict(info.credentials)
    return out
