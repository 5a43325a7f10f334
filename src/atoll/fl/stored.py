"""A model's arrays kept in a file instead of memory (app.yaml ``accumulator: disk``).

With a model of many GiB the server worker keeps its global model here between rounds: one
unlinked file in the run folder, mapped read-only once, each tensor a view of it (``StoredArray``).
Every reader (``serde.encode``, a diff's reference, FedOpt's step) sees plain numpy arrays, and
memory holds only the pages being read. A reader that streams a whole tensor calls ``release``
when it is done with it: its pages leave this process (the page cache or the disk keeps them), so
sending, hashing or checkpointing an 8 GiB model costs the worker one tensor's pages at most, not
8 GiB. The file's space goes back when its last array is gone.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import tempfile
from typing import Any

import numpy as np

from atoll.spec.errors import AtollError

Params = dict[str, np.ndarray]
Spec = dict[str, tuple[tuple[int, ...], np.dtype]]
_ALIGN = 64  # each tensor starts on a 64-byte boundary of the file


class StoreFailed(AtollError, RuntimeError):
    """The model could not be written to its file (a full disk, a file size limit)."""


class StoredArray(np.ndarray):
    """One tensor of a stored model: a read-only view of its file's mapping. Views of it are
    stored arrays too; what arithmetic on it makes is in memory (no mapping)."""

    _mapped: mmap.mmap | None = None
    _span: tuple[int, int] = (0, 0)  # its bytes in the mapping: offset, size

    def __array_finalize__(self, obj: Any) -> None:
        mapped = getattr(obj, "_mapped", None)
        if mapped is not None and np.may_share_memory(self, obj):
            self._mapped, self._span = mapped, obj._span
        else:
            self._mapped = None


def is_stored(array: np.ndarray) -> bool:
    return _stored_base(array) is not None


def store(params: Params, folder: str | os.PathLike[str]) -> Params:
    """``params`` written to a new file in ``folder`` and mapped back, in the same order. A model
    whose arrays are all stored already is returned as it is (no copy)."""
    if all(is_stored(array) or array.size == 0 for array in params.values()):
        return dict(params)
    writer = StoreWriter(folder, {name: (a.shape, a.dtype) for name, a in params.items()})
    for name, array in params.items():
        writer.write(name, 0, array)
        release(array)
    return writer.finish()


def trim() -> None:
    """Hand the memory of arrays just freed back to the system. glibc keeps freed blocks under
    its mmap threshold (which grows up to 32 MiB: most tensors of a model) in its heap, and a
    heap with live blocks above them is not cut back: a server worker whose 1 GiB model had
    gone to disk still held 925 MiB for the whole job."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator does as it does
        pass


def release(array: Any) -> None:
    """Drop the pages of a stored tensor (or of a view of one) from this process's memory; they
    are read again from the file where needed. Nothing happens for any other array."""
    base = _stored_base(array)
    if base is not None and base._mapped is not None and not base._mapped.closed:
        start, size = base._span
        first = start - start % mmap.PAGESIZE
        # a read-only shared mapping: nothing is lost, a later read maps the pages in again
        base._mapped.madvise(mmap.MADV_DONTNEED, first, start + size - first)


def write_at(fd: int, array: np.ndarray, offset: int) -> None:
    """Write a C-contiguous array's bytes at ``offset`` of ``fd``, whole (pwrite may write less)."""
    data = memoryview(array.reshape(-1).view(np.uint8))
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _stored_base(array: Any) -> StoredArray | None:
    """The mapped tensor ``array`` views, if any (arithmetic on a ``StoredArray`` makes arrays
    of its type that are not mapped: those are in memory)."""
    while array is not None:
        if isinstance(array, StoredArray) and array._mapped is not None:
            return array
        array = getattr(array, "base", None)
    return None


class StoreWriter:
    """A stored model written piece by piece (``write``), then mapped (``finish``)."""

    def __init__(self, folder: str | os.PathLike[str], spec: Spec):
        self.folder = str(folder)
        self._spec = spec
        self._offsets: dict[str, int] = {}
        self._size = 0
        for name, (shape, dtype) in spec.items():
            self._offsets[name] = self._size
            self._size += -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN
        try:
            self._file = tempfile.TemporaryFile(dir=folder, prefix="atoll-model-")  # unlinked
            os.ftruncate(self._file.fileno(), self._size)
        except OSError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: OSError) -> StoreFailed:
        return StoreFailed(
            f"the global model on disk (accumulator: disk, in {self.folder}) could not be "
            f"written: {exc.strerror or exc}; free space there, or set accumulator: memory")

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        """Write ``values`` (already in the tensor's dtype) from element ``start`` of tensor
        ``name`` on, in its flat order."""
        shape, dtype = self._spec[name]
        if values.dtype != dtype:
            raise TypeError(f"{name}: {values.dtype} written into a {dtype} tensor")
        try:
            write_at(self._file.fileno(), np.ascontiguousarray(values),
                     self._offsets[name] + start * dtype.itemsize)
        except OSError as exc:
            raise self._failed(exc) from None

    def finish(self) -> Params:
        """The model, each tensor a read-only view of the file's one mapping (the file is
        closed here: the mapping keeps it until its last view goes)."""
        out: Params = {}
        try:
            mapped = (mmap.mmap(self._file.fileno(), self._size, access=mmap.ACCESS_READ)
                      if self._size else None)
        except OSError as exc:
            raise self._failed(exc) from None
        finally:
            self._file.close()
        for name, (shape, dtype) in self._spec.items():
            size = math.prod(shape) * dtype.itemsize
            if not size:  # nothing to map
                empty = np.empty(shape, dtype)
                empty.flags.writeable = False
                out[name] = empty
                continue
            array = np.ndarray.__new__(StoredArray, shape, dtype, buffer=mapped,
                                       offset=self._offsets[name])
            array._mapped, array._span = mapped, (self._offsets[name], size)
            out[name] = array
        return out
