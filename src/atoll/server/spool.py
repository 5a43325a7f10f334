"""One payload on its way through the server: written once, read by each of its readers.

Frames (raw, as they came off the wire) stay in memory while they fit the server's memory
budget; what does not fit goes to a file next to the job, and readers read it from there. A
*live* spool (a task) can be read while it is still being written: sites that are waiting get
the frames as they arrive and nothing touches the disk; the writer waits up to PATIENCE_S for a
reader that lags (or has not come yet) before the rest spills to the file, so a slow or absent
site never holds the workflow for long and memory stays bounded. A spool that is not live (a
reply) is only handed to its reader once complete: a site that dies mid-upload then leaves no
half reply for the workflow to fold into its average. A reply may also go whole into a file of
its own (wire/handoff.py), which the parent then hands to a server worker on its host by name.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from atoll.server.waiters import AsyncWaiters
from atoll.spec.errors import EXIT_CONNECTION, AtollError
from atoll.wire.frames import FrameError, data_view

if TYPE_CHECKING:
    from atoll.wire.handoff import HandoffFile

PATIENCE_S = 2.0  # how long a live writer waits for a lagging reader before spilling
_WAIT = object()  # Spool._step: the reader is ahead of the writer


class SpoolError(AtollError):
    """The payload broke off before it was complete."""

    exit_code = EXIT_CONNECTION


class Budget:
    """Bytes of payload the server may hold in memory across all of its spools."""

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self._used + n > self.limit:
                return False
            self._used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self._used -= n

    @property
    def used(self) -> int:
        return self._used


class SpillFiles:
    """A job's spill files, reused from payload to payload: writing a new file takes fresh
    page-cache pages, and fresh memory is dear (on the VMs measured here, touching a GiB for the
    first time took 1.7 s, reusing it 0.1 s). Deleted with the job's folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._free: list[BinaryIO] = []
        self._made = 0
        self._lock = threading.Lock()

    def take(self) -> BinaryIO:
        with self._lock:
            if self._free:
                handle = self._free.pop()
                handle.seek(0)
                return handle
            self._made += 1
            # 0600 whatever the umask: a payload is the study's, not the host's other users'.
            path = self.folder / f"spill-{self._made}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            os.fchmod(fd, 0o600)
            return open(fd, "w+b")  # noqa: SIM115 - the relay keeps it until the job ends

    def give(self, handle: BinaryIO) -> None:
        with self._lock:
            self._free.append(handle)

    def close(self) -> None:
        with self._lock:
            for handle in self._free:
                handle.close()
            self._free.clear()

    @property
    def made(self) -> int:
        return self._made


class Spool:
    def __init__(self, files: SpillFiles, readers: Iterable[str], budget: Budget, live: bool,
                 own_file: HandoffFile | None = None):
        self.files = files
        self.budget = budget
        self.live = live
        self.size = 0  # payload bytes written so far
        self._cond = threading.Condition()
        self._tasks = AsyncWaiters()  # readers on the event loop (aread)
        self._memory: deque[bytes] = deque()  # frames [_base, _base + len) still in memory
        self._memory_bytes = 0
        self._base = 0
        self._count = 0  # frames written
        self._spilled_at: int | None = None  # index of the first frame in the file
        self._offsets: list[tuple[int, int]] = []  # (offset, length) of each frame in the file
        self._file = None
        self.spilled_bytes = 0  # how much of the payload went to the file
        self._cursor = {reader: 0 for reader in readers}
        # How many readers stand at each frame, and the lowest such frame: finding what every
        # reader has passed stays O(1) with a thousand readers of one task.
        self._readers_at = Counter({0: len(self._cursor)})
        self._lowest = 0
        self._done = False
        self._error: str | None = None
        self._own = own_file  # every frame goes to this file, which the spool hands over
        self._whole: bytes | None = None  # the payload in one piece, for readers that take it so
        if own_file is not None:
            self._file, self._spilled_at = own_file.handle, 0

    # -- writer -------------------------------------------------------------------------------
    def write(self, frames: Iterable[bytes], limit: int | None = None) -> int:
        """Take every frame of the payload; returns its size. On failure, readers see it."""
        try:
            for raw in frames:
                self.append(raw, limit)
        except BaseException as exc:
            self.fail(str(exc) or type(exc).__name__)
            raise
        self.finish()
        return self.size

    def append(self, raw: bytes, limit: int | None = None) -> None:
        """One more frame; a payload that outgrows limit fails (FrameError)."""
        self.size += len(raw)
        if limit is not None and self.size > limit:
            error = FrameError(f"payload larger than the limit of {limit} bytes")
            self.fail(str(error))
            raise error
        self._append(raw)

    def finish(self) -> None:
        """The payload is complete."""
        with self._cond:
            self._done = True
            if self._own is not None:  # it waits for its reader without a descriptor
                self._own.seal()
                self._file = None
            self._trim()
            if not self._cursor:
                self._release()
            self._notify()

    def _append(self, raw: bytes) -> None:
        with self._cond:
            if not self._cursor:  # nobody left to read it
                self._count += 1
                return
            if self._spilled_at is None:
                if self._hold(len(raw)):
                    self._memory.append(raw)
                    self._memory_bytes += len(raw)
                    self._count += 1
                    self._notify()
                    return
                self._spilled_at = self._count
                self._file = self.files.take()
            if self._file is None:  # closed under us: the job is over
                raise SpoolError("the job is over")
            # Under the lock (a page-cache write of one frame): close() cannot shut the file
            # mid-write, and readers pread only what is flushed.
            self._file.write(raw)
            self._file.flush()
            self._offsets.append((self.spilled_bytes, len(raw)))
            self.spilled_bytes += len(raw)
            self._count += 1
            self._notify()

    def _hold(self, n: int) -> bool:
        """Make room for n more bytes in memory (lock held); False when the rest must spill."""
        if self.budget.take(n):
            return True
        if not self.live:
            return False
        # Wait only for this spool's own readers to give memory back as they go: memory that
        # other payloads hold may not come back soon.
        deadline = time.monotonic() + PATIENCE_S
        while self._memory_bytes and self._cursor:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._cond.wait(min(left, 0.05))
            if self.budget.take(n):
                return True
        return False

    def fail(self, reason: str) -> None:
        with self._cond:
            if not self._done:
                self._error = reason
                self._done = True
                if not self._cursor:
                    self._release()
                self._notify()

    # -- readers ------------------------------------------------------------------------------
    def read(self, reader: str) -> Iterator[bytes]:
        """The payload's frames for this reader, as they come (live) or from the complete spool.
        A reader that stops early is dropped, so it holds no memory."""
        position = 0
        try:
            while True:
                with self._cond:
                    while (raw := self._step(reader, position)) is _WAIT:
                        self._cond.wait()
                if raw is None:
                    return
                position += 1
                yield raw
        finally:
            self.drop(reader)

    async def aread(self, reader: str) -> AsyncIterator[bytes]:
        """read() for a reader on the event loop: it waits without holding a thread."""
        position = 0
        try:
            while True:
                with self._cond:
                    raw = self._step(reader, position)
                    if raw is _WAIT:
                        more = self._tasks.future()
                if raw is _WAIT:
                    await more
                    continue
                if raw is None:
                    return
                position += 1
                yield raw
        finally:
            self.drop(reader)

    def whole(self, reader: str, limit: int) -> bytes | None:
        """The complete payload's data in one piece, if it is at most `limit` bytes and this
        reader has read none of it yet; the reader is then done. The piece is made once and
        shared by every reader that takes it (a task inline for 10,000 sites: one copy, not
        one each). None otherwise: read() the frames."""
        with self._cond:
            if not self.complete or self.size > limit or self._cursor.get(reader) != 0:
                return None
            if self._whole is None:
                self._whole = b"".join([data_view(self._frame(n)) for n in range(self._count)])
            whole = self._whole
            self._leave(reader)
            return whole

    def _frame(self, position: int) -> bytes:
        """Frame `position`, still held by a reader (lock held)."""
        if self._spilled_at is None or position < self._spilled_at:
            return self._memory[position - self._base]
        # under the lock: close() may not shut the file mid-read
        if self._file is None and self._own is not None:  # sealed at finish
            self._file = self._own.reopen()
        offset, length = self._offsets[position - self._spilled_at]
        return os.pread(self._file.fileno(), length, offset)

    def _step(self, reader: str, position: int) -> bytes | object | None:
        """Frame `position` for reader (lock held): _WAIT if not written yet, None at the end."""
        if position >= self._count and not self._done:
            return _WAIT
        if reader not in self._cursor:
            return None
        if position >= self._count:
            if self._error is not None:
                raise SpoolError(self._error)
            self._leave(reader)
            return None
        raw = self._frame(position)
        self._cursor[reader] = position + 1
        self._readers_at[position] -= 1
        self._readers_at[position + 1] += 1
        self._trim()
        return raw

    def drop(self, reader: str) -> None:
        """A reader that will not read (any more)."""
        with self._cond:
            if reader in self._cursor:
                self._leave(reader)

    def _leave(self, reader: str) -> None:
        self._readers_at[self._cursor.pop(reader)] -= 1
        self._trim()
        if not self._cursor and self._done:
            self._release()
        self._notify()

    def _trim(self) -> None:
        """Give back the frames every remaining reader has passed (lock held)."""
        if self._cursor:
            while not self._readers_at[self._lowest]:
                del self._readers_at[self._lowest]
                self._lowest += 1
            low = self._lowest
        else:
            low = self._count if self._done else self._base
        freed = 0
        while self._base < low and self._memory:
            freed += len(self._memory.popleft())
            self._base += 1
        if freed:
            self._memory_bytes -= freed
            self.budget.give(freed)
            self._notify()

    def _release(self) -> None:
        self._whole = None
        if self._memory_bytes:
            self.budget.give(self._memory_bytes)
            self._memory.clear()
            self._memory_bytes = 0
        if self._own is not None:
            self._own.remove()
            self._own = self._file = None
        elif self._file is not None:
            self.files.give(self._file)
            self._file = None

    def hand_over(self) -> str:
        """The name of the complete payload's own file, now its reader's to read and delete."""
        with self._cond:
            if not self.complete or self._own is None or not self._cursor:
                raise SpoolError("only a complete payload in a file of its own, not yet read, "
                                 "can be handed over")
            name = self._own.hand_over()
            self._own = self._file = None
            self._cursor.clear()
            self._notify()
            return name

    def close(self) -> None:
        """Free everything now (the job is over)."""
        with self._cond:
            self._error = self._error or "the job is over"
            self._done = True
            self._cursor.clear()
            self._release()
            self._notify()

    def _notify(self) -> None:
        """Wake every waiting reader and writer, threads and tasks (lock held)."""
        self._cond.notify_all()
        self._tasks.wake()

    @property
    def complete(self) -> bool:
        return self._done and self._error is None

    @property
    def frame_count(self) -> int | None:
        """How many frames the payload has, once it is complete; None before."""
        return self._count if self.complete else None
