"""A copy of the server's state, taken while it runs, and putting it back into a kit.

What the server must not lose lives in its workspace (docs/operations.md, Backup and restore):
the job store `atoll.db` (SQLite in WAL mode: copied with SQLite's online backup API, so a copy
taken while the server writes is consistent and holds what the -wal file had not yet folded
in), `session.key` (the login sessions it signed stay valid), `crl.pem` (the revocation list it
enforces), `.seeded` (the project's studies are not seeded over again) and `jobs/` (each job's
folder, payloads and results). The kit itself (certificate, key, CA certificate) is static
since provisioning and the CA is the project admin's: both are kept as plain folder copies.

Job folders hold what job code wrote (the server worker's run folder), so they are copied as
hostile: regular files only, each opened without following a link; links, FIFOs and devices are
skipped and counted, never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from atoll import __version__
from atoll.base.files import PRIVATE, private_dir, write_atomic
from atoll.spec.errors import EXIT_INVALID, AtollError

DB = "atoll.db"
KEY_FILES = ("session.key", "crl.pem", ".seeded")  # copied when present
JOBS = "jobs"
MANIFEST = "backup.json"
FORMAT = 1


class BackupError(AtollError):
    """A backup could not be taken or restored; the message says what to change."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Copied:
    folder: Path
    files: int
    bytes: int
    skipped: int  # links and special files in job folders, not copied

    def summary(self) -> dict[str, object]:
        return {"folder": str(self.folder), "files": self.files, "bytes": self.bytes,
                "skipped": self.skipped}


def backup(workspace: Path, out: Path) -> Copied:
    """Copy the server state of ``workspace`` into the new folder ``out`` (0700)."""
    db = workspace / DB
    if not db.is_file():
        raise BackupError(f"{db} does not exist: is {workspace.parent} a server kit that "
                          "has run?")
    try:
        out.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        raise BackupError(f"{out} exists already; name a new folder") from None
    _copy_db(db, out / DB)
    files, size = 1, (out / DB).stat().st_size
    for name in KEY_FILES:
        if (workspace / name).is_file():
            size += _copy_file(workspace / name, out / name)
            files += 1
    tree = _copy_tree(workspace / JOBS, out / JOBS)
    manifest = {"format": FORMAT, "atoll": __version__, "created": time.time(),
                "files": files + tree.files, "bytes": size + tree.bytes}
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n", PRIVATE)
    return Copied(out, files + tree.files, size + tree.bytes, tree.skipped)


def restore(source: Path, workspace: Path) -> Copied:
    """Put the backup ``source`` into ``workspace``, which must hold no job store yet (a fresh
    kit, or one whose workspace was moved aside); the server must not be running."""
    manifest = _manifest(source)
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{source / MANIFEST}: format {manifest.get('format')!r}; this atoll "
                          f"({__version__}) restores format {FORMAT}")
    if (workspace / DB).exists():
        raise BackupError(f"{workspace / DB} exists: this server has state of its own; move "
                          f"{workspace} aside (or restore into a fresh copy of the kit)")
    _check_db(source / DB)
    private_dir(workspace)
    _copy_db(source / DB, workspace / DB)
    files, size = 1, (workspace / DB).stat().st_size
    for name in KEY_FILES:
        if (source / name).is_file():
            size += _copy_file(source / name, workspace / name)
            files += 1
    tree = _copy_tree(source / JOBS, workspace / JOBS)
    return Copied(workspace, files + tree.files, size + tree.bytes, tree.skipped)


def _manifest(source: Path) -> dict:
    try:
        return json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{source} is not a backup of `atoll server backup` (no "
                          f"{MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source / MANIFEST}: {exc}") from None


def _check_db(path: Path) -> None:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            result = db.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.Error as exc:
        raise BackupError(f"{path}: not a readable job store ({exc})") from None
    if result != "ok":
        raise BackupError(f"{path}: the job store fails SQLite's integrity check: {result}")


def _copy_db(source: Path, dest: Path) -> None:
    """SQLite's online backup: pages copied under a read transaction, consistent while the
    server keeps writing; the copy is one file, with no -wal beside it."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(str(source))) as src, \
                contextlib.closing(sqlite3.connect(str(dest))) as dst:
            src.backup(dst)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot copy {source}: {exc}") from None


def _copy_file(source: Path, dest: Path) -> int:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BackupError(f"{source} is not a regular file")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
        size = 0
        try:
            while chunk := os.read(fd, 1 << 20):
                os.write(out, chunk)
                size += len(chunk)
        finally:
            os.close(out)
        return size
    finally:
        os.close(fd)


def _copy_tree(source: Path, dest: Path) -> Copied:
    files = size = skipped = 0
    if not source.is_dir():
        return Copied(dest, 0, 0, 0)
    for root, dirs, names in os.walk(source, followlinks=False):
        here = Path(root)
        target = private_dir(dest / here.relative_to(source))
        for name in list(dirs):
            if (here / name).is_symlink():
                dirs.remove(name)
                skipped += 1
        for name in names:
            mode = os.lstat(here / name).st_mode
            if not stat.S_ISREG(mode):
                skipped += 1
                continue
            try:
                size += _copy_file(here / name, target / name)
            except (BackupError, FileNotFoundError):  # replaced or removed while copying
                skipped += 1
                continue
            files += 1
    return Copied(dest, files, size, skipped)
