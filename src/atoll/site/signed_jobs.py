"""The site's record of the signed jobs it has run: each signed statement under one job id.

The job id a site receives is the server's, not part of what the submitter signed: a hostile
server could send a job it once dispatched again under a new id (a new run folder, a new
result, a second pass over the site's data) with the submitter's valid signature. So the site
binds each signed statement (its digest, pki/job_signature.py: the nonce makes every signing a
statement of its own) to the first job id it ran it under, and refuses it under any other id.
The same job under its own id again (a resume, a reconnect's re-dispatch) is accepted; a
submitter who wants a re-run submits the folder again, which signs a new statement.

The record is ``<workspace>/signed_jobs.json`` (0600, written whole to a temporary file and
renamed over the old one: a crash leaves the old record or the new one, never half of one), so
it survives restarts of the site parent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from atoll.base.files import PRIVATE
from atoll.spec.errors import EXIT_INVALID, AtollError

RECORD_FILE = "signed_jobs.json"
FORMAT = "atoll-signed-jobs/1"


class Replayed(AtollError):
    """The signed statement already ran here under another job id."""

    exit_code = EXIT_INVALID


class SignedJobs:
    def __init__(self, workspace: Path):
        self.path = Path(workspace) / RECORD_FILE
        self._lock = threading.Lock()

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # never run a job we cannot tell is a replay
            raise Replayed(f"the site's record of the jobs it ran ({RECORD_FILE} in its "
                           f"workspace) cannot be read ({exc}); the site operator must repair "
                           "or remove it") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(
                doc.get("jobs"), dict):
            raise Replayed(f"the site's record of the jobs it ran ({RECORD_FILE}) is not in the "
                           f"format {FORMAT}; the site operator must repair or remove it")
        return doc["jobs"]

    def _write(self, jobs: dict[str, dict[str, object]]) -> None:
        tmp = self.path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"format": FORMAT, "jobs": jobs}, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def claim(self, statement_digest: str, job_id: str, site: str, submitter: str) -> None:
        """Record that ``job_id`` runs the signed statement; Replayed when it ran under another
        id. Call it only once the job passed every other check."""
        if not statement_digest:
            raise Replayed(f"{site} refused the job: its signature check named no statement")
        with self._lock:
            jobs = self._read()
            known = jobs.get(statement_digest)
            if known is not None and known.get("job_id") != job_id:
                raise Replayed(
                    f"{site} refused the job: the statement {submitter} signed already ran "
                    f"here as job {known.get('job_id')} (a replay under the new id {job_id}); "
                    "nothing of it ran here. To run the job again, the submitter submits the "
                    "job folder again, which signs it anew")
            if known is None:
                jobs[statement_digest] = {"job_id": job_id, "submitter": submitter,
                                          "first_run": int(time.time())}
                self._write(jobs)

    def job_of(self, statement_digest: str) -> str | None:
        with self._lock:
            known = self._read().get(statement_digest)
        return None if known is None else str(known.get("job_id"))
