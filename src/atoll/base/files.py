"""Atomic file writes (a reader sees the old file or the whole new one, never a part), and the
private folders and files of a parent's workspace: modes set explicitly, never left to the umask."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE = 0o600
PUBLIC = 0o644


def write_atomic(path: Path, data: bytes | str, mode: int = PUBLIC) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    The temporary file is created with ``mode`` already set, so a private key is never
    readable by others, not even for a moment.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover of a crash may carry a wider mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # O_CREAT's mode is filtered by the umask; PUBLIC must stay public
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def private_dir(path: Path) -> Path:
    """Make ``path`` a folder only its owner can enter: 0700 whatever the umask, and also when
    it already existed with a wider mode (a workspace from before). Folders it has to create on
    the way are made 0700 as well; those that exist are left as they are."""
    path = Path(path)
    missing = [path]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def make_private(path: Path) -> None:
    """Set an existing file to 0600 (a file some library created under the umask)."""
    os.chmod(path, PRIVATE)


def append_private(path: Path) -> int:
    """A descriptor appending to ``path``, created 0600 if missing and set to 0600 if not (a
    parent's log); the caller closes it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE)
    os.fchmod(fd, PRIVATE)
    return fd
