"""Signed jobs: the submitter signs the whole job with the key of their own kit; the server and
every site verify it against the project's root CA before they take or run the job.

What is signed (the *statement*, canonical JSON: sorted keys, no spaces, ASCII)::

    {"format": "atoll-job-signature/1", "project": P, "study": S, "submitter": NAME,
     "signed_at": UNIX_SECONDS, "nonce": HEX, "files": {"meta.json": SHA256_HEX, ...}}

``files`` lists every file of the job folder (meta.json with its resource and launcher specs
included) by its path and SHA-256: nothing can be changed, added or removed without breaking
the signature. ``study`` binds the job to the study it was submitted in (it cannot be replayed
into another one) and ``submitter`` to the certificate that signed it. ``nonce`` (128 random bits, new at every
signing) makes each submission a statement of its own, even of the same folder in the same
second: a site records the *statement digest* (``sha256:<hex>`` of the statement text) of each
job it runs with the job's id and refuses the same statement under another id (a replay,
site/signed_jobs.py). Signatures made before the nonce existed verify as before (nonce "").

The signature travels inside the job, as the top-level file ``.atoll-signature.json``
(SIGNATURE_FILE, not part of ``files``)::

    {"format": ..., "statement": STATEMENT_TEXT, "signature": BASE64_DER_ECDSA_SHA256,
     "certificate": SIGNER_CERT_PEM}

The *content digest* (``sha256:<hex>`` over the canonical ``files``) names a job's content
alone, whoever submits it in whatever study: it is what a site's code approval records.

Parents never import cryptography (17 MiB, and the system OpenSSL it maps): the server and the
sites verify a job with ``verify_apart``, in a process of their own (which also hashes the files,
with OpenSSL's SHA-256): the long-lived verifier each parent starts (pki/verifier.py), or, when
it is busy or gone, this module run as ``python -m atoll.pki.job_signature CA_FILE TREE``. The
CLI and Session sign in their own process.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.pki.identity import Identity, IdentityError, identity_from_cert
from atoll.spec.errors import EXIT_INVALID, AtollError

if TYPE_CHECKING:
    import zipfile

    from atoll.pki.kit import Kit

SIGNATURE_FILE = ".atoll-signature.json"
FORMAT = "atoll-job-signature/1"
MAX_BUNDLE_BYTES = 16 * 1024 * 1024  # 10,000 entries of long names, and the certificate
SHOWN = 5  # differences named in a refusal; the rest are counted
_CHUNK = 1 << 20
_RESUBMIT = "submit the job folder again with `atoll job submit` or atoll.Session"


class SignatureError(AtollError, ValueError):
    """A job's signature is missing, not the project's, or does not match what it signs."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Statement:
    project: str
    study: str
    submitter: str
    signed_at: int
    files: dict[str, str]  # relative POSIX path -> SHA-256 hex
    nonce: str = ""  # new at every signing; "" in signatures made before it existed

    @property
    def digest(self) -> str:
        return content_digest(self.files)


@dataclass(frozen=True)
class Signed:
    """A verified signature: who signed (read from their verified certificate) and what."""

    signer: Identity
    statement: Statement
    cert_pem: bytes = b""  # the signer's certificate: its serial is checked for revocation
    # sha256:<hex> of the signed statement's text: one submission (its nonce), not its content
    statement_digest: str = ""

    @property
    def digest(self) -> str:
        return self.statement.digest


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_digest(files: dict[str, str]) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(canonical(files)).hexdigest()


# -- listing a job's files ---------------------------------------------------------------------
def _entry_name(name: str) -> str:
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def manifest_of_zip(archive: zipfile.ZipFile) -> dict[str, str]:
    """{path: sha256} of every file in a job's zip, read back as it will be sent."""
    from atoll.base.sha256 import sha256_for

    files: dict[str, str] = {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        name = _entry_name(info.filename)
        if name == SIGNATURE_FILE:
            raise SignatureError(f"{SIGNATURE_FILE} is reserved for the job's signature, which "
                                 "atoll writes itself; remove it from the job folder")
        digest = sha256_for(info.file_size)
        with archive.open(info) as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
        files[name] = digest.hexdigest()
    return files


def manifest_of_tree(root: Path) -> dict[str, str]:
    """{path: sha256} of every file under ``root`` except its signature; links and special
    files are refused (a job folder holds plain files only)."""
    from atoll.base.sha256 import sha256_for

    files: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if rel == SIGNATURE_FILE:
                continue
            found = os.lstat(path)
            if not stat.S_ISREG(found.st_mode):
                raise SignatureError(f"{rel} is not a regular file; job folders hold plain "
                                     "files only")
            digest = sha256_for(found.st_size)
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
            files[rel] = digest.hexdigest()
    return files


# -- signing (the CLI and Session, with the user's own kit) -----------------------------------
def sign_archive(archive: Path, kit: Kit, study: str, now: float | None = None) -> Statement:
    """Sign the job zipped in ``archive`` for ``study`` with ``kit``'s key, and add the
    signature to the archive."""
    import zipfile

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    with zipfile.ZipFile(archive) as zf:
        files = manifest_of_zip(zf)
    import secrets

    statement = Statement(kit.project, study, kit.name, int(now or time.time()), files,
                          secrets.token_hex(16))
    text = canonical({"format": FORMAT, "project": statement.project, "study": study,
                      "submitter": statement.submitter, "signed_at": statement.signed_at,
                      "nonce": statement.nonce, "files": files})
    key = serialization.load_pem_private_key(kit.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SignatureError(f"{kit.key} is not an EC key; re-provision this user")
    bundle = {"format": FORMAT, "statement": text.decode("ascii"),
              "signature": base64.b64encode(key.sign(text, ec.ECDSA(hashes.SHA256()))).decode(),
              "certificate": kit.cert.read_text(encoding="ascii")}
    with zipfile.ZipFile(archive, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(SIGNATURE_FILE, json.dumps(bundle))
    return statement


# -- verifying (server at intake, each site before it launches) --------------------------------
def read_bundle(tree: Path) -> bytes:
    """The signature file of an unpacked job; SignatureError when there is none."""
    path = tree / SIGNATURE_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SignatureError(f"the job is not signed (no {SIGNATURE_FILE}); {_RESUBMIT}, "
                             "which sign every job with your kit's key") from None
    except OSError as exc:
        raise SignatureError(f"the job's signature cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise SignatureError(f"the job's {SIGNATURE_FILE} is not a file")
        data = fh.read(MAX_BUNDLE_BYTES + 1)
    if len(data) > MAX_BUNDLE_BYTES:
        raise SignatureError(f"the job's signature is over {MAX_BUNDLE_BYTES:,} bytes")
    return data


def verify_bundle(data: bytes, ca_pem: bytes, now: float | None = None,
                  revoked: Callable[[Any], str | None] | None = None) -> Signed:
    """Check a signature file: a user certificate issued by the CA in ``ca_pem`` and valid now,
    whose key signed the statement. ``revoked(cert)`` may name why a certificate is revoked.
    Returns who signed what; SignatureError says what is wrong."""
    try:
        bundle = json.loads(data)
        text = bundle["statement"].encode("ascii")
        signature = base64.b64decode(bundle["signature"], validate=True)
        pem = bundle["certificate"].encode("ascii")
        if bundle.get("format") != FORMAT:
            raise ValueError(f"format {bundle.get('format')!r} is not {FORMAT}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise SignatureError(f"the job's signature is malformed ({exc}); {_RESUBMIT}") from None
    signer = _check_certificate(pem, ca_pem, now, revoked)
    _check_signature(pem, signature, text, signer)
    return Signed(signer, _statement(text, signer), pem, statement_digest(text))


def warm() -> None:
    """Import what a check needs (the verifier does it once, before its first request)."""
    import datetime  # noqa: F401
    import hashlib  # noqa: F401

    from cryptography import x509  # noqa: F401
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: F401
    from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: F401


def statement_digest(text: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(text).hexdigest()


def _check_certificate(pem: bytes, ca_pem: bytes, now: float | None,
                       revoked: Callable[[Any], str | None] | None) -> Identity:
    import datetime as dt

    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        cert = x509.load_pem_x509_certificate(pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise SignatureError(f"the signer's certificate cannot be read: {exc}") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise SignatureError("the job was signed with a certificate this project's CA did not "
                             "issue; only users provisioned for this project can submit") from None
    try:
        signer = identity_from_cert(pem)
    except IdentityError as exc:
        raise SignatureError(f"the signer's certificate is not an atoll user's: {exc}") from None
    at = dt.datetime.fromtimestamp(now if now is not None else time.time(), dt.UTC)
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise SignatureError(f"the certificate of {signer.name} that signed the job is not valid "
                             f"now (valid {cert.not_valid_before_utc:%Y-%m-%d} to "
                             f"{cert.not_valid_after_utc:%Y-%m-%d}); ask the project admin for a "
                             "new kit")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        user_cert = signer.kind == "admin" and ExtendedKeyUsageOID.CLIENT_AUTH in usage
    except x509.ExtensionNotFound:
        user_cert = False
    if not user_cert:
        raise SignatureError(f"the job was signed with the {signer.kind} certificate of "
                             f"{signer.name}; only users (admin kits) sign jobs")
    why = revoked(cert) if revoked is not None else None
    if why:
        raise SignatureError(f"the certificate of {signer.name} that signed the job is revoked: "
                             f"{why}")
    return signer


def _check_signature(pem: bytes, signature: bytes, text: bytes, signer: Identity) -> None:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = x509.load_pem_x509_certificate(pem).public_key()
    try:
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise InvalidSignature
        key.verify(signature, text, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise SignatureError(f"the job's signature is not {signer.name}'s signature of its "
                             "statement: the statement was changed after it was signed") from None


def _statement(text: bytes, signer: Identity) -> Statement:
    try:
        doc = json.loads(text)
        files = doc["files"]
        nonce = doc.get("nonce", "")
        statement = Statement(str(doc["project"]), str(doc["study"]), str(doc["submitter"]),
                              int(doc["signed_at"]), dict(files), str(nonce))
        if not isinstance(nonce, str) or len(nonce) > 128:
            raise ValueError("its nonce is not a short text")
        if doc.get("format") != FORMAT or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError("unknown format or a file without its digest")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise SignatureError(f"the job's signed statement is malformed ({exc})") from None
    if statement.submitter != signer.name:
        raise SignatureError(f"the statement names {statement.submitter!r} as its submitter but "
                             f"{signer.name} signed it")
    return statement


def check_files(statement: Statement, actual: dict[str, str],
                scope: Callable[[str], bool] | None = None) -> None:
    """The files at hand are exactly the signed ones (those in ``scope``: a site receives only
    its own app), byte for byte; SignatureError names the differences."""
    signed = {p: d for p, d in statement.files.items() if scope is None or scope(p)}
    changed = sorted(p for p in signed.keys() & actual.keys() if signed[p] != actual[p])
    added = sorted(actual.keys() - signed.keys())
    missing = sorted(signed.keys() - actual.keys())
    if not (changed or added or missing):
        return
    parts = []
    for label, paths in (("changed after it was signed", changed), ("not signed", added),
                         ("signed but missing", missing)):
        if paths:
            more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
            parts.append(f"{label}: {', '.join(paths[:SHOWN])}{more}")
    raise SignatureError(f"the job's content does not match {statement.submitter}'s signature "
                         f"({'; '.join(parts)})")


def verify_job_tree(tree: Path, ca_file: Path, project: str, study: str) -> Signed:
    """The server's intake check of a whole unpacked job submitted in ``study``."""
    signed, files = verify_apart(tree, ca_file)
    bind(signed, project, study)
    check_files(signed.statement, files)
    return signed


VERIFY_TIMEOUT_S = 900.0  # hashing a job of several GiB


def verify_apart(tree: Path, ca_file: Path) -> tuple[Signed, dict[str, str]]:
    """``verify_bundle`` of the job unpacked in ``tree`` against the root CA in ``ca_file``,
    and ``manifest_of_tree`` of what is there, in a process of its own (see the top): the
    parent's long-lived verifier when it started one (pki/verifier.py), else a new one."""
    from atoll.pki import verifier

    try:
        code, out = verifier.check(ca_file, tree, VERIFY_TIMEOUT_S)
    except (OSError, verifier.CheckTimeout) as exc:
        raise SignatureError(f"the job's signature could not be checked: {exc}") from None
    if code == 2:  # refused: the reason is the one line it printed
        raise SignatureError(out.strip())
    if code != 0:  # a crash: its traceback is for the parent's log, not the user
        import logging

        logging.getLogger("atoll.pki.job_signature").error(
            "the signature check exited with %d: %s", code, out[-4000:])
        raise SignatureError(f"the job's signature could not be checked (the checker exited "
                             f"with {code}; the parent's log has its error)")
    doc = json.loads(out)
    statement = Statement(**doc["statement"])
    return (Signed(Identity(**doc["signer"]), statement, doc["cert"].encode(),
                   doc["statement_digest"]), doc["files"])


def check_tree(ca_file: Path, tree: Path) -> tuple[int, str]:
    """What the job's signature in ``tree`` says, as JSON, with 0; or 2 and the reason it is
    refused. Run in the verifier's process, never in a parent."""
    try:
        signed = verify_bundle(read_bundle(tree), ca_file.read_bytes())
        files = manifest_of_tree(tree)
    except SignatureError as exc:
        return 2, str(exc)
    except OSError as exc:
        return 2, f"the job cannot be read: {exc.strerror}"
    s = signed.statement
    return 0, json.dumps({"signer": vars(signed.signer), "cert": signed.cert_pem.decode("ascii"),
                          "statement": {"project": s.project, "study": s.study,
                                        "submitter": s.submitter, "signed_at": s.signed_at,
                                        "nonce": s.nonce, "files": s.files},
                          "statement_digest": signed.statement_digest, "files": files})


def _main(argv: list[str]) -> int:
    """``python -m atoll.pki.job_signature CA_FILE TREE``: what the job's signature says, as
    JSON; exit 2 with the reason on stderr when it is refused."""
    if len(argv) != 2:
        print("usage: python -m atoll.pki.job_signature CA_FILE TREE", file=sys.stderr)
        return 1
    code, out = check_tree(Path(argv[0]), Path(argv[1]))
    print(out, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


def bind(signed: Signed, project: str, study: str) -> None:
    """The statement is for this project and this study: no replay into another."""
    statement = signed.statement
    if statement.project != project:
        raise SignatureError(f"the job was signed for project {statement.project!r}, not "
                             f"{project!r}")
    if statement.study != study:
        raise SignatureError(f"the job was signed for study {statement.study!r} and submitted "
                             f"in study {study!r}; {_RESUBMIT} in the study it is meant for")
