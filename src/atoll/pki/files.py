"""Atomic file writes: a reader sees the old file or the whole new one, never a part."""

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
