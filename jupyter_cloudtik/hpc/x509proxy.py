"""RFC 3820 X.509 proxy certificates, made with ``cryptography`` (no ARC client needed).

Real ARC 6 sites authenticate grid users by a short-lived proxy signed with the user's own
certificate, never by the long-lived key itself — the same thing ``arcproxy`` makes.  A
proxy is a certificate whose subject is the user's plus one ``CN=<number>``, issued (and
signed) by the user's certificate, with the critical ProxyCertInfo extension (OID
1.3.6.1.5.5.7.1.14, policy "inherit all").  Delegation to the CE is the same step once more:
the CE sends a certificate request and we sign it with the proxy.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from ..core.errors import ConfigError

PROXY_CERT_INFO = "1.3.6.1.5.5.7.1.14"
# ProxyCertInfo ::= SEQUENCE { proxyPolicy SEQUENCE { policyLanguage id-ppl-inheritAll } }
INHERIT_ALL = b"0\x0c0\n\x06\x08+\x06\x01\x05\x05\x07\x15\x01"


def _x509():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    return x509, hashes, serialization, rsa


def _pem_blocks(pem: str, kind: str) -> list[str]:
    out, cur = [], None
    for line in pem.splitlines():
        if line.startswith("-----BEGIN ") and kind in line:
            cur = [line]
        elif cur is not None:
            cur.append(line)
            if line.startswith("-----END "):
                out.append("\n".join(cur) + "\n")
                cur = None
    return out


def _sign(issuer_cert: Any, issuer_key: Any, public_key: Any, hours: float,
          not_after_cap: dt.datetime | None = None) -> Any:
    x509, hashes, _, _ = _x509()
    now = dt.datetime.now(dt.timezone.utc)
    end = now + dt.timedelta(hours=hours)
    cap = not_after_cap or issuer_cert.not_valid_after_utc
    end = min(end, cap)
    serial = secrets.randbelow(1 << 62) + 1
    subject = x509.Name([*issuer_cert.subject,
                         x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, str(serial))])
    builder = (x509.CertificateBuilder()
               .subject_name(subject).issuer_name(issuer_cert.subject)
               .public_key(public_key).serial_number(serial)
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(end)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=True, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.UnrecognizedExtension(
                   x509.ObjectIdentifier(PROXY_CERT_INFO), INHERIT_ALL), critical=True))
    return builder.sign(issuer_key, hashes.SHA256())


def make_proxy(cert_pem: str, key_pem: str, hours: float = 12.0,
               key_password: str | None = None) -> str:
    """A proxy of the user certificate: PEM of proxy cert, its key, then the user cert
    (the layout of ``arcproxy``'s file, which TLS clients load as one chain file)."""
    x509, _, serialization, rsa = _x509()
    try:
        certs = _pem_blocks(cert_pem, "CERTIFICATE")
        user = x509.load_pem_x509_certificate(certs[0].encode())
        ukey = serialization.load_pem_private_key(
            key_pem.encode(), password=key_password.encode() if key_password else None)
    except (ValueError, IndexError, TypeError) as e:
        raise ConfigError(f"user certificate/key: cannot be read ({e}); give PEM files "
                          "(usercert.pem, userkey.pem)", field="certificate") from None
    now = dt.datetime.now(dt.timezone.utc)
    if user.not_valid_after_utc <= now:
        raise ConfigError(f"user certificate: expired on {user.not_valid_after_utc:%Y-%m-%d}"
                          f" ({user.subject.rfc4514_string()})", field="certificate")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    proxy = _sign(user, ukey, key.public_key(), hours)
    enc = serialization.Encoding.PEM
    key_text = key.private_bytes(enc, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption()).decode()
    return proxy.public_bytes(enc).decode() + key_text + "".join(certs)


def sign_request(proxy_pem: str, csr_pem: str, hours: float = 12.0) -> str:
    """The CE's delegation request signed with our proxy: its new certificate + our chain."""
    x509, _, serialization, _ = _x509()
    certs = _pem_blocks(proxy_pem, "CERTIFICATE")
    keys = _pem_blocks(proxy_pem, "PRIVATE KEY")
    proxy = x509.load_pem_x509_certificate(certs[0].encode())
    key = serialization.load_pem_private_key(keys[0].encode(), password=None)
    cert = _sign(proxy, key, csr_public_key(csr_pem), hours)
    return cert.public_bytes(serialization.Encoding.PEM).decode() + "".join(certs)


def _der(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at ``pos``."""
    tag, n = data[pos], data[pos + 1]
    pos += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(data[pos:pos + k], "big")
        pos += k
    return tag, pos, pos + n


def csr_public_key(csr_pem: str) -> Any:
    """The public key of a PKCS#10 request, read by hand: A-REX 6 writes version 2 into
    its delegation requests, which ``cryptography`` refuses to load (only 0 is valid)."""
    import base64

    from cryptography.hazmat.primitives import serialization

    body = "".join(line for line in csr_pem.strip().splitlines() if not line.startswith("-----"))
    der = base64.b64decode(body)
    _, start, _ = _der(der, 0)  # CertificationRequest
    _, pos, _ = _der(der, start)  # CertificationRequestInfo
    for _ in range(2):  # version, subject
        _, _, pos = _der(der, pos)
    tag, _, end = _der(der, pos)  # subjectPKInfo
    if tag != 0x30:
        raise ValueError("not a certificate request")
    return serialization.load_der_public_key(der[pos:end])


def proxy_expiry(proxy_pem: str) -> float:
    """When the proxy (its first certificate) stops being valid, as a timestamp."""
    x509, _, _, _ = _x509()
    cert = x509.load_pem_x509_certificate(_pem_blocks(proxy_pem, "CERTIFICATE")[0].encode())
    return cert.not_valid_after_utc.timestamp()
