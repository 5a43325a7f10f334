"""A site worker's secure-aggregation identity: a per-job Ed25519 key certified by its site.

The server relays every secure aggregation message between the sites, so a site must know that
a key advertised as another site's really is that site's (else the server plays every other
site itself, a Sybil attack, and unmasks the one real site). Workers never hold the site's
private key (DESIGN.md), so the site parent certifies a fresh key for each job it launches:

its site's ECDSA signature of the statement (job id, site name, the key; the format is
atoll.spec.secagg_credential's), with the site's certificate and the project's CA certificate.

The worker gets the credential and the Ed25519 private key through its launcher's secret
channel (CREDENTIAL_VAR) and signs its round keys and the consistency check with it; a peer
accepts a credential only if the certificate was issued by the project's CA to a *site* of
that name, is valid now, and signed the statement for this very job
(atoll.fl.privacy.secagg.identity.check).

Parents never import cryptography: the parent runs ``issue_apart``, which runs this module as
``python -P -m atoll.pki.worker_credential`` in a process of its own (the site's key file is
read there, never by the parent's own process).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from atoll.pki.identity import IdentityError, identity_from_cert
from atoll.spec.errors import AtollError
from atoll.spec.secagg_credential import CREDENTIAL_VAR, statement

__all__ = ["CREDENTIAL_VAR", "CredentialNotIssued", "issue", "issue_apart"]
ISSUE_TIMEOUT_S = 60.0


class CredentialNotIssued(AtollError, RuntimeError):
    """The site could not certify its worker's key; the message says why."""


def issue(key_pem: bytes, cert_pem: bytes, ca_pem: bytes, job_id: str) -> dict[str, Any]:
    """A fresh Ed25519 key for the site whose key and certificate these are, certified for
    ``job_id``: {"private": B64 raw key, "credential": {...}}."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    site_key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(site_key, ec.EllipticCurvePrivateKey):
        raise CredentialNotIssued("the site's key is not an ECDSA key")
    site = identity_from_cert(x509.load_pem_x509_certificate(cert_pem).public_bytes(
        serialization.Encoding.PEM)).name
    worker = Ed25519PrivateKey.generate()
    public = worker.public_key().public_bytes(serialization.Encoding.Raw,
                                              serialization.PublicFormat.Raw)
    text = statement(job_id, site, public)
    signature = site_key.sign(text, ec.ECDSA(hashes.SHA256()))
    private = worker.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                   serialization.NoEncryption())
    return {"private": base64.b64encode(private).decode(),
            "credential": {"statement": text.decode("ascii"),
                           "signature": base64.b64encode(signature).decode(),
                           "certificate": cert_pem.decode("ascii"),
                           "ca": ca_pem.decode("ascii")}}


def issue_apart(key_file: Path, cert_file: Path, ca_file: Path, job_id: str) -> str:
    """``issue`` in a process of its own (see the top); the JSON text, a secret for the worker."""
    try:
        done = subprocess.run(  # -P: atoll itself, never a module of the current folder
            [sys.executable, "-P", "-m", "atoll.pki.worker_credential", str(key_file),
             str(cert_file), str(ca_file)],
            input=job_id.encode(), capture_output=True, timeout=ISSUE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CredentialNotIssued(f"the worker's secure aggregation key could not be certified: "
                              f"{exc}") from None
    if done.returncode != 0:
        raise CredentialNotIssued("the worker's secure aggregation key could not be certified: "
                              + done.stderr.decode("utf-8", "replace").strip()[-500:])
    return done.stdout.decode("ascii")


def _main(argv: list[str]) -> int:
    """``python -m atoll.pki.worker_credential KEY CERT CA`` (job id on stdin): the credential
    JSON on stdout; exit 2 with the reason on stderr."""
    if len(argv) != 3:
        print("usage: python -m atoll.pki.worker_credential KEY CERT CA < JOB_ID",
              file=sys.stderr)
        return 1
    try:
        key, cert, ca = (Path(p).read_bytes() for p in argv)
        out = issue(key, cert, ca, sys.stdin.read())
    except (OSError, ValueError, IdentityError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
