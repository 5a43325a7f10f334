"""The server's side of each job's provenance record (pki/provenance.py): the entries it
states, signed with its own key, and the sites' signed entries, appended verbatim.

Each job's items are kept one JSON line each in ``jobs/<id>/provenance.jsonl`` (0600, opened
for appending only; fsynced once, with the job's last entry), with the certificate that signed
each item, so a restarted server (or a resumed job) continues the same chain. A machine that
crashes mid-job may lose the last lines: the chain kept is still whole (a torn last line is
cut off when the file is read again, and the next entry links to the last one kept). The
record is exported with its head signed at that moment (``atoll job provenance``, and
``provenance.json`` in ``job download``'s results).

The server's entries are signed in the server parent: cryptography is loaded by the first
job's first entry, never by a parent at rest (pki/job_signature.py says why parents avoid it),
and the server's key does not leave the process that already holds it. A site's entry is
checked to be in that site's name (the name its mutual-TLS certificate gave its link), about
this job's signed statement, and to pass verification where it is placed (the CA's
certificate of that site, a site's kind of entry, its signature), so that no site can make the
record fail for everyone; whoever verifies the record checks it all again.

What the server states about a round's and the final model comes from the server worker (job
code): a ``round.model`` entry is appended as each round's report arrives (the workflow's own
statement of its global model's digest, `round_model`), so a record exported mid-job already
names the rounds done; at the job's end, any round of ``results/model_digests.jsonl`` not yet
stated with that digest is stated then (a report lost to a server restart), and the final
model's and the metrics' digests are of the files the download holds. A round already stated
with the same digest is never stated again: a job resumed after a restart, which runs the
interrupted round again, keeps each round once (a re-run round whose model came out
differently is stated again; the later entry is the round's).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import PRIVATE
from atoll.pki.provenance import (
    Chain,
    ProvenanceError,
    check_site_item,
    item_digest,
    job_signed_body,
)

if TYPE_CHECKING:
    from atoll.pki.kit import Kit

log = logging.getLogger("atoll.server.provenance")

ITEMS_FILE = "provenance.jsonl"
RECORD_FILE = "provenance.json"
MAX_SITE_ITEMS = 16  # per job: a site states a few things (two, today)
MAX_ITEM_BYTES = 64 * 1024
FINAL_MODEL = "global_model_final.safetensors"
METRICS = "metrics.jsonl"
ROUND_DIGESTS = "model_digests.jsonl"
RESULTS = "run/server/results"
MAX_ROUNDS = 100_000  # round.model entries per job
ROUND_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_CACHED = 1000  # chains kept in memory


@dataclass
class _Rounds:
    """A job's round.model entries: each round's last stated digest, and how many in all (a
    round stated again with another digest counts again: job code cannot flip one forever)."""

    digests: dict[int, str] = field(default_factory=dict)
    entries: int = 0


class ServerProvenance:
    def __init__(self, kit: Kit, jobs_dir: Path, version: str):
        self.kit, self.jobs_dir, self.version = kit, jobs_dir, version
        self._lock = threading.Lock()  # one chain per job; appends are rare and small
        self._chains: dict[str, Chain] = {}  # the running jobs', read once from their files
        self._rounds: dict[str, _Rounds] = {}  # their round.model entries

    # -- what happens to a job ------------------------------------------------------------------
    def taken_in(self, job_id: str, study: str, submitter: str, digest: str) -> None:
        """The signed job as the server took it in, and its intake decision."""
        bundle = (self._folder(job_id) / "job" / ".atoll-signature.json").read_bytes()
        self._state(job_id, "job.signed", job_signed_body(bundle))
        self._state(job_id, "server.intake", {
            "decision": "accepted", "study": study, "submitted_by": submitter,
            "content_digest": digest, "atoll_version": self.version})

    def site_items(self, job_id: str, site: str, body: dict[str, Any]) -> None:
        """A site's signed entries from its state report, appended verbatim; one that would
        not verify, or in another's name, is logged and left out (the record then lacks it:
        the site's own log still has the decision)."""
        items, cert = body.get("provenance"), body.get("certificate")
        if not isinstance(items, list) or not isinstance(cert, str):
            return
        for item in items[:MAX_SITE_ITEMS]:
            try:
                if not isinstance(item, dict) or len(json.dumps(item)) > MAX_ITEM_BYTES:
                    raise ProvenanceError("an entry that is not a small JSON object")
                doc = json.loads(str(item.get("entry")))
                if not isinstance(doc, dict) or doc.get("by") != {"kind": "site", "name": site}:
                    raise ProvenanceError(f"an entry not in {site}'s own name")
                with self._lock:
                    chain = self._load(job_id)
                    if sum(f'"name":"{site}"' in e["entry"] for e in chain.entries) \
                            >= MAX_SITE_ITEMS:
                        raise ProvenanceError(f"{site} stated {MAX_SITE_ITEMS} entries already")
                    statement = self._statement(chain)
                    check_site_item(item, cert.encode("ascii"), self.kit.ca.read_bytes(), site,
                                    job_id, statement, chain.next_seq, chain.head_digest)
                    self._append(job_id, chain.append_signed(
                        item, cert.encode("ascii"), statement), cert)
            except (ProvenanceError, ValueError, UnicodeEncodeError, OSError) as exc:
                self._forget(job_id)  # read again from its file, which has what was kept
                log.warning("job %s: a provenance entry of %s was left out: %s", job_id, site,
                            exc)

    def round_model(self, job_id: str, round_: Any, digest: Any) -> None:
        """A round's global model digest, as the server worker's round report states it (job
        code: checked for shape only); stated once per round and digest."""
        if not _round_and_digest(round_, digest):
            log.warning("job %s: a round report named no round and model digest the record "
                        "can hold; its round.model entry was not made", job_id)
            return
        self._state(job_id, "round.model", {"round": round_, "digest": digest,
                                            "stated_by": "the server worker"},
                    unless_round=(round_, digest))

    def finished(self, job_id: str, state: str, reason: str) -> None:
        """The round models the workflow named and no round report stated, the final model's
        and the metrics' digests and the DP epsilon spent, from the server worker's results."""
        folder = self._folder(job_id)  # job code wrote its results: read as the job's files
        for line in _parsed(_job_bytes(folder, ROUND_DIGESTS, 4 << 20))[:MAX_ROUNDS]:
            if _round_and_digest(line.get("round"), line.get("digest")):
                self.round_model(job_id, line["round"], line["digest"])
        body: dict[str, Any] = {"state": state, "reason": reason[:2000]}
        for key, name in (("model_digest", FINAL_MODEL), ("metrics_digest", METRICS)):
            digest = _job_file_digest(folder, name)
            if digest is not None:
                body[key], body[key.replace("digest", "file")] = digest, name
        epsilon = _epsilon(_job_bytes(folder, "summary.json", 4 << 20))
        if epsilon is not None:
            body["dp_epsilon"] = epsilon
        self._state(job_id, "job.final", body, sync=True)
        with self._lock:
            self._chains.pop(job_id, None)  # its file has it all: an export reads it again
            self._rounds.pop(job_id, None)

    def export(self, job_id: str) -> bytes:
        """The record, its head signed now."""
        with self._lock:
            chain = self._chains.get(job_id) or self._read(job_id)
            if not chain.entries:
                raise ProvenanceError(f"job {job_id} has no provenance record (it was taken in "
                                      "before this server kept them)")
            record = chain.record(self.kit.key.read_bytes(), self.kit.cert.read_bytes(),
                                  int(time.time()))
        return json.dumps(record, indent=1).encode()

    def write_record(self, job_id: str, out: Path) -> bool:
        try:
            out.write_bytes(self.export(job_id))
        except (ProvenanceError, OSError) as exc:
            log.warning("job %s: its provenance record was not written: %s", job_id, exc)
            return False
        return True

    # -- the chain ------------------------------------------------------------------------------
    def _state(self, job_id: str, kind: str, body: dict[str, Any], sync: bool = False,
               unless_round: tuple[int, str] | None = None) -> None:
        try:
            with self._lock:
                chain = self._load(job_id)
                if unless_round is not None:
                    rounds = self._rounds_of(job_id, chain)
                    if (rounds.digests.get(unless_round[0]) == unless_round[1]
                            or rounds.entries >= MAX_ROUNDS):
                        return
                    rounds.digests[unless_round[0]] = unless_round[1]
                    rounds.entries += 1
                cert = self.kit.cert.read_bytes()
                item = chain.append(kind, ("server", self.kit.name), body,
                                    self.kit.key.read_bytes(), cert, int(time.time()))
                self._append(job_id, item, cert.decode("ascii"), sync)
        except (ProvenanceError, OSError, ValueError) as exc:  # the job goes on; say why
            self._forget(job_id)
            log.error("job %s: its provenance entry %s was not kept: %s", job_id, kind, exc)

    def _folder(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def _load(self, job_id: str) -> Chain:
        chain = self._chains.get(job_id)
        if chain is None:
            if len(self._chains) >= MAX_CACHED:  # jobs cancelled in the queue never finish
                self._chains.clear()
                self._rounds.clear()
            chain = self._chains[job_id] = self._read(job_id)
        return chain

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._chains.pop(job_id, None)
            self._rounds.pop(job_id, None)

    def _rounds_of(self, job_id: str, chain: Chain) -> _Rounds:
        """The chain's round.model entries, read once per chain loaded."""
        rounds = self._rounds.get(job_id)
        if rounds is None:
            rounds = self._rounds[job_id] = _Rounds()
            for item in chain.entries:
                if '"kind":"round.model"' in item["entry"]:
                    body = json.loads(item["entry"])["body"]
                    rounds.digests[body["round"]] = body["digest"]
                    rounds.entries += 1
        return rounds

    def _read(self, job_id: str) -> Chain:
        chain = Chain(self.kit.project, job_id)
        for line in _lines(self._folder(job_id) / ITEMS_FILE):
            chain.certificates.setdefault(line["signer_fp"], line["certificate"])
            chain.entries.append(line["item"])
            chain.head_digest = item_digest(line["item"])
        return chain

    @staticmethod
    def _statement(chain: Chain) -> str:
        if not chain.entries:
            raise ProvenanceError("the job's record has no signed job entry yet")
        return str(json.loads(chain.entries[0]["entry"])["body"]["statement_digest"])

    def _append(self, job_id: str, item: dict[str, Any], cert: str, sync: bool = False) -> None:
        line = json.dumps({"item": item, "signer_fp": item["signer"], "certificate": cert},
                          sort_keys=True).encode() + b"\n"
        fd = os.open(self._folder(job_id) / ITEMS_FILE,
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE)
        try:
            os.write(fd, line)
            if sync:  # once per job, at its end: an fsync per entry cost 5-10 ms each
                os.fsync(fd)
        finally:
            os.close(fd)


def _round_and_digest(round_: Any, digest: Any) -> bool:
    return (isinstance(round_, int) and not isinstance(round_, bool)
            and 1 <= round_ <= MAX_ROUNDS
            and isinstance(digest, str) and ROUND_DIGEST.fullmatch(digest) is not None)


def _lines(path: Path) -> list[dict[str, Any]]:
    """The kept items; a last line a crash tore (no newline) is cut off the file, so that the
    next entry starts a line of its own rather than joining it, unreadable."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "r+b") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
            fh.truncate(len(data))
            log.warning("%s: a line torn by a crash was cut off; the chain goes on from the "
                        "last whole entry", path)
    return _parsed(data)


def _job_bytes(folder: Path, name: str, limit: int) -> bytes:
    """A results file, read as the job's file (no link followed); b"" when it is not there."""
    from atoll.launchers.job_files import JobFileError, read_job_file

    try:
        return read_job_file(folder, f"{RESULTS}/{name}", limit)
    except (OSError, JobFileError):
        return b""


def _job_file_digest(folder: Path, name: str) -> str | None:
    from atoll.base.sha256 import sha256_for
    from atoll.launchers.job_files import JobFileError, open_job_file

    try:
        with open_job_file(folder, f"{RESULTS}/{name}", max_bytes=None) as handle:
            h = sha256_for(os.fstat(handle.fileno()).st_size)
            while chunk := handle.read(1 << 20):
                h.update(chunk)
    except (OSError, JobFileError):
        return None
    return "sha256:" + h.hexdigest()


def _parsed(data: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in data.splitlines():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _epsilon(summary: bytes) -> float | None:
    try:
        value = json.loads(summary).get("privacy", {}).get("epsilon")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
