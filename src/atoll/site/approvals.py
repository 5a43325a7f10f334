"""The jobs a site operator approved after reviewing their code: ``local/approved_jobs.json``.

A site whose ``authorization.json`` sets ``code_approval: required`` runs a job only when its
content digest (pki/job_signature.py: every file of the job and meta.json) is listed here.
``atoll site approve SITE_DIR JOB_DIR`` adds the digest of the folder the operator reviewed;
removing an entry (by editing the file) withdraws the approval for jobs not yet launched.

    {"format_version": 1,
     "approved": {"sha256:<hex>": {"name": "fedavg", "approved_at": "2025-01-31T10:00:00Z"}}}
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from atoll.base.files import PUBLIC, write_atomic
from atoll.spec.errors import EXIT_INVALID, AtollError

APPROVALS_FILE = "approved_jobs.json"
MAX_BYTES = 16 * 1024 * 1024


class ApprovalsError(AtollError, ValueError):
    """The approvals file cannot be read; the message names it and what to do."""

    exit_code = EXIT_INVALID


def read_approvals(local_dir: Path) -> dict[str, dict[str, Any]]:
    """digest -> what was recorded with it; empty when nothing was approved yet."""
    path = Path(local_dir) / APPROVALS_FILE
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ApprovalsError(f"local/{APPROVALS_FILE} cannot be read: {exc.strerror}") from None
    try:
        doc = json.loads(raw)
        approved = doc["approved"]
        if len(raw) > MAX_BYTES or doc.get("format_version") != 1 or not isinstance(
                approved, dict):
            raise ValueError("expected {\"format_version\": 1, \"approved\": {DIGEST: {...}}}")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ApprovalsError(f"local/{APPROVALS_FILE} is damaged ({exc}); fix it or remove it "
                             "and approve the jobs again") from None
    return {str(k): v if isinstance(v, dict) else {} for k, v in approved.items()}


def is_approved(local_dir: Path, digest: str) -> bool:
    return digest in read_approvals(local_dir)


def approve(local_dir: Path, digest: str, name: str) -> bool:
    """Record ``digest``; False when it was approved already."""
    approved = read_approvals(local_dir)
    if digest in approved:
        return False
    approved[digest] = {"name": name,
                        "approved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps({"format_version": 1, "approved": approved}, indent=2) + "\n"
    write_atomic(Path(local_dir) / APPROVALS_FILE, text, PUBLIC)
    return True
