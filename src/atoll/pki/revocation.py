"""The revocation list as a parent holds it: which certificate serials the project revoked.

The server and each site keep the newest list they verified in ``<workspace>/crl.pem`` (0600)
and never replace it with an older one (a lower CRL number). Verifying needs cryptography,
which a parent never loads (``crl.py`` runs in a process of its own for it); reading the serial
of a certificate its TLS layer already verified does not: ``cert_serial`` reads that one DER
field, as ``identity.py`` reads the subject gRPC reports.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from atoll.base.files import PRIVATE, write_atomic
from atoll.spec.errors import EXIT_INVALID, AtollError

CRL_FILE = "crl.pem"
VERIFY_TIMEOUT_S = 60.0


class CRLError(AtollError, ValueError):
    """A revocation list that is refused: not signed by the project's CA, older than the one
    held, unreadable. The message says which and what to do."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Revoked:
    serial: int
    at: str  # ISO 8601, UTC
    reason: str  # unspecified, key-compromise, affiliation-changed... (crl.REASONS)

    def describe(self) -> str:
        why = "" if self.reason == "unspecified" else f", reason: {self.reason}"
        return f"serial {self.serial:x}, revoked by the project admin on {self.at[:10]}{why}"


@dataclass(frozen=True)
class RevocationList:
    number: int = 0  # 0: none yet
    issued: str = ""
    entries: dict[int, Revoked] = field(default_factory=dict)
    pem: str = ""
    next_update: str = ""  # ISO 8601, UTC: when the CA means to have replaced it ("": never)

    def of(self, cert_pem: bytes | str) -> Revoked | None:
        """The entry of this certificate, or None; ValueError if it cannot be read."""
        if not self.entries:
            return None
        return self.entries.get(cert_serial(cert_pem))


def verify(pem: str, ca_file: Path) -> RevocationList:
    """The CRL ``pem``, once ``python -m atoll.pki.crl`` has checked that the root CA in
    ``ca_file`` signed it; CRLError otherwise."""
    try:
        done = subprocess.run(  # -P: atoll itself, never a module of the current folder
            [sys.executable, "-P", "-m", "atoll.pki.crl", str(ca_file)], input=pem.encode(),
            capture_output=True, timeout=VERIFY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CRLError(f"could not verify the revocation list: {exc}") from None
    if done.returncode != 0:
        raise CRLError(done.stderr.decode("utf-8", "replace").strip()
                       or f"the revocation list check exited with {done.returncode}")
    doc = json.loads(done.stdout)
    entries = {int(e["serial"], 16): Revoked(int(e["serial"], 16), e["at"], e["reason"])
               for e in doc["revoked"]}
    return RevocationList(doc["number"], doc["issued"], entries, pem,
                          doc.get("next_update") or "")


class RevocationStore:
    """The newest verified list of one parent, kept in its workspace."""

    def __init__(self, workspace: Path, ca_file: Path):
        self.path = workspace / CRL_FILE
        self.ca_file = ca_file
        self.current = RevocationList()
        self._lock = threading.Lock()

    def load(self) -> RevocationList:
        """The list kept at the last run, checked again; CRLError (the parent does not start)
        if it no longer verifies: a parent does not drop a revocation silently."""
        if self.path.exists():
            try:
                self.current = verify(self.path.read_text(encoding="utf-8"), self.ca_file)
            except (CRLError, OSError, UnicodeDecodeError) as exc:
                raise CRLError(f"{self.path}: {exc}; remove this file and push the project's "
                               "newest ca/crl.pem again (`atoll crl push`)") from None
        return self.current

    def install(self, pem: str) -> tuple[bool, RevocationList]:
        """(whether it changed anything, the list now held). CRLError for a list the CA did not
        sign, or one older than the list held: a replayed old list cannot un-revoke anyone."""
        if pem == self.current.pem:  # a site is sent the list at every connect: no new check
            return False, self.current
        new = verify(pem, self.ca_file)
        with self._lock:
            held = self.current
            if new.number < held.number:
                raise CRLError(f"this revocation list is number {new.number}, older than the "
                               f"number {held.number} already held; push the project's newest "
                               "ca/crl.pem")
            if new.number == held.number:
                if new.entries.keys() != held.entries.keys():
                    raise CRLError(f"this revocation list has the number {new.number} of the "
                                   "one already held but other entries; make a new one with "
                                   "`atoll provision revoke`")
                return False, held
            write_atomic(self.path, pem, PRIVATE)
            self.current = new
            return True, new


@lru_cache(maxsize=1024)  # a peer presents the same certificate on every call
def cert_serial(pem: bytes | str) -> int:
    """The serial number of a PEM certificate; ValueError if it is not one.

    Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
    serialNumber INTEGER, ... } ...}: two headers in, past the version, one INTEGER.
    """
    text = pem.decode("ascii", "replace") if isinstance(pem, bytes) else pem
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    body = text.partition(begin)[2].partition(end)[0]
    try:
        der = base64.b64decode("".join(body.split()), validate=True)
        _, pos, _ = _header(der, 0, 0x30)  # Certificate
        _, pos, _ = _header(der, pos, 0x30)  # TBSCertificate
        if der[pos] == 0xA0:  # [0] EXPLICIT version
            pos = _header(der, pos, 0xA0)[2]
        _, start, stop = _header(der, pos, 0x02)
    except (ValueError, IndexError):
        raise ValueError("not a PEM certificate") from None
    return int.from_bytes(der[start:stop], "big", signed=True)


def _header(der: bytes, pos: int, tag: int) -> tuple[int, int, int]:
    """(tag, where the value starts, where it ends) of the DER element at ``pos``."""
    if der[pos] != tag:
        raise ValueError(f"expected tag {tag:#x} at {pos}")
    length, pos = der[pos + 1], pos + 2
    if length & 0x80:  # long form: the next (length & 0x7f) bytes hold the length
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError("bad length")
        length, pos = int.from_bytes(der[pos:pos + count], "big"), pos + count
    if pos + length > len(der):
        raise ValueError("truncated")
    return tag, pos, pos + length
