"""The site's own log of every job it ran or refused, kept by the site whatever the server says.

One JSON line per decision in ``<workspace>/jobs.log`` (0600, opened for appending only, so
it survives restarts of the parent; a machine crash may lose the last lines, which the chain
then simply lacks)::

    {"at": UNIX_SECONDS, "job_id": ID, "study": S, "decision": "launched"|"refused"|
     "finished:COMPLETED"|..., "submitter": NAME, "job_digest": sha256:..,
     "statement_digest": sha256:.., "reason": TEXT, "prev": sha256:<hex of the line before>}

``submitter`` and the digests are the signed job's (what the site verified itself); a job
refused before its signature was checked has them empty, and ``server_submitter`` says whom
the server named. ``prev`` chains the lines: a line edited, removed or inserted later shows as
a broken link when the log is read (``atoll site jobs KIT``). The chain shows tampering by
whoever can write the file but cannot prevent it: it is the site's own record, kept on the
site's disk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import PRIVATE

if TYPE_CHECKING:
    from atoll.pki.job_signature import Signed

LOG_FILE = "jobs.log"
MAX_ID = 256  # characters of a job id or study kept in a line (valid ones are far shorter)
log = logging.getLogger("atoll.site.job_log")


def _digest(line: bytes) -> str:
    return "sha256:" + hashlib.sha256(line).hexdigest()


@dataclass(frozen=True)
class LogRead:
    lines: list[dict[str, Any]]
    broken: int | None  # the first line (0-based) whose prev is not the line before it


class JobLog:
    def __init__(self, workspace: Path):
        self.path = Path(workspace) / LOG_FILE
        self._lock = threading.Lock()
        self._last: str | None = None  # the digest of the last line, read once

    def record(self, job_id: str, study: str, decision: str, signed: Signed | None = None,
               reason: str = "", server_submitter: str = "") -> None:
        """Append one decision. Never raises: a disk error is logged, and must not turn a
        refusal into a crash or stop a job already checked."""
        line: dict[str, Any] = {
            # the ids as the server sent them, bounded: a refused one may be anything it chose
            "at": int(time.time()), "job_id": str(job_id)[:MAX_ID], "study": str(study)[:MAX_ID],
            "decision": decision,
            "submitter": signed.signer.name if signed else "",
            "job_digest": signed.digest if signed else "",
            "statement_digest": signed.statement_digest if signed else "",
            "reason": reason[:2000]}
        if server_submitter and not signed:
            line["server_submitter"] = str(server_submitter)[:MAX_ID]
        try:
            self._append(line)
        except OSError as exc:
            log.error("job %s: the site's job log %s cannot be written: %s", job_id, self.path,
                      exc)

    def _append(self, line: dict[str, Any]) -> None:
        with self._lock:
            if self._last is None:
                lines = read_log(self.path).lines
                self._last = lines[-1]["_digest"] if lines else ""
            line["prev"] = self._last
            data = json.dumps(line, sort_keys=True, ensure_ascii=True).encode() + b"\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                         PRIVATE)
            try:
                os.write(fd, data)  # no fsync: 5-10 ms on the launch path; see the top
            finally:
                os.close(fd)
            self._last = _digest(data.rstrip(b"\n"))


def read_log(path: Path) -> LogRead:
    """The log's lines, each with its ``_digest``, and where its chain first breaks."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return LogRead([], None)
    lines, broken, prev = [], None, ""
    for n, raw in enumerate(data.splitlines()):
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError
        except ValueError:
            doc = {"decision": "unreadable", "reason": f"line {n + 1} is not a log line"}
        if broken is None and doc.get("prev") != prev:
            broken = n
        prev = _digest(raw)
        doc["_digest"] = prev
        lines.append(doc)
    return LogRead(lines, broken)
