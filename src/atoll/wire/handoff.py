"""Payloads handed between a parent and its own worker as files, when both see one folder.

Over the worker link (gRPC on the loopback), every GiB of payload costs the parent and the
worker about 1.2 CPU-s together: gRPC's copies and the socket's. Through a file it costs a
fraction of that. When the worker runs on its parent's host (the process launcher:
`Launcher.shares_host`), the parent offers the job's *handoff folder* at registration, and
payloads in both directions go through it: the writer fills a file with the data frames
exactly as they would have gone on the wire (wire/frames.py) and sends only the header, naming
the file. Every frame is checked again as it is read.

Which side reads how:
- A worker **maps** what its parent wrote (`read`): each frame is a view of the page cache, so
  FedAvg folds a 1 GiB reply in straight from it and a site decodes its task from it. What was
  read is dropped from the worker's memory as it goes, so its RSS does not grow by the size of
  the payload.
- A parent **reads** what its worker wrote (`take`), with pread, never through a mapping: the
  worker runs the job's code, and a file cut short under a mapping would kill its reader with
  SIGBUS. A file cut short under pread is an error for that payload alone.

Files are reused. A file of a MiB or more read to its end (and, if mapped, no longer held) goes
back under a `free-` name, and the next writer, on either side, fills it again (the side that
freed it knows at once; the other finds it when it next lists the folder). It is kept only while
its disk has `REUSE_ROOM` times its size free, else removed: spare copies of a model of many GiB
must not fill the disk. On the VMs measured here a page not touched for a few seconds goes back
to the host, and touching it again is dear: writing a GiB into a new file took 1.0 CPU-s, into
the same file again 0.15. A file read only in part, or not whole frames, leaves the folder; what
is left at the end goes with the job.

Only plain names inside the folder are opened, never through a symlink, and only a regular file
of this user with one link. New files are made with O_EXCL, 0600, with the maker's pid in the
name, so nothing planted in the folder is written to, and parent and worker never pick the same
name. The parent never maps a file, so nothing the worker does to one can hurt the parent.
"""

from __future__ import annotations

import io
import itertools
import mmap
import os
import re
import stat
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from atoll.wire import frames

KEY = "handoff"  # the header field naming the file that holds a payload's data frames
FREE = "free-"  # the prefix of a file read to its end, there to be filled again
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_HEAD_MAX = 11  # tag + the longest varint a frame's length may take
# A mapped payload leaves the worker's RSS in steps of this much: at 16 MiB the server worker
# folding a reply stood 13 MiB higher, at the moment the round's summed RSS peaked
_DROP_BYTES = 4 * 1024 * 1024
# Smaller files are removed once read, not kept: new pages for them cost little, and a folder
# of a thousand sites' small replies is then listed for nothing.
REUSE_MIN_BYTES = 1024 * 1024
REUSE_ROOM = 4  # a file is kept for reuse only while the disk has four times its size free
_RELIST_S = 0.5  # create(): how often the folder may be listed again for free files


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
        self._mapped: list[tuple[mmap.mmap | None, str, int]] = []  # read whole, not given back
        self._free_names: deque[str] = deque()  # free files seen at the last listing
        self._listed_at = -_RELIST_S

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- writing ------------------------------------------------------------------------------
    def create(self) -> HandoffFile:
        """A file to write a payload's frames into from its start: a free one, else a new one."""
        fd, name = self._take_free()
        for _ in range(100):
            if fd is not None:
                return HandoffFile(self, name, open(fd, "r+b"))  # noqa: SIM115 - owned by it
            name = self._next_name()
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                             dir_fd=self._fd)
            except FileExistsError:  # something was planted under that name: another name
                continue
        raise HandoffError(f"no new file name is left in {self.path}")

    def _next_name(self) -> str:
        return f"r{os.getpid()}-{next(self._ids)}"

    def _take_free(self) -> tuple[int | None, str]:
        # Listed at most every _RELIST_S: with a thousand replies in the folder, a listing per
        # reply made each round quadratic.
        listed = False
        while True:
            try:
                free = self._free_names.popleft()
            except IndexError:  # none seen (or another thread took the last): list again?
                if listed or time.monotonic() - self._listed_at < _RELIST_S:
                    break
                listed, self._listed_at = True, time.monotonic()
                self._free_names.extend(n for n in os.listdir(self._fd) if n.startswith(FREE))
                if not self._free_names:
                    break
                continue
            try:
                if not stat.S_ISREG(os.stat(free, dir_fd=self._fd, follow_symlinks=False).st_mode):
                    continue
                name = self._next_name()
                os.rename(free, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)  # one taker
                fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW, dir_fd=self._fd)
            except OSError:  # gone meanwhile, or swapped for something that is not a file
                continue
            if _plain(os.fstat(fd)):
                return fd, name
            os.close(fd)
            self.discard(name)
        return None, ""

    def put(self, chunks: Iterable[Any]) -> str:
        """Write a payload's chunks into a file as data frames; returns its name, handed over."""
        file = self.create()
        try:
            file.write_chunks(chunks)
        except BaseException:
            file.remove()
            raise
        return file.hand_over()

    # -- reading ------------------------------------------------------------------------------
    def read(self, name: str) -> Iterator[memoryview]:
        """The data frames in the named file, mapped (a worker reading its parent's file).
        Read to its end, it is given back by a later give_back()."""
        self.give_back()
        handle, size = self._open(name)
        return self._mapped_frames(handle, size, name)

    def take(self, name: str) -> FileFrames:
        """The data frames in the named file, read (a parent reading its worker's file) up to
        its size when opened; given back as soon as it is read to its end."""
        handle, size = self._open(name)
        return FileFrames(self._read_frames(handle, name, size), size)

    def give_back(self) -> None:
        """Give back every mapped file read to its end whose frames nobody holds any more."""
        held = []
        for mapped, name, size in self._mapped:
            try:
                if mapped is not None:
                    mapped.close()
            except BufferError:  # a frame of it is still in use: next time
                held.append((mapped, name, size))
                continue
            self._free(name, size)
        self._mapped = held

    def discard(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def _open(self, name: str) -> tuple[io.FileIO, int]:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise HandoffError(f"handoff file name {name!r} is not a plain file name")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self._fd)
        except OSError as exc:
            raise HandoffError(f"handoff file {name} cannot be opened: {exc.strerror}") from None
        info = os.fstat(fd)
        if not _plain(info):
            os.close(fd)
            raise HandoffError(f"handoff file {name} is not a regular file of this user "
                               "with one link")
        return io.FileIO(fd, "rb"), info.st_size  # closes the descriptor even if nobody reads

    def _free(self, name: str, size: int) -> None:
        """A file read to its end: kept for the next writer if it is large enough to matter."""
        try:
            if size >= REUSE_MIN_BYTES and _free_bytes(self._fd) >= REUSE_ROOM * size:
                os.rename(name, FREE + name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
                # Known free without a listing: this side's next create fills it again, even
                # within _RELIST_S of the last listing (a round faster than that wrote every
                # payload into fresh pages, ten times the CPU of reused ones).
                self._free_names.append(FREE + name)
                return
        except OSError:
            pass
        self.discard(name)

    def _mapped_frames(self, handle: io.FileIO, size: int, name: str) -> Iterator[memoryview]:
        mapped, whole = None, False
        try:
            with handle:
                mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) if size \
                    else None
            if mapped is not None:
                yield from _views(mapped, size, name)
            whole = True
        finally:
            if whole:  # given back once the caller lets go of its frames (give_back)
                self._mapped.append((mapped, name, size))
            else:  # the mapping goes with its last view, the name now
                self.discard(name)

    def _read_frames(self, handle: io.FileIO, name: str, size: int) -> Iterator[bytes]:
        offset, whole, fd = 0, False, handle.fileno()
        try:
            while offset < size:
                length = frames.frame_size(os.pread(fd, _HEAD_MAX, offset))
                raw = os.pread(fd, length, offset) if offset + length <= size else b""
                if len(raw) != length:  # cut short, or grown past its size since it was opened
                    raise HandoffError(f"handoff file {name} ends inside a frame")
                yield frames.data_only(raw)
                offset += length
            whole = True
        finally:
            handle.close()
            if whole:
                self._free(name, offset)
            else:
                self.discard(name)


class FileFrames(Iterator[bytes]):
    """A handoff file's data frames, as an iterator, and the bytes they come to (`size`)."""

    def __init__(self, frames_: Generator[bytes, None, None], size: int):
        self._frames, self.size = frames_, size

    def __next__(self) -> bytes:
        return next(self._frames)

    def close(self) -> None:
        self._frames.close()


class HandoffFile:
    """A file its maker fills from the start, then hands over by name, or removes."""

    def __init__(self, folder: HandoffDir, name: str, handle: BinaryIO):
        self.folder, self.name, self.handle = folder, name, handle

    def write_frames(self, raw_frames: Iterable[bytes]) -> int:
        """Encoded frames as they came off the wire; returns the bytes written."""
        size = 0
        for raw in raw_frames:
            self._write((raw,))
            size += len(raw)
        return size

    def write_chunks(self, chunks: Iterable[Any]) -> int:
        """Chunks as data frames of at most frames.CHUNK bytes, each written from the caller's
        buffer (not joined into one frame first, as the link needs); returns the bytes written."""
        size = 0
        for lead, piece in frames.data_pieces(chunks):
            self._write((lead, piece))
            size += len(lead) + len(piece)
        return size

    def _write(self, parts: tuple[Any, ...]) -> None:
        self.handle.flush()  # whatever went in through handle.write
        views = [memoryview(p).cast("B") for p in parts]
        while views:
            written = os.writev(self.handle.fileno(), views)
            while views and written >= len(views[0]):  # a short write goes on where it stopped
                written -= len(views.pop(0))
            if views:
                views[0] = views[0][written:]

    def seal(self) -> None:
        """Written whole: cut to what was written (a reused file may have been longer) and
        closed, so that a file waiting for its reader holds no descriptor (at 10,000 sites, a
        round's replies waiting for the workflow were 10,000 open files)."""
        if not self.handle.closed:
            self.handle.truncate()
            self.handle.close()

    def reopen(self) -> BinaryIO:
        """The sealed file, open again for its maker to read (pread) rather than hand over."""
        self.handle, _ = self.folder._open(self.name)
        return self.handle

    def hand_over(self) -> str:
        """Seal it; from now on the other side reads it."""
        self.seal()
        return self.name

    def remove(self) -> None:
        self.handle.close()
        self.folder.discard(self.name)


def payload_of(head: dict[str, Any], chunks: frames.Payload,
               folder: HandoffDir | None) -> Iterator[bytes]:
    """A parent's view of what its worker sent: the encoded data frames, from the handoff file
    the header names or else from the link itself."""
    name = head.get(KEY)
    if name is None:
        return chunks.frames()
    if folder is None:
        raise HandoffError("the payload names a handoff file, but this parent offered no "
                           "handoff folder: send its data over the worker link")
    for _ in chunks.frames():
        raise HandoffError("the payload names a handoff file and carries data as well")
    return folder.take(name)


def _free_bytes(fd: int) -> int:
    """What the disk under the folder ``fd`` still has free for this user."""
    info = os.fstatvfs(fd)
    return info.f_bavail * info.f_frsize


def _plain(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.getuid()


def _views(mapped: mmap.mmap, size: int, name: str) -> Iterator[memoryview]:
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
