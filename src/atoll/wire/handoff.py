"""Replies handed from the server parent to its server worker as files, when both see one folder.

A site's reply is complete in the server parent's spool (a file) before the workflow may read
it. Streamed to the workflow over the worker link, every GiB then costs the parent and the
worker about 1.5 CPU-s more (gRPC's copies and the loopback socket) at the moment the workflow
folds the round's results in, which it does alone. When the server worker runs on the parent's
host (the process launcher: `Launcher.shares_host`), the parent writes each reply into the job's
*handoff folder* instead and gives the workflow only its header, naming the file; the worker
reads the frames from the file (page cache) and the name leaves the folder as it is opened. The
file holds the data frames exactly as they came off the wire (wire/frames.py), and each is
checked again as it is read.

The worker opens only plain names inside the folder its parent offered, never through a symlink.
Files the parent makes are new (O_EXCL), so nothing placed in the folder beforehand is written to.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from atoll.wire import frames

KEY = "handoff"  # the header field naming the file that holds a payload's data frames
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_HEAD_MAX = 11  # tag + the longest varint a frame's length may take


class HandoffError(frames.FrameError):
    """A handoff file that is missing, misnamed, not a plain file, or not whole frames."""


class HandoffDir:
    """One job's handoff folder, as its parent (create=True) or its worker sees it."""

    def __init__(self, path: Path, create: bool = False):
        self.path = Path(path)
        if create:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Held open for the job: a folder swapped for a symlink later does not move it.
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self._ids = itertools.count(1)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def create(self) -> HandoffFile:
        """A new, empty file to write a payload's frames into."""
        name = f"r{os.getpid()}-{next(self._ids)}"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=self._fd)
        return HandoffFile(self, name, open(fd, "w+b"))  # noqa: SIM115 - owned by HandoffFile

    def read(self, name: str) -> Iterator[bytes]:
        """The data frames in the named file, checked one by one as they are read. The name
        leaves the folder at once: a reader that stops early or dies leaves nothing behind."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise HandoffError(f"handoff file name {name!r} is not a plain file name")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self._fd)
        except OSError as exc:
            raise HandoffError(f"handoff file {name} cannot be opened: {exc.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise HandoffError(f"handoff file {name} is not a regular file")
        handle = io.FileIO(fd, "rb")  # closes the descriptor even if nobody iterates
        self.discard(name)
        return _frames(handle, info.st_size, name)

    def discard(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass


class HandoffFile:
    """A file the parent fills, then hands to its worker by name, or removes."""

    def __init__(self, folder: HandoffDir, name: str, handle: BinaryIO):
        self.folder, self.name, self.handle = folder, name, handle

    def hand_over(self) -> str:
        """Close it for writing; from now on the worker reads (and so deletes) it."""
        self.handle.close()
        return self.name

    def remove(self) -> None:
        self.handle.close()
        self.folder.discard(self.name)


def _frames(handle: io.FileIO, size: int, name: str) -> Iterator[bytes]:
    with handle:
        offset = 0
        while offset < size:
            start = os.pread(handle.fileno(), _HEAD_MAX, offset)
            length = frames.frame_size(start)
            raw = os.pread(handle.fileno(), length, offset)
            if len(raw) != length:
                raise HandoffError(f"handoff file {name} ends inside a frame")
            offset += length
            yield frames.data_only(raw)
