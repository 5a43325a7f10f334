"""Replies handed from the server parent to its server worker as files, when both see one folder.

A site's reply is complete in the server parent's spool (a file) before the workflow may read
it. Streamed to the workflow over the worker link, every GiB then costs the parent and the
worker about 1.5 CPU-s more (gRPC's copies and the loopback socket) at the moment the workflow
folds the round's results in, which it does alone. When the server worker runs on the parent's
host (the process launcher: `Launcher.shares_host`), the parent writes each reply into the job's
*handoff folder* instead and gives the workflow only its header, naming the file; the worker
maps the file and the name leaves the folder as it is opened. The file holds the data frames
exactly as they came off the wire (wire/frames.py), and each is checked again as it is read.

Mapped, not read: each frame the worker gets is a view of the page cache, so FedAvg folds a
1 GiB reply in straight from it. Read into fresh buffers, the same reply took two more copies
of each byte (the kernel's into the buffer, then the buffer's into the aggregation's block), in
the phase of a round where the workflow works alone. What was read is dropped from the
worker's memory as it goes, so its RSS does not grow by the size of the reply. The parent never
touches a file again once it is handed over (a file cut short under a mapping would kill its
reader with SIGBUS), and the folder is closed to other users.

The worker opens only plain names inside the folder its parent offered, never through a symlink.
Files the parent makes are new (O_EXCL), so nothing placed in the folder beforehand is written to.
"""

from __future__ import annotations

import io
import itertools
import mmap
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
_DROP_BYTES = 16 * 1024 * 1024  # a mapped reply leaves the worker's RSS in steps of this much


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


def _frames(handle: io.FileIO, size: int, name: str) -> Iterator[memoryview]:
    with handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) if size else None
    if mapped is None:
        return
    view = memoryview(mapped)
    offset = dropped = 0
    try:
        while offset < size:
            length = frames.frame_size(view[offset : offset + _HEAD_MAX])
            if offset + length > size:
                raise HandoffError(f"handoff file {name} ends inside a frame")
            yield frames.data_only(view[offset : offset + length])
            offset += length
            # The caller is done with what lies before this frame (it asked for the next):
            # drop those pages from this process (they stay readable, from the page cache).
            done = offset - offset % mmap.PAGESIZE
            if done - dropped >= _DROP_BYTES:
                mapped.madvise(mmap.MADV_DONTNEED, dropped, done - dropped)
                dropped = done
    finally:
        view.release()
        try:
            mapped.close()
        except BufferError:  # a caller still holds a frame: unmapped when it lets go
            pass
