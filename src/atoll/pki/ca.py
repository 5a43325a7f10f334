"""The project's root certificate authority: an ECDSA P-256 key and a self-signed certificate.

P-256 is what every TLS stack we meet (grpcio's BoringSSL, OpenSSL, Go, Java) accepts for both
certificates and ECDHE, with small keys and fast handshakes. The CA key stays in the project
admin's ``ca/`` folder; it is never copied into a startup kit.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from atoll.base.files import PRIVATE, PUBLIC, write_atomic
from atoll.spec.errors import EXIT_INVALID, AtollError

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

CA_CERT_FILE = "rootCA.pem"
CA_KEY_FILE = "rootCA.key"
CA_VALID_DAYS = 3650


class CAError(AtollError, ValueError):
    """The CA folder is missing or unreadable; the message names the file."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return private_key_pem(self.key)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM: what grpcio and the ssl module load without a passphrase."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate, as ``openssl x509 -noout -fingerprint -sha256`` prints it:
    what a participant compares with the one the project admin published for the root CA."""
    from cryptography.hazmat.primitives import hashes

    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_ca(
    project: str,
    *,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> CertificateAuthority:
    """A new root CA for ``project``; valid from now (minus a minute of clock skew) for 10 years."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = new_key()
    start = not_before or utcnow() - dt.timedelta(minutes=1)
    end = not_after or start + dt.timedelta(days=CA_VALID_DAYS)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"{project} root CA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, project),
        ]
    )
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert=cert, key=key)


def save_ca(ca: CertificateAuthority, ca_dir: Path) -> list[Path]:
    """Write ``rootCA.pem`` (0644) and ``rootCA.key`` (0600) into ``ca_dir``."""
    ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = ca_dir / CA_CERT_FILE, ca_dir / CA_KEY_FILE
    write_atomic(cert_path, ca.cert_pem(), PUBLIC)
    write_atomic(key_path, ca.key_pem(), PRIVATE)
    return [cert_path, key_path]


def load_ca(ca_dir: Path) -> CertificateAuthority:
    """Read the CA written by ``save_ca``; CAError names the missing or broken file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_path, key_path = ca_dir / CA_CERT_FILE, ca_dir / CA_KEY_FILE
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CAError(f"cannot read the CA certificate {cert_path}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CAError(f"cannot read the CA key {key_path}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CAError(f"{key_path} is not the key of {cert_path}")
    return CertificateAuthority(cert=cert, key=key)
