"""Who a verified peer is, read from its certificate's subject.

The server never trusts a name a client sends: after the mutual-TLS handshake it takes the
peer's certificate (grpc: ``context.auth_context()["x509_pem_cert"][0]``) and reads
``CN`` (name), ``O`` (org), ``OU`` (kind) and, for admins, ``title`` (role) from it.
The chain was verified by the TLS layer; this module only reads the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

KINDS = ("server", "site", "admin")
ROLES = ("project_admin", "org_admin", "lead", "member")


class IdentityError(ValueError):
    """The certificate is not one atoll issued (missing or unknown subject fields)."""


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
    if kind not in KINDS:
        raise IdentityError(f"certificate kind (OU) {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "admin" and role not in ROLES:
        raise IdentityError(f"admin certificate role {role!r} is not one of {', '.join(ROLES)}")
    if kind != "admin" and role is not None:
        raise IdentityError(f"a {kind} certificate carries no role, found {role!r}")
    return Identity(name=name, org=org, kind=kind, role=role)
