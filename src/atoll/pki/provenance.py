"""A job's provenance record: an append-only hash chain of signed entries, each stated and
signed by the party it speaks for, verifiable offline against the project's root CA alone.

An *entry* is canonical JSON (sorted keys, no spaces, ASCII) signed by the party in ``by``::

    {"format": "atoll-provenance-entry/1", "job_id": J, "kind": KIND,
     "by": {"kind": "server"|"site", "name": NAME}, "at": UNIX_SECONDS, "body": {...},
     server entries: "seq": N, "prev": DIGEST_OF_ITEM_N-1,
     site entries:   "job_statement": STATEMENT_DIGEST}

The record keeps each entry as an *item* ``{"seq", "prev", "entry", "signature", "signer"}``
whose *digest* is ``sha256:<hex>`` of the canonical item; item N carries the digest of item
N-1 in ``prev`` (item 0 carries ""), so no entry can be changed, dropped, inserted or
reordered without breaking every link after it. A server entry signs its own link; a site
signs its entry where it runs the job, without waiting for the server's chain (the sites of a
job state things at once), binding it instead to the job's signed statement it verified
itself (``job_statement``); the server appends it verbatim and the links after it, and the
head, cover it. ``signer`` is the SHA-256 fingerprint of the certificate whose key signed the
entry, and ``by`` must be the identity in that certificate: the server holds no site's key
and so cannot state anything in a site's name. The *head* (signed by the server) names the
number of items and the last digest, so a record cut short is refused too.

The exported record (``atoll job provenance``) is one JSON file::

    {"format": "atoll-provenance/1", "project": P, "job_id": J,
     "certificates": {"sha256:<fingerprint>": PEM, ...},
     "entries": [{"seq": N, "prev": D, "entry": TEXT, "signature": BASE64_DER,
                  "signer": FINGERPRINT}, ...],
     "head": {"entry": TEXT, "signature": ..., "signer": ...}}

``verify`` checks every certificate against the root CA, every entry's link, signer and
signature, the submitter's own job signature carried in the first entry, the head, and,
given a model file, that its digest is the final model's; ``ProvenanceError`` names the first
entry that fails.

Who states what (KINDS): the server states the signed job it took in, its intake decision,
each round's global model and the final model, metrics and DP epsilon; a site states its own
decision (the rule that allowed it), what its launcher ran and the datasets it mapped. What a
site states about its data is the site's own statement: the record proves who said it, not that
it is true (docs/provenance.md).

cryptography is imported only inside the functions that sign or verify, and a parent's signing
and its check of a site's entry go to its verifier process (pki/verifier.py), which has it
loaded already: a parent never loads it (see pki/job_signature.py for why parents avoid it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from atoll.pki.job_signature import FORMAT as JOB_SIGNATURE_FORMAT
from atoll.pki.job_signature import canonical
from atoll.spec.errors import EXIT_INVALID, AtollError

FORMAT = "atoll-provenance/1"
ENTRY_FORMAT = "atoll-provenance-entry/1"
HEAD_FORMAT = "atoll-provenance-head/1"
MAX_RECORD_BYTES = 64 * 1024 * 1024
# For measuring the record's cost only (bench/compare's atoll-noprov): a parent started with this
# variable set to 1 keeps no record (the server) or states no entries (a site), and says so.
BENCHMARK_OFF = "ATOLL_BENCHMARK_NO_PROVENANCE"


def switched_off(environ: Any = None) -> bool:
    import os

    return (environ if environ is not None else os.environ).get(BENCHMARK_OFF) == "1"

# entry kind -> the kind of party that may state it
KINDS = {
    "job.signed": "server",      # the submitter's signed statement, as the server took it in
    "server.intake": "server",   # the server's decision, its atoll version
    "site.decision": "site",     # a site's decision and the rule that allowed it
    "site.launch": "site",       # what a site's launcher ran, its datasets, its atoll version
    "round.model": "server",     # the global model's digest after a round
    "job.final": "server",       # the final model's, the metrics' digests, DP epsilon spent
    "site.note": "site",         # anything else a site chooses to state (e.g. its data print)
}


class ProvenanceError(AtollError, ValueError):
    """A provenance record does not verify; the message names the first entry that fails."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Entry:
    """One verified (or to be signed) entry, parsed."""

    seq: int
    kind: str
    by_kind: str
    by_name: str
    at: int
    body: dict[str, Any]
    digest: str


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(path: Any) -> str:
    """``sha256:<hex>`` of a file's bytes, read in chunks (a model may be GiB)."""
    from atoll.base.sha256 import sha256_for

    with open(path, "rb") as fh:
        h = sha256_for(os.fstat(fh.fileno()).st_size)
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def fingerprint(cert_pem: bytes) -> str:
    """The name of a certificate in a record: SHA-256 of its DER (the PEM's base64 body, read
    without cryptography: the server appends a site's entry without loading it)."""
    text = cert_pem.decode("ascii")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    if begin not in text or end not in text:
        raise ProvenanceError("not a PEM certificate")
    body = text.split(begin, 1)[1].split(end, 1)[0]
    try:
        return digest_of(base64.b64decode("".join(body.split()), validate=True))
    except ValueError:
        raise ProvenanceError("not a PEM certificate") from None


# -- writing --------------------------------------------------------------------------------
def entry_text(job_id: str, kind: str, by: tuple[str, str], at: int, body: dict[str, Any],
               link: dict[str, Any]) -> bytes:
    """An entry's text; ``link`` is ``{"seq", "prev"}`` for the server's own entries and
    ``{"job_statement": STATEMENT_DIGEST}`` for a site's."""
    if kind not in KINDS:
        raise ProvenanceError(f"unknown provenance entry kind {kind!r}")
    if KINDS[kind] != by[0]:
        raise ProvenanceError(f"a {by[0]} cannot state a {kind} entry (only a {KINDS[kind]})")
    return canonical({"format": ENTRY_FORMAT, "job_id": job_id, "kind": kind,
                      "by": {"kind": by[0], "name": by[1]}, "at": int(at), "body": body,
                      **link})


def site_entry(job_id: str, job_statement: str, kind: str, site: str, body: dict[str, Any],
               key_pem: bytes, cert_pem: bytes, at: int) -> dict[str, str]:
    """What a site sends the server: its entry about the job whose signed statement it
    verified (``job_statement``), signed with its own key."""
    return sign(entry_text(job_id, kind, ("site", site), at, body,
                           {"job_statement": job_statement}), key_pem, cert_pem)


def item_digest(item: dict[str, Any]) -> str:
    return digest_of(canonical({k: item[k] for k in ("seq", "prev", "entry", "signature",
                                                     "signer")}))


def sign(text: bytes, key_pem: bytes, cert_pem: bytes) -> dict[str, str]:
    """A signed item of a record: ``text`` signed with the PEM EC key ``key_pem`` (by the
    parent's verifier, which has cryptography loaded already: pki/verifier.py)."""
    from atoll.pki import verifier

    answer = verifier.ask("sign", text=text.decode("ascii"), key=key_pem.decode("ascii"))
    if answer is None:
        signature = signature_here(text, key_pem)
    elif answer[0] == 0:
        signature = answer[1]
    else:
        raise ProvenanceError(answer[1])
    return {"entry": text.decode("ascii"), "signature": signature,
            "signer": fingerprint(cert_pem)}


def signature_here(text: bytes, key_pem: bytes) -> str:
    """The base64 ECDSA (SHA-256) signature of ``text``, made in this process."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ProvenanceError("the signing key is not an EC key; re-provision this kit")
    return base64.b64encode(key.sign(text, ec.ECDSA(hashes.SHA256()))).decode()


class Chain:
    """A record being written: entries appended in order, each linked to the one before.

    The server keeps one per job; a site's entries arrive already signed (``append_signed``),
    are checked to link to the chain as it stands, and are kept verbatim."""

    def __init__(self, project: str, job_id: str) -> None:
        self.project, self.job_id = project, job_id
        self.entries: list[dict[str, Any]] = []
        self.certificates: dict[str, str] = {}
        self.head_digest = ""

    @property
    def next_seq(self) -> int:
        return len(self.entries)

    def add_certificate(self, cert_pem: bytes) -> str:
        fp = fingerprint(cert_pem)
        self.certificates[fp] = cert_pem.decode("ascii")
        return fp

    def append(self, kind: str, by: tuple[str, str], body: dict[str, Any], key_pem: bytes,
               cert_pem: bytes, at: int) -> dict[str, Any]:
        """Sign and append an entry stated by the holder of ``key_pem`` (the server)."""
        link = {"seq": self.next_seq, "prev": self.head_digest}
        item = sign(entry_text(self.job_id, kind, by, at, body, link), key_pem, cert_pem)
        self.add_certificate(cert_pem)
        return self._keep({**link, **item})

    def append_signed(self, item: dict[str, str], cert_pem: bytes,
                      job_statement: str) -> dict[str, Any]:
        """Append an entry a site signed, verbatim, once it names this job's statement."""
        try:
            doc = json.loads(item["entry"])
            kept = {k: str(item[k]) for k in ("entry", "signature", "signer")}
        except (ValueError, KeyError, TypeError) as exc:
            raise ProvenanceError(f"a signed provenance entry is malformed ({exc})") from None
        if (not isinstance(doc, dict) or doc.get("job_id") != self.job_id
                or doc.get("job_statement") != job_statement):
            raise ProvenanceError(f"a signed provenance entry is not about job {self.job_id} "
                                  "as it was signed")
        if any(e["entry"] == kept["entry"] for e in self.entries):
            raise ProvenanceError("a signed provenance entry the record holds already")
        self.add_certificate(cert_pem)
        return self._keep({"seq": self.next_seq, "prev": self.head_digest, **kept})

    def _keep(self, item: dict[str, Any]) -> dict[str, Any]:
        self.entries.append(item)
        self.head_digest = item_digest(item)
        return item

    def record(self, key_pem: bytes, cert_pem: bytes, at: int) -> dict[str, Any]:
        """The record as exported, its head signed with the server's key."""
        head = canonical({"format": HEAD_FORMAT, "job_id": self.job_id,
                          "entries": len(self.entries), "last": self.head_digest,
                          "at": int(at)})
        self.add_certificate(cert_pem)
        return {"format": FORMAT, "project": self.project, "job_id": self.job_id,
                "certificates": dict(self.certificates), "entries": list(self.entries),
                "head": sign(head, key_pem, cert_pem)}


def job_signed_body(bundle: bytes) -> dict[str, Any]:
    """The first entry's body: the submitter's signature file as the server received it (its
    statement, signature and certificate), so an auditor checks the submitter's own signature."""
    doc = json.loads(bundle)
    statement = json.loads(doc["statement"])
    return {"signature_file": {"format": doc["format"], "statement": doc["statement"],
                               "signature": doc["signature"],
                               "certificate": doc["certificate"]},
            "content_digest": digest_of(canonical(statement["files"])),
            "statement_digest": digest_of(doc["statement"].encode("ascii")),
            "submitter": statement["submitter"], "study": statement["study"]}


# -- verifying ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verified:
    job_id: str
    entries: list[Entry]
    model_digest: str | None  # the final model's, when the record has a job.final entry


def verify(data: bytes, ca_pem: bytes, model_digest: str | None = None) -> Verified:
    """Check an exported record against the root CA in ``ca_pem`` (and a model file's
    digest); ProvenanceError names the first entry that fails."""
    try:
        record = json.loads(data)
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')!r} is not {FORMAT}")
        job_id, certificates = str(record["job_id"]), dict(record["certificates"])
        items, head = list(record["entries"]), dict(record["head"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ProvenanceError(f"the provenance record is malformed ({exc})") from None
    signers = _signers(certificates, ca_pem)
    entries: list[Entry] = []
    prev, statement, seen = "", "", {}
    for seq, item in enumerate(items):
        entry = _entry(item, seq, job_id, prev, statement, signers)
        text = str(item["entry"])
        if text in seen:  # a site's entry carries no link of its own: a copy would verify
            raise ProvenanceError(f"entry {seq} ({entry.kind} by {entry.by_kind} "
                                  f"{entry.by_name}) repeats entry {seen[text]}")
        seen[text] = seq
        if seq == 0:
            if entry.kind != "job.signed":
                raise ProvenanceError(f"entry 0 is a {entry.kind} entry; a record starts with "
                                      "the signed job (job.signed)")
            _check_job_signature(entry, ca_pem)
            statement = str(entry.body.get("statement_digest"))
        elif entry.kind == "job.signed":
            raise ProvenanceError(f"entry {seq} (job.signed) repeats the signed job; only "
                                  "entry 0 states it")
        entries.append(entry)
        prev = entry.digest
    _check_head(head, job_id, len(items), prev, signers)
    finals = [e for e in entries if e.kind == "job.final"]
    final = finals[-1] if finals else None
    model = str(final.body.get("model_digest")) if final else None
    if model_digest is not None:
        if final is None:
            raise ProvenanceError("the record has no job.final entry: it names no final model "
                                  "to check the model file against")
        if model != model_digest:
            raise ProvenanceError(f"entry {final.seq} (job.final by {final.by_kind} {final.by_name}): "
                                  f"the model "
                                  f"file's digest {model_digest} is not the final model's "
                                  f"{model}")
    return Verified(job_id, entries, model)


def check_site_item(item: dict[str, Any], cert_pem: bytes, ca_pem: bytes, site: str,
                    job_id: str, job_statement: str, seq: int, prev: str) -> None:
    """What the server checks before it appends a site's entry at ``seq``: that it would pass
    verification there (the CA's certificate of ``site``, a site's kind of entry, about this
    submission, signed by that site), so that no site can make the record fail for all. Checked
    by the parent's verifier where it has one (pki/verifier.py), else here."""
    from atoll.pki import verifier

    try:
        args = {"item": {k: str(item[k]) for k in ("entry", "signature", "signer")},
                "cert": cert_pem.decode("ascii"), "ca": ca_pem.decode("ascii"), "site": site,
                "job_id": job_id, "job_statement": job_statement, "seq": seq, "prev": prev}
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ProvenanceError(f"entry {seq} is malformed ({exc})") from None
    answer = verifier.ask("site_item", args=args)
    if answer is None:
        check_site_item_here(item, cert_pem, ca_pem, site, job_id, job_statement, seq, prev)
    elif answer[0] != 0:
        raise ProvenanceError(answer[1])


def check_site_item_here(item: dict[str, Any], cert_pem: bytes, ca_pem: bytes, site: str,
                         job_id: str, job_statement: str, seq: int, prev: str) -> None:
    """``check_site_item`` in this process."""
    fp = fingerprint(cert_pem)
    signers = _signers({fp: cert_pem.decode("ascii")}, ca_pem)
    placed = {"seq": seq, "prev": prev, **{k: item.get(k) for k in ("entry", "signature",
                                                                     "signer")}}
    entry = _entry(placed, seq, job_id, prev, job_statement, signers)
    if (entry.by_kind, entry.by_name) != ("site", site):
        raise ProvenanceError(f"entry {seq} ({entry.kind}) is not in {site}'s own name")


@dataclass(frozen=True)
class _Signer:
    kind: str
    name: str
    cert: Any  # cryptography's Certificate


def _signers(certificates: dict[str, Any], ca_pem: bytes) -> dict[str, _Signer]:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    from atoll.pki.identity import IdentityError, identity_from_cert

    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise ProvenanceError(f"the CA certificate cannot be read: {exc}") from None
    signers = {}
    for fp, pem in certificates.items():
        try:
            cert = x509.load_pem_x509_certificate(str(pem).encode("ascii"))
            actual = digest_of(cert.public_bytes(serialization.Encoding.DER))
            ident = identity_from_cert(str(pem))
        except (ValueError, IdentityError) as exc:
            raise ProvenanceError(f"certificate {fp} in the record cannot be read: {exc}") from None
        if actual != fp:
            raise ProvenanceError(f"certificate {fp} in the record is not the one its name says "
                                  f"(its fingerprint is {actual})")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue  # not this CA's: any entry it signed is refused by name below
        signers[fp] = _Signer(ident.kind, ident.name, cert)
    return signers


def _parse(item: Any, what: str) -> tuple[bytes, bytes, str, dict[str, Any]]:
    try:
        text = str(item["entry"]).encode("ascii")
        signature = base64.b64decode(item["signature"], validate=True)
        signer = str(item["signer"])
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except (ValueError, KeyError, TypeError, UnicodeEncodeError) as exc:
        raise ProvenanceError(f"{what} is malformed ({exc})") from None
    return text, signature, signer, doc


def _check_signed_by(what: str, text: bytes, signature: bytes, fp: str,
                     signers: dict[str, _Signer], by_kind: str, by_name: str, at: int) -> None:
    import datetime as dt

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    signer = signers.get(fp)
    if signer is None:
        raise ProvenanceError(f"{what} is signed with a certificate this project's CA did not "
                              "issue (or one the record does not carry)")
    if (signer.kind, signer.name) != (by_kind, by_name):
        raise ProvenanceError(f"{what} is stated in the name of {by_kind} {by_name} but signed "
                              f"by {signer.kind} {signer.name}: no party may sign in another's "
                              "name")
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    if not signer.cert.not_valid_before_utc <= when <= signer.cert.not_valid_after_utc:
        raise ProvenanceError(f"{what} was signed at {when:%Y-%m-%d %H:%M} UTC, outside the "
                              f"validity of {signer.name}'s certificate")
    key = signer.cert.public_key()
    try:
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise InvalidSignature
        key.verify(signature, text, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise ProvenanceError(f"{what}: the signature of {signer.name} does not match the "
                              "entry; it was changed after it was signed") from None


def _entry(item: Any, seq: int, job_id: str, prev: str, statement: str,
           signers: dict[str, _Signer]) -> Entry:
    text, signature, fp, doc = _parse(item, f"entry {seq}")
    try:
        kind, by, body = str(doc["kind"]), dict(doc["by"]), dict(doc["body"])
        by_kind, by_name, at = str(by["kind"]), str(by["name"]), int(doc["at"])
        if doc.get("format") != ENTRY_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        digest = item_digest(item)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProvenanceError(f"entry {seq} is malformed ({exc})") from None
    what = f"entry {seq} ({kind} by {by_kind} {by_name})"
    if item.get("seq") != seq:
        raise ProvenanceError(f"{what} says it is entry {item.get('seq')}: the entries were "
                              "reordered, or one was dropped or inserted")
    if item.get("prev") != prev:
        raise ProvenanceError(f"{what} does not link to the entry before it (its prev is not "
                              "that entry's digest): an entry before it was changed, dropped "
                              "or reordered")
    if doc.get("job_id") != job_id:
        raise ProvenanceError(f"{what} is of job {doc.get('job_id')!r}, not {job_id}")
    if KINDS.get(kind) != by_kind:
        raise ProvenanceError(f"{what}: a {by_kind} cannot state a {kind} entry")
    if by_kind == "server" and (doc.get("seq"), doc.get("prev")) != (seq, prev):
        raise ProvenanceError(f"{what}: the link it signed is not its place in the record")
    if by_kind == "site" and doc.get("job_statement") != statement:
        raise ProvenanceError(f"{what} is about another submission of the job (its "
                              "job_statement is not the signed job's statement digest)")
    _check_signed_by(what, text, signature, fp, signers, by_kind, by_name, at)
    return Entry(seq, kind, by_kind, by_name, at, body, digest)


def _check_job_signature(entry: Entry, ca_pem: bytes) -> None:
    from atoll.pki.job_signature import SignatureError, verify_bundle

    what = f"entry 0 (job.signed by server {entry.by_name})"
    try:
        bundle = entry.body["signature_file"]
        if bundle.get("format") != JOB_SIGNATURE_FORMAT:
            raise SignatureError("unknown job signature format")
        statement = json.loads(bundle["statement"])
        at = float(statement["signed_at"])
        signed = verify_bundle(json.dumps(bundle).encode(), ca_pem, now=at)
    except (SignatureError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProvenanceError(f"{what}: the submitter's job signature does not verify: "
                              f"{exc}") from None
    if entry.body.get("content_digest") != signed.digest:
        raise ProvenanceError(f"{what}: its content_digest is not the digest of the files the "
                              "submitter signed")
    if entry.body.get("submitter") != signed.signer.name:
        raise ProvenanceError(f"{what}: it names {entry.body.get('submitter')!r} as submitter "
                              f"but {signed.signer.name} signed the job")


def _check_head(head: Any, job_id: str, count: int, last: str,
                signers: dict[str, _Signer]) -> None:
    text, signature, fp, doc = _parse(head, "the record's head")
    signer = signers.get(fp)
    what = "the record's head"
    if signer is None or signer.kind != "server":
        raise ProvenanceError(f"{what} is not signed by this project's server")
    try:
        at = int(doc["at"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProvenanceError(f"{what} is malformed ({exc})") from None
    _check_signed_by(what, text, signature, fp, signers, "server", signer.name, at)
    if doc.get("format") != HEAD_FORMAT or doc.get("job_id") != job_id:
        raise ProvenanceError(f"{what} is not the head of job {job_id}'s record")
    if doc.get("entries") != count or doc.get("last") != last:
        raise ProvenanceError(f"{what} names {doc.get('entries')} entries ending in "
                              f"{doc.get('last')}, the record holds {count}: entry "
                              f"{min(count, int(doc.get('entries') or 0))} onwards was dropped "
                              "or the last entry was changed")
