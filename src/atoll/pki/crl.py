"""The project's certificate revocation list: an X.509 CRL (RFC 5280) signed by the root CA.

``atoll provision revoke`` builds it (``revoke.py``) into ``ca/crl.pem``; the server and the
sites verify it against the root CA of their own kit before they use it. Parents never import
cryptography (17 MiB, and it maps the system's OpenSSL into them): they run this module as
``python -m atoll.pki.crl CA_FILE < CRL`` in a process of its own, which prints what the list
says as JSON (``revocation.py`` reads it) or the reason it is refused on stderr, exit code 2.

Each CRL carries a number that only grows: a receiver never replaces its list by an older one.
Its ``nextUpdate`` is the CA's own end: atoll does not let a list go stale, a newer one
replaces it. A site refuses jobs while the list it holds is past its ``nextUpdate``
(site/revocation.py), so a list given an earlier one must be replaced by then.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atoll.pki.revocation import CRL_FILE, CRLError

if TYPE_CHECKING:
    from cryptography import x509

    from atoll.pki.ca import CertificateAuthority

__all__ = ["CRL_FILE", "REASONS", "Entry", "build_crl", "read_crl"]

# `--reason` as typed -> the RFC 5280 reason code's name in cryptography's ReasonFlags
REASONS = {
    "unspecified": "unspecified",
    "key-compromise": "key_compromise",
    "affiliation-changed": "affiliation_changed",
    "superseded": "superseded",
    "cessation-of-operation": "cessation_of_operation",
    "privilege-withdrawn": "privilege_withdrawn",
}


@dataclass(frozen=True)
class Entry:
    serial: int
    revoked_at: dt.datetime
    reason: str  # a key of REASONS


def build_crl(ca: CertificateAuthority, entries: list[Entry], number: int) -> bytes:
    """The CRL listing ``entries``, numbered ``number``, signed by the CA; PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(now - dt.timedelta(minutes=1))  # a receiver's clock may be a little behind
        .next_update(ca.cert.not_valid_after_utc)
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    for entry in entries:
        revoked = (
            x509.RevokedCertificateBuilder()
            .serial_number(entry.serial)
            .revocation_date(entry.revoked_at)
        )
        if entry.reason != "unspecified":  # RFC 5280: omit the code rather than say unspecified
            flag = getattr(x509.ReasonFlags, REASONS[entry.reason])
            revoked = revoked.add_extension(x509.CRLReason(flag), critical=False)
        builder = builder.add_revoked_certificate(revoked.build())
    crl = builder.sign(ca.key, hashes.SHA256())
    return crl.public_bytes(serialization.Encoding.PEM)


def next_update(data: bytes) -> dt.datetime | None:
    """The ``nextUpdate`` of a PEM CRL (read after ``read_crl`` checked it), or None."""
    from cryptography import x509

    return x509.load_pem_x509_crl(data).next_update_utc


def read_crl(data: bytes, ca_cert: x509.Certificate) -> tuple[int, dt.datetime, list[Entry]]:
    """(number, when it was issued, entries) of a PEM CRL, after checking that ``ca_cert``
    signed it; CRLError says why it is refused."""
    from cryptography import x509

    try:
        crl = x509.load_pem_x509_crl(data)
    except ValueError as exc:
        raise CRLError(f"not a PEM certificate revocation list: {exc}") from None
    if crl.issuer != ca_cert.subject:
        raise CRLError(f"the revocation list was issued by {crl.issuer.rfc4514_string()!r}, "
                       f"not by this project's CA {ca_cert.subject.rfc4514_string()!r}")
    public = ca_cert.public_key()
    if not crl.is_signature_valid(public):  # type: ignore[arg-type]
        raise CRLError("the revocation list's signature does not verify with this project's "
                       "root CA: it was altered, or signed by another CA's key")
    try:
        number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        raise CRLError("the revocation list has no CRL number; make it with "
                       "`atoll provision revoke`") from None
    by_flag = {flag: typed for typed, flag in REASONS.items()}
    entries = []
    for revoked in crl:
        try:
            flag = revoked.extensions.get_extension_for_class(x509.CRLReason).value.reason
            reason = by_flag.get(flag.name, flag.name.replace("_", "-"))
        except x509.ExtensionNotFound:
            reason = "unspecified"
        entries.append(Entry(revoked.serial_number, revoked.revocation_date_utc, reason))
    return number, crl.last_update_utc, entries


def main(argv: list[str]) -> int:
    """``python -m atoll.pki.crl CA_FILE``: the CRL on stdin, verified; JSON on stdout."""
    from cryptography import x509

    if len(argv) != 1:
        print("usage: python -m atoll.pki.crl CA_FILE < CRL", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as fh:
            ca_cert = x509.load_pem_x509_certificate(fh.read())
        data = sys.stdin.buffer.read()
        number, issued, entries = read_crl(data, ca_cert)
        due = next_update(data)
    except CRLError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"cannot read the root CA {argv[0]}: {exc}", file=sys.stderr)
        return 2
    json.dump({"number": number, "issued": issued.isoformat(),
               "next_update": due.isoformat() if due is not None else "",
               "revoked": [{"serial": format(e.serial, "x"), "at": e.revoked_at.isoformat(),
                            "reason": e.reason} for e in entries]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
