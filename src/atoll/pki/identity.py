"""Who a verified peer is, read from its certificate's subject.

The server never trusts a name a client sends: after the mutual-TLS handshake it takes the
peer's certificate (grpc: ``context.auth_context()["x509_pem_cert"][0]``) and reads
``CN`` (name), ``O`` (org), ``OU`` (kind) and, for admins, ``title`` (role) from it.
The chain was verified by the TLS layer; this module only reads the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from atoll.spec.errors import EXIT_INVALID, AtollError

KINDS = ("server", "site", "admin")
ROLES = ("project_admin", "org_admin", "lead", "member")


class IdentityError(AtollError, ValueError):
    """The certificate is not one atoll issued (missing or unknown subject fields)."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Identity:
    name: str
    org: str
    kind: str  # server | site | admin
    role: str | None = None  # admins only: project_admin | org_admin | lead | member


def identity_from_cert(data: bytes | str) -> Identity:
    """Identity of a PEM or DER certificate; IdentityError if a field is missing or unknown."""
    if isinstance(data, str):
        data = data.encode("ascii")
    return _parse(bytes(data))


@lru_cache(maxsize=256)  # a peer presents the same certificate on every call
def _parse(data: bytes) -> Identity:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            cert = x509.load_pem_x509_certificate(data)
        else:
            cert = x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise IdentityError(f"not a certificate: {exc}") from None

    def field(oid: x509.ObjectIdentifier, label: str, required: bool = True) -> str | None:
        values = cert.subject.get_attributes_for_oid(oid)
        if len(values) > 1:
            raise IdentityError(f"certificate subject has {len(values)} {label} fields")
        if not values:
            if required:
                raise IdentityError(f"certificate subject has no {label}")
            return None
        value = values[0].value
        return value if isinstance(value, str) else value.decode("utf-8")

    name = field(NameOID.COMMON_NAME, "common name (CN)")
    org = field(NameOID.ORGANIZATION_NAME, "organization (O)")
    kind = field(NameOID.ORGANIZATIONAL_UNIT_NAME, "kind (OU)")
    role = field(NameOID.TITLE, "role (title)", required=False)
    assert name is not None and org is not None and kind is not None
    return _checked(name, org, kind, role)


# RFC 2253 attribute types as gRPC prints a verified peer's subject (`x509_subject`).
_SUBJECT_KEYS = {"CN": "common name (CN)", "O": "organization (O)", "OU": "kind (OU)",
                 "title": "role (title)"}


@lru_cache(maxsize=256)
def identity_from_subject(subject: str) -> Identity:
    """Identity from the RFC 2253 subject gRPC reports for a verified peer
    (``title=lead,OU=admin,O=org,CN=name``). It spares the server parent the cryptography
    import (about 9 MiB of memory) that parsing the certificate itself would need."""
    fields: dict[str, list[str]] = {}
    for part in _split_rdns(subject):
        key, sep, value = part.partition("=")
        if not sep:
            raise IdentityError(f"malformed certificate subject {subject!r}")
        fields.setdefault(key.strip(), []).append(value)
    values: dict[str, str | None] = {}
    for key, label in _SUBJECT_KEYS.items():
        found = fields.get(key, [])
        if len(found) > 1:
            raise IdentityError(f"certificate subject has {len(found)} {label} fields")
        if not found and key != "title":
            raise IdentityError(f"certificate subject has no {label}")
        values[key] = found[0] if found else None
    return _checked(values["CN"], values["O"], values["OU"], values["title"])


def _split_rdns(subject: str) -> list[str]:
    """Split on the commas that separate attributes, undoing RFC 2253 backslash escapes."""
    parts, current, chars = [], [], iter(subject)
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _checked(name: str, org: str, kind: str, role: str | None) -> Identity:
    if kind not in KINDS:
        raise IdentityError(f"certificate kind (OU) {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "admin" and role not in ROLES:
        raise IdentityError(f"admin certificate role {role!r} is not one of {', '.join(ROLES)}")
    if kind != "admin" and role is not None:
        raise IdentityError(f"a {kind} certificate carries no role, found {role!r}")
    return Identity(name=name, org=org, kind=kind, role=role)


def issued_identity(pem: bytes, ca_pem: bytes, now: float | None = None) -> Identity:
    """The identity of a certificate this project's CA issued and that is valid now:
    how the server learns of a participant provisioned since it started, before it connects.
    IdentityError says what is wrong."""
    import datetime as dt
    import time

    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        cert = x509.load_pem_x509_certificate(pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise IdentityError("the certificate given was not issued by this project's CA") from None
    at = dt.datetime.fromtimestamp(now if now is not None else time.time(), dt.UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise IdentityError("the certificate given is not valid now")
    return identity_from_cert(pem)
