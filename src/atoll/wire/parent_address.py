"""Where a site worker finds its restarted parent: a file in the job's run folder, which the
parent that took the worker back writes (site/app.py) and the worker reads while it waits
(worker/rejoin.py). A Slurm-hosted site parent's successor may run on another node, with an
endpoint certificate of its own: its workers read both here. Nothing secret is in it (an
address and a certificate); the worker still proves itself with its job's token.

The run folder is the job's to write: the parent writes through a new file of its own, made
with O_EXCL | O_NOFOLLOW and renamed into place (a link planted there is replaced, never
followed), and the worker takes what it reads as no more than the job's own word (the job's
code could make its worker dial elsewhere: it would hand that place its own job's token only).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

FILE_NAME = ".atoll-parent.json"
MAX_BYTES = 64 * 1024


def tell_parent(run_folder: Path, address: str, cert_pem: str | None) -> None:
    """Write this parent's worker endpoint into the job's run folder, for its worker."""
    body = json.dumps({"address": address, "cert": cert_pem or ""}).encode()
    tmp = run_folder / f".{FILE_NAME}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)  # the worker's uid may not be the parent's
        os.write(fd, body)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, run_folder / FILE_NAME)


def read_parent(run_folder: Path) -> tuple[str, str | None] | None:
    """(address, certificate or None) a restarted parent left for this worker, or None."""
    try:
        with open(run_folder / FILE_NAME, "rb") as fh:
            doc = json.loads(fh.read(MAX_BYTES))
        address, cert = doc["address"], doc.get("cert") or None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(address, str) or not address or not (cert is None or isinstance(cert, str)):
        return None
    return address, cert
