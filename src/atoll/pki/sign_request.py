"""The project admin's side of the request/sign flow: ``atoll provision sign DIR/PROJECT CSR``.

A participant sends a certificate signing request (``request.py``: its own key made it, and
the key stays with it). The admin reads who it asks to be (``read_request``), decides, and
signs: the certificate is issued exactly as ``atoll provision`` issues one (``certs.py``),
recorded in ``ca/state.json`` like ``add-site`` / ``add-user`` would, and written into a signed
bundle (``bundle.py``) to send back. No kit folder and no private key is written here.

The project folder's ``ca/state.json`` is the register, as for ``add-site``: a name need not be
in project.yaml, and a name already issued is refused unless its certificate was revoked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.pki.bundle import SUFFIX, Bundle, write_bundle
from atoll.pki.ca import fingerprint, load_ca
from atoll.pki.certs import sign_public_key
from atoll.pki.state import (
    ProvisionError,
    add_entry,
    check_new,
    identity_checks,
    locked,
    record,
    write_state,
)

if TYPE_CHECKING:
    from cryptography import x509


@dataclass(frozen=True)
class RequestInfo:
    """Who a request asks to be. ``kind``: site or admin (a user)."""

    name: str
    org: str
    kind: str
    role: str | None
    csr: x509.CertificateSigningRequest


@dataclass(frozen=True)
class Signed:
    info: RequestInfo
    serial: str
    bundle: Path
    ca_fingerprint: str


def read_request(path: Path) -> RequestInfo:
    """The request in ``path``, whose own signature proves its sender holds the key;
    ProvisionError says why one is refused."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    try:
        csr = x509.load_pem_x509_csr(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"cannot read the signing request {path}: {exc}; pass the .csr "
                             "file `atoll provision request` wrote") from None
    if not csr.is_signature_valid:
        raise ProvisionError(f"{path}: the request's signature does not verify; it was altered "
                             "on its way, ask for it again")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ProvisionError(f"{path}: the request's key is not an ECDSA P-256 key, the only "
                             "kind atoll issues; make the request with `atoll provision request`")

    def field(oid: Any) -> str | None:
        values = csr.subject.get_attributes_for_oid(oid)
        if len(values) > 1:
            raise ProvisionError(f"{path}: the request's subject repeats {oid._name}")
        value = values[0].value if values else None
        return value.decode() if isinstance(value, bytes) else value

    name, org = field(NameOID.COMMON_NAME), field(NameOID.ORGANIZATION_NAME)
    kind, role = field(NameOID.ORGANIZATIONAL_UNIT_NAME), field(NameOID.TITLE)
    if kind not in ("site", "admin") or not name or not org:
        raise ProvisionError(f"{path}: the request names no site or user (subject "
                             f"{csr.subject.rfc4514_string()!r}); make it with "
                             "`atoll provision request`")
    if (kind == "admin") != (role is not None):
        raise ProvisionError(f"{path}: a user's request carries a role, a site's none")
    return RequestInfo(name, org, kind, role, csr)


def sign_request(project_dir: Path, info: RequestInfo, out: Path | None = None,
                 csr_path: Path | None = None) -> Signed:
    """Issue the certificate ``info`` asks for and write the bundle to ``out`` (default:
    ``<name>.signed.json`` beside the request)."""
    from cryptography.hazmat.primitives import serialization

    project_dir = Path(project_dir).expanduser().resolve()
    folder = csr_path.parent if csr_path else Path.cwd()
    out = Path(out) if out else folder / f"{info.name}{SUFFIX}"
    checks = identity_checks(info.name, info.org, info.role)
    with locked(project_dir) as state:
        check_new(project_dir, state, info.name, checks, folder=False)
        if out.exists():
            raise ProvisionError(f"{out} already exists; remove it or pass --out FILE")
        ca = load_ca(project_dir / "ca")
        cert = sign_public_key(ca, info.csr.public_key(), info.name, info.org,
                               info.kind, info.role)  # type: ignore[arg-type]
        server = state["server"]
        pem = cert.public_bytes(serialization.Encoding.PEM).decode()
        write_bundle(Bundle(state["project"], info.name, info.kind, info.org, info.role,
                            server["host"], server["port"], pem, ca.cert_pem().decode()), out)
        try:
            add_entry(state, info.name,
                      record(cert, info.kind, info.org, info.role, None, source="request"))
            write_state(project_dir / "ca", state)
        except BaseException:
            out.unlink(missing_ok=True)  # not recorded: not issued
            raise
    return Signed(info, format(cert.serial_number, "x"), out, fingerprint(ca.cert))
