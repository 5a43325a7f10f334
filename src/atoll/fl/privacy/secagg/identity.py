"""Who signs and who checks in secure aggregation: a site worker's certified Ed25519 key.

``SiteIdentity`` holds this worker's per-job key and the credential its site parent made for it
(atoll.pki.worker_credential); it signs this site's round keys and its consistency-check
answer, and checks a peer's signature against the key the peer's credential certifies, after
checking that credential against the project's CA (whose certificate the parent handed over
with the credential). The server relays these messages and can neither forge nor change them.

``check`` is the whole test of a credential: a certificate the project's CA issued to a site
of that name, valid now, whose key signed the statement (atoll.spec.secagg_credential) for this
very job. It lives here, not in atoll.pki, because the job layer may not import pki.

``LocalAuthority`` makes the same credentials in memory for the simulator and tests, where
every site runs in one process and no site parent exists.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from atoll.spec.errors import AtollError
from atoll.spec.secagg_credential import canonical, statement


class CredentialError(AtollError, ValueError):
    """A worker credential that does not prove which site it is; the message says why."""


class PeerNotAuthenticated(AtollError, ValueError):
    """A message said to be a site's that its certified key did not sign."""


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> str | None:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1:
        return None
    value = values[0].value
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def check(credential: Any, ca_pem: bytes, job_id: str, site: str,
          now: float | None = None) -> bytes:
    """The raw Ed25519 public key that ``credential`` certifies for ``site`` in ``job_id``;
    CredentialError says what does not hold."""
    try:
        text = str(credential["statement"]).encode("ascii")
        signature = base64.b64decode(str(credential["signature"]), validate=True)
        cert = x509.load_pem_x509_certificate(str(credential["certificate"]).encode("ascii"))
        ca = x509.load_pem_x509_certificate(ca_pem)
        doc = json.loads(text)
        public = base64.b64decode(str(doc["key"]), validate=True)
    except (KeyError, TypeError, ValueError, UnicodeError, RecursionError) as exc:
        raise CredentialError(f"{site}'s credential is malformed ({exc})") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CredentialError(f"the certificate sent as {site}'s was not issued by this "
                              "project's CA") from None
    name, kind = _subject(cert, NameOID.COMMON_NAME), _subject(
        cert, NameOID.ORGANIZATIONAL_UNIT_NAME)
    if kind != "site" or name != site:
        raise CredentialError(f"the certificate sent as {site}'s belongs to {kind} {name!r}")
    at = dt.datetime.fromtimestamp(now if now is not None else time.time(), dt.UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise CredentialError(f"{site}'s certificate is not valid now")
    key = cert.public_key()
    try:
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise InvalidSignature
        key.verify(signature, text, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise CredentialError(f"{site}'s credential is not signed by {site}'s key") from None
    if len(public) != 32 or text != statement(job_id, site, public):
        raise CredentialError(f"{site}'s credential certifies a key for another job or site "
                              f"({doc.get('job_id')!r}, {doc.get('site')!r})")
    return public


@dataclass
class SiteIdentity:
    site: str
    job_id: str
    private: bytes  # raw Ed25519 key: this worker's alone, for this job
    credential: dict[str, Any]  # its site's certification of the public half
    ca_pem: bytes
    _peers: dict[str, tuple[str, Ed25519PublicKey]] = field(default_factory=dict)

    @classmethod
    def from_secret(cls, site: str, job_id: str, text: str) -> SiteIdentity:
        """From the JSON its site parent handed over (worker_credential.CREDENTIAL_VAR)."""
        try:
            doc = json.loads(text)
            private = base64.b64decode(doc["private"], validate=True)
            credential = dict(doc["credential"])
            ca = str(credential["ca"]).encode("ascii")
        except (KeyError, TypeError, ValueError, UnicodeError) as exc:
            raise CredentialError(f"this worker's secure aggregation credential is malformed "
                                  f"({exc})") from None
        identity = cls(site, job_id, private, credential, ca)
        identity.public_key(site, credential)  # our own must pass the check peers will make
        return identity

    def sign(self, text: bytes) -> str:
        return base64.b64encode(Ed25519PrivateKey.from_private_bytes(self.private)
                                .sign(text)).decode()

    def public_key(self, site: str, credential: Any) -> Ed25519PublicKey:
        """``site``'s certified key for this job, from ``credential`` (checked once per site:
        a second, different credential for one site is refused)."""
        statement = str(credential.get("statement")) if isinstance(credential, dict) else ""
        known = self._peers.get(site)
        if known is not None:
            if known[0] != statement:
                raise PeerNotAuthenticated(f"two different credentials for {site} in one job")
            return known[1]
        try:
            raw = check(credential, self.ca_pem, self.job_id, site)
        except CredentialError as exc:
            raise PeerNotAuthenticated(str(exc)) from None
        key = Ed25519PublicKey.from_public_bytes(raw)
        self._peers[site] = (statement, key)
        return key

    def verify(self, site: str, credential: Any, text: bytes, signature: Any) -> None:
        key = self.public_key(site, credential)
        try:
            key.verify(base64.b64decode(str(signature), validate=True), text)
        except (InvalidSignature, ValueError):
            raise PeerNotAuthenticated(f"{site}'s certified key did not sign this message") \
                from None


class LocalAuthority:
    """A throwaway project CA with one site certificate per name (simulator and tests): the
    credentials a site parent would issue (atoll.pki.worker_credential), made in memory."""

    def __init__(self, project: str = "simulated"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.ca = self._cert(f"{project} root CA", None, self.key.public_key(), ca=True)
        self._sites: dict[str, tuple[ec.EllipticCurvePrivateKey, x509.Certificate]] = {}

    def _cert(self, name: str, kind: str | None, public: Any, ca: bool = False
              ) -> x509.Certificate:
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, name),
                   x509.NameAttribute(NameOID.ORGANIZATION_NAME, "simulated")]
        if kind is not None:
            subject.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind))
        now = dt.datetime.now(dt.UTC)
        issuer = self.ca.subject if not ca else x509.Name(subject)
        return (x509.CertificateBuilder().subject_name(x509.Name(subject)).issuer_name(issuer)
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=1))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))

    def ca_pem(self) -> bytes:
        return self.ca.public_bytes(serialization.Encoding.PEM)

    def identity(self, site: str, job_id: str) -> SiteIdentity:
        if site not in self._sites:
            key = ec.generate_private_key(ec.SECP256R1())
            self._sites[site] = (key, self._cert(site, "site", key.public_key()))
        site_key, cert = self._sites[site]
        worker = Ed25519PrivateKey.generate()
        public = worker.public_key().public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)
        text = statement(job_id, site, public)
        private = worker.private_bytes(serialization.Encoding.Raw,
                                       serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())
        credential = {"statement": text.decode("ascii"),
                      "signature": base64.b64encode(
                          site_key.sign(text, ec.ECDSA(hashes.SHA256()))).decode(),
                      "certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
                      "ca": self.ca_pem().decode()}
        return SiteIdentity(site, job_id, private, credential, self.ca_pem())


def signed_text(kind: str, **fields: Any) -> bytes:
    """The canonical bytes a site signs for one protocol message (``kind`` names it)."""
    return canonical({"format": f"atoll-secagg-{kind}/1", **fields})
