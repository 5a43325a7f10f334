"""A workflow's checkpoint on disk: what the server side of a job needs to continue after a
server restart, written after each completed round (docs/federated-learning.md, "Server
restarts").

Two files in the checkpoint folder (``run/server/checkpoint/`` in the server worker's run
folder, never its downloadable results):

- ``round-<k>.safetensors``: a safetensors document (no pickle) whose arrays are the state's
  arrays, flattened by path (``model/fc.weight``), and whose metadata holds the rest of the
  state as JSON, each array replaced by ``{"__array__": path}``. When the workflow names its
  round's model (``save(..., model=)``, FedAvg's global model), that model comes first, whole,
  as its own .safetensors file would be, and the state's document follows it with the model's
  arrays replaced by ``{"__model__": name}``: one SHA-256 pass over the file then gives both
  the file's digest and the round's model digest for the provenance record (two passes, 70 ms
  a 100 MiB round, before);
- ``checkpoint.json``: ``{"format": 1, "round": k, "file": ..., "sha256": ..., "bytes": ...}``
  and ``"model_bytes"`` where the model comes first: the commit point, written after the state
  file is on disk.

Both are written atomically (a temporary file, fsync, rename, fsync of the folder): a kill at
any moment leaves the previous checkpoint whole, or the new one. The state file goes to the
disk past the page cache (O_DIRECT) where the filesystem allows: only a resume reads it.
Reading checks the digest and the size before decoding, so a damaged file is named as such
(``CheckpointDamaged``) and never half-restored. The previous round's state file is removed
once the new one is committed.

A state is a dict of str keys whose leaves are numpy arrays or JSON-safe values (dicts, lists,
str, numbers, bool, None); arrays may sit anywhere in dicts and lists.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from atoll.fl.model import Model
from atoll.fl.serde import SerdeError, decode, encode
from atoll.spec.checkpoint_manifest import FORMAT, MANIFEST, Manifest, parse_manifest, state_file
from atoll.spec.errors import EXIT_INVALID, AtollError

__all__ = ["FORMAT", "MANIFEST", "CheckpointDamaged", "Saved", "load", "model_sha256", "save",
           "size_on_disk"]
STATE_KEY = "atoll_checkpoint"  # the metadata entry that holds the JSON part of the state
_ARRAY = "__array__"
_MODEL = "__model__"
_READ = 4 * 1024 * 1024
DIRECT = True  # state files past the page cache (_DirectFile); bench/checkpoint_write.py turns it off
_DIRECT_BUFFER = 1024 * 1024
_ALIGN = 4096  # O_DIRECT's alignment of lengths and offsets: the largest logical block in use


class CheckpointDamaged(AtollError, ValueError):
    """The checkpoint exists but cannot be trusted (a digest mismatch, a truncated file...)."""

    exit_code = EXIT_INVALID


class Saved(NamedTuple):
    bytes: int  # the state file's size
    model_sha256: str | None  # the model's own file's SHA-256, where ``save`` was given one


def save(folder: Path, round_: int, state: dict[str, Any], model: Model | None = None) -> Saved:
    """Commit ``state`` as the checkpoint after round ``round_``. ``model``: the round's model,
    whose arrays the state may hold too (by identity): stored once, first in the file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    held = {id(a): k for k, a in model.params.items()} if model is not None else {}
    tree = _flatten(state, "", arrays, held)
    rest = Model(params=arrays, round=round_, meta={STATE_KEY: tree})
    name = state_file(round_)
    parts = [encode(rest)] if model is None else [encode(model), encode(rest)]
    digests, size = _write_atomic(folder / name, parts, direct=DIRECT)
    model_bytes = digests[0][1] if model is not None else 0
    _write_atomic(folder / MANIFEST,
                  [[Manifest(round_, name, digests[-1][0], size, model_bytes).document()]])
    for old in folder.glob("round-*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return Saved(size, digests[0][0] if model is not None else None)


def model_sha256(model: Model) -> str:
    """The SHA-256 of ``model`` as its .safetensors file would have it: what ``save`` gives
    from its own pass, for a round whose model is not checkpointed."""
    digest = hashlib.sha256()
    for chunk in encode(model):
        digest.update(chunk)
    return digest.hexdigest()


def load(folder: Path) -> tuple[int, dict[str, Any]] | None:
    """The committed checkpoint as (round, state); None when there is none yet.
    ``CheckpointDamaged`` says why one that exists cannot be used."""
    folder = Path(folder)
    try:
        raw = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointDamaged(f"the checkpoint's {MANIFEST} cannot be read: {exc}") from None
    try:
        manifest = parse_manifest(raw)
    except ValueError as exc:
        raise CheckpointDamaged(f"the checkpoint's {MANIFEST} is damaged: {exc}") from None
    round_, name, digest, size = manifest.round, manifest.file, manifest.sha256, manifest.bytes
    path = folder / name
    try:
        found, length = _digest(path)
    except OSError as exc:
        raise CheckpointDamaged(f"the state of round {round_} cannot be read: {exc}") from None
    if length != size or found != digest:
        raise CheckpointDamaged(f"the state of round {round_} is damaged: its SHA-256 or size "
                                f"does not match {MANIFEST}")
    try:
        model = decode(_read(path, 0, manifest.model_bytes)) if manifest.model_bytes else None
        rest = decode(_read(path, manifest.model_bytes, size))
        tree = rest.meta[STATE_KEY]
        return round_, _unflatten(tree, rest.params, model.params if model else {})
    except (SerdeError, KeyError, TypeError, OSError) as exc:
        raise CheckpointDamaged(f"the state of round {round_} does not decode: {exc}") from None


def size_on_disk(folder: Path) -> int:
    """Bytes the checkpoint folder holds (for the benchmarks)."""
    return sum(p.stat().st_size for p in Path(folder).glob("*") if p.is_file())


# --- the state's tree ------------------------------------------------------------------------

def _flatten(value: Any, path: str, arrays: dict[str, np.ndarray], held: dict[int, str]) -> Any:
    if id(value) in held:  # one of the model's own arrays, stored with it
        return {_MODEL: held[id(value)]}
    if isinstance(value, np.ndarray | np.generic):
        key = path or "_"
        array = np.asarray(value)  # (ascontiguousarray would make a 0-d array 1-d)
        arrays[key] = array if array.flags.c_contiguous else array.copy()
        return {_ARRAY: key}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"checkpoint state keys must be strings, got {k!r} at {path!r}")
            out[k] = _flatten(v, f"{path}/{k}" if path else k, arrays, held)
        return out
    if isinstance(value, list | tuple):
        return [_flatten(v, f"{path}/{i}", arrays, held) for i, v in enumerate(value)]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"checkpoint state at {path or 'the top'!r} holds a {type(value).__name__}: "
                    "use numpy arrays and JSON-safe values (dict, list, str, numbers, None)")


def _unflatten(value: Any, arrays: dict[str, np.ndarray], model: dict[str, np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return arrays[value[_ARRAY]]
        if set(value) == {_MODEL}:
            return model[value[_MODEL]]
        return {k: _unflatten(v, arrays, model) for k, v in value.items()}
    if isinstance(value, list):
        return [_unflatten(v, arrays, model) for v in value]
    return value


# --- durable files ---------------------------------------------------------------------------

def _write_atomic(path: Path, parts: list[Iterable[Any]], direct: bool = False
                  ) -> tuple[list[tuple[str, int]], int]:
    """Stream ``parts`` (each an iterable of chunks) into ``path`` through a temporary file:
    fsync, rename, fsync of the folder. ``direct``: past the page cache where the filesystem
    allows (``_DirectFile``). The SHA-256 and size of the file up to the end of each part (one
    pass: the digest at a part's end is a copy of the running one), and its size."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    digest, size, marks = hashlib.sha256(), 0, []
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with _DirectFile(fd) if direct else os.fdopen(fd, "wb") as fh:
            for part in parts:
                for chunk in part:
                    fh.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                marks.append((digest.copy().hexdigest(), size))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return marks, size


class _DirectFile:
    """A state file written with O_DIRECT: gathered in an aligned buffer, written from it
    straight to the disk, the last block padded, then cut to its size. Nothing reads a
    checkpoint back but a resume, so its bytes need no page cache; filling new page-cache
    pages was most of the write's cost on these VMs: a 1 GiB save took 2.2 CPU-s through the
    page cache, 0.9 this way, its SHA-256 0.6 of it (bench/checkpoint_write.py). A filesystem
    that refuses O_DIRECT (tmpfs, some FUSE), or writes short, gets the rest through the page
    cache."""

    def __init__(self, fd: int):
        self._fd, self._fill, self._size = fd, 0, 0
        try:
            # page-aligned, and held for this write alone: a resident buffer would add to the
            # worker's RSS between rounds; 1 MiB writes went as fast as 8 MiB ones here
            self._buf = mmap.mmap(-1, _DIRECT_BUFFER)
        except BaseException:
            os.close(fd)
            raise
        self._direct = _set_direct(fd, True)

    def fileno(self) -> int:
        return self._fd

    def write(self, chunk: Any) -> None:
        view = memoryview(chunk).cast("B")
        self._size += len(view)
        while view:
            n = min(len(view), _DIRECT_BUFFER - self._fill)
            self._buf[self._fill:self._fill + n] = view[:n]
            self._fill, view = self._fill + n, view[n:]
            if self._fill == _DIRECT_BUFFER:
                self._out(_DIRECT_BUFFER)

    def flush(self) -> None:
        if self._fill:
            # O_DIRECT writes whole blocks: the last one padded, the padding cut off below
            self._out(-(-self._fill // _ALIGN) * _ALIGN if self._direct else self._fill)
        os.ftruncate(self._fd, self._size)

    def _out(self, length: int) -> None:
        view = memoryview(self._buf)[:length]
        try:
            written = os.write(self._fd, view)
        except OSError as exc:
            if not self._direct or exc.errno != errno.EINVAL:
                raise
            self._direct = _set_direct(self._fd, False)  # this filesystem's O_DIRECT balks
            written = os.write(self._fd, view)
        finally:
            view.release()
        if written < length and self._direct:  # a short write: the rest, through the page cache
            self._direct = _set_direct(self._fd, False)
        while written < length:
            with memoryview(self._buf)[written:length] as rest:
                written += os.write(self._fd, rest)
        self._fill = 0

    def __enter__(self) -> _DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.close(self._fd)
        finally:
            self._buf.close()


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for ``fd``; whether it is on."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError:
        return False
    return on


def _read(path: Path, start: int, end: int) -> Iterable[bytes]:
    """The bytes of ``path`` from ``start`` to ``end``, in blocks."""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0 and (block := fh.read(min(_READ, left))):
            left -= len(block)
            yield block


def _digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
