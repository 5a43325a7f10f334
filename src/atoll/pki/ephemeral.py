"""A throwaway certificate for a parent's worker endpoint, made at each start.

Workers dial their parent across a cluster's network (Slurm compute nodes, pods). The endpoint
then speaks TLS with this self-signed certificate; the parent hands the certificate (public) to
each worker it launches, and the worker trusts exactly that one. The key never leaves the parent
process's memory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress

VALID_DAYS = 365


def self_signed(host: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `host` (a name or an IP address)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"atoll worker endpoint {host}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
