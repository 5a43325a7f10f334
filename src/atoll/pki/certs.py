"""Participant certificates, signed by the project's CA.

Subject: ``CN=<name>, O=<org>, OU=<kind>`` and, for admins, ``title=<role>``: the server reads
a peer's identity from these fields of its verified certificate (see ``identity.py``).

- server: serverAuth, with SANs for its public host, ``localhost``, ``127.0.0.1`` and ``::1``
  (a local federation and the health checks dial it on loopback);
- site, admin: clientAuth only; sites dial out and never accept connections.

``not_before`` / ``not_after`` are parameters so that tests can issue expired certificates;
``issue_cert`` with another ``create_ca()`` gives a certificate the federation must refuse.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from atoll.base.files import PRIVATE, PUBLIC, write_atomic
from atoll.pki.ca import CertificateAuthority, new_key, private_key_pem, utcnow
from atoll.pki.identity import KINDS

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

Kind = Literal["server", "site", "admin"]
CERT_VALID_DAYS = 3 * 365
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class IssuedCert:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def serial_hex(self) -> str:
        return format(self.cert.serial_number, "x")

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return private_key_pem(self.key)

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Certificate 0644, key 0600, each written atomically."""
        write_atomic(cert_path, self.cert_pem(), PUBLIC)
        write_atomic(key_path, self.key_pem(), PRIVATE)


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # keep the order, drop repeats
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def subject_name(name: str, org: str, kind: str, role: str | None = None) -> x509.Name:
    """``CN=<name>, O=<org>, OU=<kind>`` and, for admins, ``title=<role>``: who the holder is,
    in a certificate and in the request for one."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attributes = [
        x509.NameAttribute(NameOID.COMMON_NAME, name),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
    ]
    if role is not None:
        attributes.append(x509.NameAttribute(NameOID.TITLE, role))
    return x509.Name(attributes)


def issue_cert(
    ca: CertificateAuthority,
    name: str,
    org: str,
    kind: Kind,
    role: str | None = None,
    *,
    hosts: tuple[str, ...] = (),
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> IssuedCert:
    """Sign a new key for one participant (see ``sign_public_key``)."""
    key = new_key()
    cert = sign_public_key(ca, key.public_key(), name, org, kind, role, hosts=hosts,
                           not_before=not_before, not_after=not_after)
    return IssuedCert(cert=cert, key=key)


def sign_public_key(
    ca: CertificateAuthority,
    public: ec.EllipticCurvePublicKey,
    name: str,
    org: str,
    kind: Kind,
    role: str | None = None,
    *,
    hosts: tuple[str, ...] = (),
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> x509.Certificate:
    """A participant's certificate for ``public``: its own new key (``issue_cert``) or the key
    of a signing request, which never leaves its owner (``sign_request.py``).

    ``hosts`` (server only) are added to the SANs before the loopback names. Validity defaults
    to now minus a minute of clock skew, for three years, and never past the CA's own end.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if (kind == "admin") != (role is not None):
        raise ValueError("a role is required for an admin certificate and only for one")
    start = not_before or utcnow() - dt.timedelta(minutes=1)
    end = not_after or min(start + dt.timedelta(days=CERT_VALID_DAYS), ca.cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject_name(name, org, kind, role))
        .issuer_name(ca.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if kind == "server":
        builder = builder.add_extension(_san((*hosts, *LOOPBACK_HOSTS)), critical=False)
    return builder.sign(ca.key, hashes.SHA256())
