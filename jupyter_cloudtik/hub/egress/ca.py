"""The deployment CA: the one certificate sessions trust so the egress proxy may read (and add
credentials to) HTTPS requests for hosts that have a rule.

The CA key stays on disk in the sidekick's state folder (mode 0600): whoever holds it can
impersonate any host to the sessions, so it never leaves that folder.  Leaf certificates are
short-lived, made on demand and kept in memory only.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import ipaddress
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DeploymentCA"]

CA_VALIDITY = _dt.timedelta(days=3650)
LEAF_VALIDITY = _dt.timedelta(days=2)
# clocks of sessions may lag a little behind ours
BACKDATE = _dt.timedelta(hours=1)
# a cached leaf is replaced well before it expires, so no connection sees an expired one
LEAF_RENEW_BEFORE = _dt.timedelta(hours=6)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write through a temporary file and rename, so a reader never sees half a key."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DeploymentCA:
    """A CA key and self-signed certificate, plus an in-memory LRU of leaf TLS contexts."""

    KEY_NAME = "egress-ca.key"
    CERT_NAME = "egress-ca.pem"

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey,
                 cert: x509.Certificate, *, cache_size: int = 256) -> None:
        self.directory = Path(directory)
        self._key = key
        self.cert = cert
        self.cache_size = cache_size
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._cache: OrderedDict[str, tuple[_dt.datetime, ssl.SSLContext]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DeploymentCA({str(self.cert_path)!r})"

    @property
    def cert_path(self) -> Path:
        """The PEM certificate sessions add to their trust store."""
        return self.directory / self.CERT_NAME

    @property
    def key_path(self) -> Path:
        return self.directory / self.KEY_NAME

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def load_or_create(cls, directory: Path) -> DeploymentCA:
        """Reuse the CA of ``directory`` if there is one, so sessions keep trusting it across
        restarts; create it otherwise.  A file lock makes the supervisor and the proxy agree
        on a single CA even when both start at once."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_path = directory / cls.KEY_NAME
        cert_path = directory / cls.CERT_NAME
        with open(directory / ".egress-ca.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if key_path.exists() and cert_path.exists():
                    st = key_path.stat()
                    if st.st_uid != os.geteuid():
                        raise ValueError(f"{key_path}: the egress CA key belongs to uid "
                                         f"{st.st_uid}, not to this process (uid "
                                         f"{os.geteuid()}); allowed: owned by the proxy's "
                                         "user, mode 0600")
                    if st.st_mode & 0o077:
                        os.chmod(key_path, 0o600)  # readable by the proxy's user only
                    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
                    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
                    if not isinstance(key, ec.EllipticCurvePrivateKey):
                        raise ValueError(f"{key_path}: the egress CA key must be an EC key")
                    return cls(directory, key, cert)
                key = ec.generate_private_key(ec.SECP256R1())
                cert = cls._self_signed(key)
                _write_private(key_path, key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption()), 0o600)
                _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
                return cls(directory, key, cert)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _self_signed(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "jupyter_cloudtik"),
            x509.NameAttribute(NameOID.COMMON_NAME, "jupyter_cloudtik egress proxy CA"),
        ])
        now = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        return (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256())
        )

    def issue(self, host: str) -> x509.Certificate:
        """A leaf certificate for ``host`` (a DNS name or an IP address)."""
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            san = x509.DNSName(host)
        now = _now()
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cn = host if len(host) <= 64 else host[:64]
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf certificate for ``host``."""
        host = host.lower().rstrip(".")
        with self._lock:
            hit = self._cache.get(host)
            if hit is not None and hit[0] - LEAF_RENEW_BEFORE > _now():
                self._cache.move_to_end(host)
                return hit[1]
        cert = self.issue(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])  # we speak HTTP/1.1 only, never h2
        pem = (self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
            + cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem)
        # the ssl module loads certificates from files only: a private, short-lived one
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".leaf-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            ctx.load_cert_chain(tmp)
        finally:
            os.unlink(tmp)
        expires = cert.not_valid_after_utc if hasattr(cert, "not_valid_after_utc") else \
            cert.not_valid_after.replace(tzinfo=_dt.timezone.utc)
        with self._lock:
            self._cache[host] = (expires, ctx)
            self._cache.move_to_end(host)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ctx
