"""The zip an admin downloads: a job's results and logs, read as the job's files.

The server worker runs job code (the workflow's initial_model, say) that writes its own run
folder, results included. So every file is read through launchers/job_files.py: a link there (to
the server's key, to /proc/<server>/environ, to `/`), a hard link, a FIFO is not followed but
skipped, and ``skipped.txt`` in the zip says which and why. zipfile is imported by the caller's
first download, not by a parent at rest.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import time
import zipfile
from pathlib import Path
from typing import Any

from atoll.launchers.job_files import JobFileError, iter_job_files
from atoll.wire.job_archive import STORE_FROM_BYTES

SKIPPED = "skipped.txt"


def write_results_zip(folder: Path, out: Path, summary: dict[str, Any],
                      extra: dict[str, bytes] | None = None) -> Path:
    """``out``: the job's results, the sites' log tails and the server worker's logs, plus
    job.json (``summary``) and the server's own ``extra`` files (provenance.json).
    ``folder`` is the job's folder on the server."""
    # run/server is the server worker's run folder; walked from the job's folder, so that not
    # even `run` or `server` is followed if it were a link.
    sources = [("run/server/results", "results"), ("logs", "logs"),
               ("run/server/logs", "logs/server")]
    skipped: list[str] = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for rel, prefix in sources:
            try:
                for name, handle in iter_job_files(folder, rel, skipped):
                    _add(archive, handle, f"{prefix}/{name}")
            except JobFileError as exc:  # the folder itself is a link, or holds too much
                skipped.append(str(exc))
        archive.writestr("job.json", json.dumps(summary, indent=2))
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
        if skipped:
            note = "Not in this download (the server never follows what a job left there):\n"
            archive.writestr(SKIPPED, note + "".join(f"- {line}\n" for line in skipped))
    return out


def _add(archive: zipfile.ZipFile, handle: io.FileIO, name: str) -> None:
    """Copy an open file in; large ones (models, mostly incompressible) are stored, not
    deflated, which would cost seconds of CPU per GB for almost nothing."""
    info = os.fstat(handle.fileno())
    entry = zipfile.ZipInfo(name, time.localtime(max(info.st_mtime, 315532800))[:6])
    entry.external_attr = (stat.S_IFREG | 0o600) << 16
    entry.compress_type = zipfile.ZIP_STORED if info.st_size >= STORE_FROM_BYTES \
        else zipfile.ZIP_DEFLATED
    with archive.open(entry, "w", force_zip64=True) as dst:
        shutil.copyfileobj(handle, dst, 1 << 20)
