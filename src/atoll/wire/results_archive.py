"""A worker's results sent home to its parent, for workers whose run folder is not the parent's.

A Kubernetes Pod runs in an ``emptyDir`` (the parent's folder is not shared with it): what its
code writes into ``results/`` would go with the Pod. Such a worker is told so by its launcher
(``ATOLL_RESULTS_HOME=send``, launchers/request.py) and, when its work is over, zips its ``results/`` and streams it
to its parent over the worker link (``WorkerLink.SendResults``), before its Finish report. The
parent unpacks it into the job's run folder, where `atoll job download` (server) and the site's
own files find it, exactly as if the worker had written there.

The zip is job code's output, so the parent takes it as it takes a job upload
(wire/job_archive.py): bounded in bytes and entries, no absolute or climbing names, no links,
nothing written outside ``results/``; a file the parent already holds there is not replaced.
The worker sends plain files only and lists what it left out (links, devices) in the zip's
``skipped-by-worker.txt``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from atoll.wire.job_archive import Incoming, IntakeError, add_file

RESULTS = "results"
MAX_RESULTS_BYTES = 64 << 30  # a model of tens of GB is a result too; the disk is the parent's
SKIPPED = "skipped-by-worker.txt"


def zip_results(folder: Path, out: Path) -> Path:
    """Zip the plain files under ``folder`` (links and special files are listed, not sent)."""
    import zipfile

    skipped: list[str] = []
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for root, dirs, files in os.walk(folder):  # never follows a linked folder
            for name in sorted(dirs):
                if os.path.islink(os.path.join(root, name)):
                    skipped.append(os.path.relpath(os.path.join(root, name), folder))
            for name in sorted(files):
                path = Path(root, name)
                rel = path.relative_to(folder).as_posix()
                if stat.S_ISREG(os.lstat(path).st_mode):
                    add_file(archive, path, rel)
                else:
                    skipped.append(rel)
        if skipped:
            archive.writestr(SKIPPED, "".join(f"{name}: not a plain file\n" for name in skipped))
    return out


def unpack_results(chunks: Iterable[bytes], run_folder: Path,
                   max_bytes: int = MAX_RESULTS_BYTES) -> dict[str, int]:
    """Unpack a worker's results zip into ``run_folder/results``; files already there stay.

    IntakeError (with the reason) for a zip that is too large, damaged or names a path that
    leaves the folder; then nothing of it is kept.
    """
    scratch = run_folder / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    destination = run_folder / RESULTS
    _private_dir(destination)
    files = size = 0
    with Incoming(scratch) as incoming:
        incoming.receive(chunks, max_bytes)
        tree = incoming.extract(max_bytes)
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree)
            target = destination / rel
            if path.is_dir():
                _private_dir(target)
                continue
            _private_dir(target.parent)
            if target.exists() or target.is_symlink():
                continue  # the parent's own file wins
            size += path.stat().st_size
            os.rename(path, target)
            files += 1
    return {"files": files, "bytes": size}


def _private_dir(path: Path) -> None:
    if path.is_symlink():
        raise IntakeError(f"{path} is a link; the results are not unpacked through it")
    path.mkdir(parents=True, exist_ok=True)
