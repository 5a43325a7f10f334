"""Whether the user who signed a stored job is revoked, asked at every stage on the server.

Intake refuses a job signed with a revoked certificate (server/job_signing.py), but a job
may wait in the queue, or run, when its signer is revoked later. So the server asks again,
with the list it holds then: when a newer list arrives (every waiting job of a revoked signer
is cancelled, every running one aborted), when the scheduler dispatches a job, and just before
it launches the job's server worker. The signer is read from the job's own signature in its
folder (the certificate the submitter signed with, checked at intake), never from the job
store's word: a store edited to put a job back in the queue does not change who signed it.

The server worker checks the signature and the list once more itself, before any of the job's
code runs (worker/signed_job.py); each site checks with the list it holds (site/job_acceptance.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.pki.revocation import RevocationList, cert_serial

MAX_SIGNATURE_BYTES = 16 * 1024 * 1024  # pki/job_signature.py's MAX_BUNDLE_BYTES


def signature_of(job_tree: Path) -> bytes:
    """The signature file of a stored job (its folder's ``job/``); OSError when it is gone."""
    with open(job_tree / SIGNATURE_FILE, "rb") as fh:
        return fh.read(MAX_SIGNATURE_BYTES + 1)


def revoked_signer(job_tree: Path, held: RevocationList) -> str | None:
    """Why the job in ``job_tree`` may not run on ``held``'s account, or None.

    A job whose signature cannot be read is refused too: intake kept it with the job, so the
    store or the folder was changed since."""
    try:
        pem = json.loads(signature_of(job_tree))["certificate"]
        serial = cert_serial(pem)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = exc.strerror if isinstance(exc, OSError) else "it is malformed"
        return (f"the job's signature in the server's store cannot be read ({what}); the job "
                "was changed after intake and will not run; submit it again")
    entry = held.entries.get(serial)
    if entry is None:
        return None
    return (f"the submitter's certificate was revoked ({entry.describe()}; revocation list "
            f"{held.number})")
