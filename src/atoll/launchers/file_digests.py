"""The SHA-256 of an image file the site configured (an Apptainer SIF, an enroot squashfs), for
the site's provenance entry: read once per version of the file (its inode, size and mtime), since
images are large and every job of a study launches the same one."""

from __future__ import annotations

import os
import stat
import threading

from atoll.base.sha256 import sha256_for

CHUNK = 4 << 20
MAX_KEPT = 64  # files remembered; a site configures a few images


class FileDigests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, int, int, int, int], str] = {}

    def digest(self, path: str) -> str | None:
        """``sha256:<hex>`` of the regular file at path (links followed: a site's own
        configuration names it); None where it is not one, or cannot be read."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                if key in self._known:
                    return self._known[key]
            h = sha256_for(st.st_size)
            with os.fdopen(os.dup(fd), "rb") as handle:
                while chunk := handle.read(CHUNK):
                    h.update(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        with self._lock:
            if len(self._known) >= MAX_KEPT:
                self._known.clear()
            self._known[key] = digest = "sha256:" + h.hexdigest()
        return digest
