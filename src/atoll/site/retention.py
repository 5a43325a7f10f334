"""Run folders a site removes by itself: those of jobs that finished more than
``retention.run_folders_days`` ago (local/site.yaml; docs/operations.md, Cleaning up).

A run folder is written by job code, so it is judged and removed as hostile: only entries of the
jobs folder whose names are job ids, never a running job's, aged by the newest of the folder,
its ``logs/`` and the files in ``logs/`` (lstat: a planted link changes nothing), and removed
with ``shutil.rmtree``, which on Linux never follows a link out of the folder. The app zip kept
for workers that cannot see the folder (``workspace/apps/<job id>.zip``) goes with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from atoll.spec.names import IdentifierError, check_job_id

log = logging.getLogger("atoll.site.retention")

SWEEP_EVERY_S = 3600.0


def last_written(folder: Path) -> float:
    """When the job last wrote its run folder, as far as its top and its logs tell."""
    newest = os.lstat(folder).st_mtime
    logs = folder / "logs"
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(logs).st_mode):
            newest = max(newest, os.lstat(logs).st_mtime)
            with os.scandir(logs) as entries:
                for entry in entries:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def expired(jobs_dir: Path, days: float, running: Iterable[str],
            now: float | None = None) -> list[Path]:
    """The run folders under ``jobs_dir`` older than ``days``, running jobs' excluded."""
    cutoff = (time.time() if now is None else now) - days * 86400
    keep = set(running)
    found = []
    try:
        entries = sorted(os.scandir(jobs_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            check_job_id(entry.name)
        except IdentifierError:
            continue  # not a run folder of ours: not ours to remove
        if entry.name in keep or not entry.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(OSError):
            if last_written(Path(entry.path)) < cutoff:
                found.append(Path(entry.path))
    return found


def remove_run_folder(folder: Path, apps_dir: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    (apps_dir / f"{folder.name}.zip").unlink(missing_ok=True)


def sweep(jobs_dir: Path, apps_dir: Path, days: float, running: Iterable[str]) -> list[str]:
    """Remove the expired run folders; the job ids removed."""
    gone = []
    for folder in expired(jobs_dir, days, running):
        remove_run_folder(folder, apps_dir)
        gone.append(folder.name)
    if gone:
        log.info("removed the run folders of %d job(s) finished more than %g days ago: %s",
                 len(gone), days, ", ".join(gone))
    return gone


def start_sweeper(jobs_dir: Path, apps_dir: Path, days: float | None,
                  running: Callable[[], list[str]], stopped: threading.Event) -> None:
    """At start and every hour until ``stopped``; nothing when no retention is set."""
    if days is None:
        return

    def loop() -> None:
        while not stopped.is_set():
            try:
                sweep(jobs_dir, apps_dir, days, running())
            except Exception:  # noqa: BLE001 - a failed sweep must not stop the parent
                log.exception("could not remove expired run folders under %s", jobs_dir)
            stopped.wait(SWEEP_EVERY_S)

    threading.Thread(target=loop, name="retention", daemon=True).start()
