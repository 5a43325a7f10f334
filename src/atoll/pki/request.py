"""Keys that never leave their owner: a participant's side of the request/sign flow.

    atoll provision request --name lead@hospital-a.org --org hospital-a --role lead --out DIR
        DIR/<name>/ (0700): startup/client.key (0600) and <name>.csr, the request to send
    (the project admin signs it, ``sign_request.py``, and sends back <name>.signed.json)
    atoll provision assemble <name>.signed.json --kit DIR/<name>
        the startup kit, in that same folder, around the key that never moved

A request with ``--role`` is a user's (an admin kit), one without a site's. The key is made
where it will stay: the kit's ``startup/client.key``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from atoll.base.files import PRIVATE, PUBLIC, private_dir, write_atomic
from atoll.pki.bundle import load_bundle
from atoll.pki.ca import fingerprint, new_key, private_key_pem
from atoll.pki.certs import subject_name
from atoll.pki.kit import cert_file_names
from atoll.pki.project import ProjectError
from atoll.pki.provision import Target, site_local_files, write_local, write_startup
from atoll.pki.state import ProvisionError, identity_checks
from atoll.spec.errors import Issue

CSR_SUFFIX = ".csr"


@dataclass(frozen=True)
class Request:
    folder: Path  # the participant's own folder: its kit once assembled
    csr: Path
    key: Path
    kind: str  # site | admin


@dataclass(frozen=True)
class Assembled:
    folder: Path
    name: str
    kind: str
    org: str
    role: str | None
    ca_fingerprint: str


def make_request(out_dir: Path, name: str, org: str, role: str | None = None) -> Request:
    """A new key in ``out_dir/<name>/startup/client.key`` and the request ``<name>.csr``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    kind = "site" if role is None else "admin"
    _check(name, org, role)
    out_dir = Path(out_dir).expanduser().resolve()
    folder = out_dir / name
    if folder.exists():
        raise ProvisionError(f"{folder} already exists; a request is made once per key (remove "
                             "the folder, or pass another --out)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        startup = private_dir(tmp / "startup")
        key = new_key()
        key_file = cert_file_names(kind)[1]
        write_atomic(startup / key_file, private_key_pem(key), PRIVATE)
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(subject_name(name, org, kind, role))
               .sign(key, hashes.SHA256()))
        write_atomic(tmp / f"{name}{CSR_SUFFIX}", csr.public_bytes(serialization.Encoding.PEM),
                     PUBLIC)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Request(folder, folder / f"{name}{CSR_SUFFIX}", folder / "startup" / key_file, kind)


def _check(name: str, org: str, role: str | None) -> None:
    issues = []
    for field, check, value in identity_checks(name, org, role):
        try:
            check(value)
        except ValueError as exc:
            hint = " (a user's request needs --role)" if field == "name" and "@" in name else ""
            issues.append(Issue(field, f"{exc}{hint}"))
    if issues:
        raise ProjectError(issues, f"cannot request a certificate for {name!r}")


def assemble(bundle_path: Path, folder: Path) -> Assembled:
    """The startup kit in ``folder`` (the one ``make_request`` wrote), from the signed bundle:
    its certificate must be for the key in the folder and signed by the bundle's root CA."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    from atoll.pki.identity import Identity, identity_from_cert

    bundle = load_bundle(bundle_path)
    folder = Path(folder).expanduser().resolve()
    cert_name, key_name = cert_file_names(bundle.kind)
    key_path = folder / "startup" / key_name
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ProvisionError(f"cannot read the key {key_path}: {exc}; pass --kit, the folder "
                             "`atoll provision request` wrote") from None
    try:
        cert = x509.load_pem_x509_certificate(bundle.certificate.encode())
        ca = x509.load_pem_x509_certificate(bundle.root_ca.encode())
    except ValueError as exc:
        raise ProvisionError(f"{bundle_path}: unreadable certificate: {exc}") from None
    if cert.public_key() != key.public_key():
        raise ProvisionError(f"{bundle_path} holds a certificate for another key than "
                             f"{key_path}: it answers another request (check --kit)")
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        raise ProvisionError(f"{bundle_path}: the certificate is not signed by the bundle's "
                             "root CA; ask the project admin to sign the request again") from None
    expected = Identity(bundle.name, bundle.org, bundle.kind, bundle.role)
    if identity_from_cert(bundle.certificate) != expected:
        raise ProvisionError(f"{bundle_path}: the certificate does not name {bundle.name} as "
                             "the bundle says; ask the project admin to sign it again")
    startup = folder / "startup"
    write_atomic(startup / cert_name, bundle.certificate, PUBLIC)
    target = Target(bundle.project, bundle.server_host, bundle.server_port)
    write_startup(startup, bundle.root_ca.encode(), target, name=bundle.name, org=bundle.org,
                  kind=bundle.kind, role=bundle.role)
    if bundle.kind == "site" and not (folder / "local").exists():  # the operator's, once made
        (folder / "local").mkdir()
        write_local(folder, site_local_files([]), "site")
    return Assembled(folder, bundle.name, bundle.kind, bundle.org, bundle.role, fingerprint(ca))
