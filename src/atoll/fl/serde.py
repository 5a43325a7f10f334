"""Models as safetensors documents, streamed in chunks both ways; never pickle.

Layout (the public safetensors format, so the saved files open with the ``safetensors`` package
and with PyTorch tooling): an 8-byte little-endian header length N, N bytes of JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`` padded
with spaces to a multiple of 8, then the raw little-endian buffers back to back.

``encode`` yields the header and then memoryviews over each array's own buffer, sliced to at most
``chunk_size`` bytes: a large model is never concatenated or copied whole (small arrays are
gathered into one chunk so that a model of many tiny tensors does not become many tiny messages).
``decode`` reads the header, preallocates every array, and fills it from the chunks: one copy.

The header is validated strictly before any allocation: known dtypes only, shapes of
non-negative ints, offsets contiguous from 0 with sizes matching shape x itemsize, a bounded
header length, and the stream must end exactly where the last array does.

``encode(..., quantize=...)`` sends float tensors 8-bit quantized (``atoll.fl.quantization``:
codes plus per-block lo/step tables, still a safetensors document); a receiver checks the
tables before any code is used and hands every tensor out decoded, in its own dtype, so no
reader (an aggregator, a site script) ever sees a code.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl import quantization, stored
from atoll.fl.bfloat16 import BF16
from atoll.fl.model import PARAMS_TYPES, Model
from atoll.spec.errors import EXIT_INVALID, AtollError

CHUNK_SIZE = 4 * 1024 * 1024  # 1-4 MiB messages are where gRPC over TLS is fastest
SMALL_ARRAY = 256 * 1024  # arrays below this are gathered into a shared chunk
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors reference limit
DECODED_VALUES = 1 << 20  # a quantized tensor's values decoded at a time (a few MiB of scratch)

# safetensors dtype names <-> numpy (little-endian). BF16 has no numpy dtype: its raw words
# travel under atoll.fl.bfloat16.BF16, a tagged 2-byte dtype (never widened on the way).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}
_NAME_OF = {(dt.kind, dt.itemsize): name for name, dt in DTYPES.items()}
DTYPES["BF16"] = BF16  # named by equality only: no other 2-byte void dtype is bfloat16


class SerdeError(AtollError, ValueError):
    """A payload that is not a valid model document; the message says what is wrong."""

    exit_code = EXIT_INVALID


def dtype_name(dtype: np.dtype) -> str:
    if dtype == BF16:
        return "BF16"
    name = _NAME_OF.get((dtype.kind, dtype.itemsize)) if dtype.kind != "V" else None
    if name is None:
        raise SerdeError(
            f"dtype {dtype} cannot be serialized; supported: {', '.join(DTYPES)} "
            "(numpy bool, uint/int 8-64, float 16/32/64, atoll.fl.bfloat16.BF16)"
        )
    return name


# --- encoding ---------------------------------------------------------------------------------


def _prepared(params: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Arrays in a wire-ready form: C-contiguous little-endian (a copy only when not already)."""
    out = []
    for name, array in params.items():
        dtype_name(array.dtype)  # fail early on unsupported dtypes
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:
            array = array.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
        out.append((name, array))
    return out


def _metadata(model: Model) -> dict[str, str]:
    return {
        "format": "atoll",
        "params_type": model.params_type,
        "num_examples": str(model.num_examples),
        "metrics": json.dumps(model.metrics),
        "round": json.dumps(model.round),
        "meta": json.dumps(model.meta),
    }


def _header(entries: list[tuple[str, np.dtype, tuple[int, ...]]], metadata: dict[str, str]
            ) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in entries:
        end = offset + math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": dtype_name(dtype),
            "shape": list(shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned, as safetensors does
    return struct.pack("<Q", len(raw)) + raw


_Piece = tuple[str, np.dtype, tuple[int, ...], Callable[[], Iterator[np.ndarray]]]


def _pieces(arrays: list[tuple[str, np.ndarray]], metadata: dict[str, str],
            quantize: quantization.Settings | None, chunk_size: int) -> list[_Piece]:
    """Each tensor as it travels, in data order: (name, dtype, shape, its data in parts). With
    ``quantize``: the lo/step tables first, then each quantized tensor as its codes, made a
    chunk at a time as they are sent (atoll.fl.quantization)."""
    def whole(array: np.ndarray) -> Callable[[], Iterator[np.ndarray]]:
        return lambda: iter((array,))

    if quantize is None:
        return [(name, a.dtype, a.shape, whole(a)) for name, a in arrays]
    companions, planned, value = quantization.plan(dict(arrays), quantize, dtype_name)
    if value is not None:
        metadata[quantization.METADATA_KEY] = value
    out: list[_Piece] = [(name, t.dtype, t.shape, whole(t)) for name, t in companions]
    for p in planned:
        if p.table is None:
            out.append((p.name, p.array.dtype, p.array.shape, whole(p.array)))
        else:
            out.append((p.name, np.dtype(np.uint8), p.array.shape,
                        partial(quantization.codes, p.array, p.table, quantize.block_size,
                                chunk_size)))
    return out


def encode(model: Model, chunk_size: int = CHUNK_SIZE, *,
           quantize: quantization.Settings | None = None) -> Iterator[memoryview]:
    """Yield the model as safetensors chunks: the header, then views over the arrays' buffers.
    ``quantize`` (block_size, min_elements): float tensors travel 8-bit quantized."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    metadata = _metadata(model)
    pieces = _pieces(_prepared(model.params), metadata, quantize, chunk_size)
    yield memoryview(_header([(name, dtype, shape) for name, dtype, shape, _ in pieces],
                             metadata))
    pending = bytearray()
    for _, dtype, shape, parts in pieces:
        size = math.prod(shape) * dtype.itemsize
        for part in parts():
            view = memoryview(part.reshape(-1).view(np.uint8))
            if size < min(SMALL_ARRAY, chunk_size):
                if len(pending) + len(view) > chunk_size:
                    yield memoryview(pending)
                    pending = bytearray()
                pending += view
                continue
            if pending:
                yield memoryview(pending)
                pending = bytearray()
            for start in range(0, len(view), chunk_size):
                yield view[start : start + chunk_size]
            stored.release(part)  # a tensor kept on disk: its pages leave memory once sent
    if pending:
        yield memoryview(pending)


# --- decoding ---------------------------------------------------------------------------------


class _Reader:
    """Reads exact byte counts out of an iterator of chunks of any size."""

    def __init__(self, chunks: Iterable[bytes | bytearray | memoryview]):
        self._chunks = iter(chunks)
        self._current = memoryview(b"")
        self.consumed = 0

    def _next_chunk(self) -> bool:
        for chunk in self._chunks:
            view = memoryview(chunk).cast("B")
            if len(view):
                self._current = view
                return True
        return False

    def readinto(self, target: memoryview, what: str) -> None:
        filled = 0
        destination = np.frombuffer(target, dtype=np.uint8)  # numpy copies faster than memoryview
        while filled < len(target):
            if not len(self._current) and not self._next_chunk():
                raise SerdeError(
                    f"payload ended early: {what} needs {len(target)} bytes, got {filled}"
                    f" (stream ended after {self.consumed} bytes)"
                )
            n = min(len(target) - filled, len(self._current))
            destination[filled : filled + n] = np.frombuffer(self._current[:n], dtype=np.uint8)
            self._current = self._current[n:]
            filled += n
            self.consumed += n

    def take(self, most: int, unit: int) -> memoryview | None:
        """Up to ``most`` bytes, a whole number of ``unit``s, as a view of the current chunk (no
        copy); None where the current chunk does not hold one unit whole (or the stream ended)."""
        if not len(self._current) and not self._next_chunk():
            return None
        n = min(most, len(self._current)) // unit * unit
        if not n:
            return None
        view, self._current = self._current[:n], self._current[n:]
        self.consumed += n
        return view

    def at_end(self) -> bool:
        return not len(self._current) and not self._next_chunk()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SerdeError(f"header: duplicate key {key!r}")
        out[key] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_header(raw: bytes) -> tuple[list[tuple[str, np.dtype, tuple[int, ...]]], dict[str, str]]:
    """Validate a header; return the arrays in data order and the string metadata."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise SerdeError(f"header is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SerdeError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SerdeError(f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SerdeError("header: __metadata__ must be an object of string -> string")
    entries = []
    for name, info in header.items():
        where = f"header: tensor {name!r}"
        if not name:
            raise SerdeError("header: a tensor has an empty name")
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SerdeError(f"{where} must have exactly dtype, shape and data_offsets")
        dtype = DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
        if dtype is None:
            raise SerdeError(
                f"{where}: dtype {info['dtype']!r} is not supported; supported: {', '.join(DTYPES)}"
            )
        shape, offsets = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise SerdeError(f"{where}: shape must be a list of non-negative ints, got {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise SerdeError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end")
        size = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != size:
            raise SerdeError(
                f"{where}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                f"{info['dtype']} {shape} needs {size}"
            )
        entries.append((offsets[0], offsets[1], name, dtype, tuple(shape)))
    entries.sort(key=lambda e: (e[0], e[1]))
    position = 0
    for begin, end, name, _, _ in entries:
        if begin != position:
            raise SerdeError(
                f"header: tensor {name!r} starts at byte {begin}, expected {position} "
                "(data must be contiguous, without gaps or overlaps)"
            )
        position = end
    return [(name, dtype, shape) for _, _, name, dtype, shape in entries], metadata


def _model_fields(metadata: dict[str, str]) -> dict[str, Any]:
    """Read atoll's fields from __metadata__; a plain safetensors file gets the defaults."""

    def load(key: str, default: Any) -> Any:
        if key not in metadata:
            return default
        try:
            return json.loads(metadata[key])
        except json.JSONDecodeError:
            raise SerdeError(f"header: __metadata__.{key} is not valid JSON") from None

    params_type = metadata.get("params_type", "full")
    if params_type not in PARAMS_TYPES:
        raise SerdeError(
            f"header: __metadata__.params_type must be full or diff, got {params_type!r}"
        )
    num_examples = load("num_examples", 0)
    metrics, round_, meta = load("metrics", {}), load("round", None), load("meta", {})
    if not _is_int(num_examples) or num_examples < 0:
        raise SerdeError("header: __metadata__.num_examples must be a non-negative int")
    if not isinstance(metrics, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise SerdeError("header: __metadata__.metrics must be an object of name -> number")
    if round_ is not None and not _is_int(round_):
        raise SerdeError("header: __metadata__.round must be an int or null")
    if not isinstance(meta, dict):
        raise SerdeError("header: __metadata__.meta must be an object")
    return {
        "params_type": params_type,
        "num_examples": num_examples,
        "metrics": metrics,
        "round": round_,
        "meta": meta,
    }


class ModelStream:
    """A model being received: its header (``model``, ``entries``) at once, its arrays on demand.

    Either ``read()`` the whole model, or take its data block by block (``blocks()``) to fold it
    into something else without ever materializing it (FedAvg does, so a 1 GB result needs no
    1 GB buffer on the server). Consume it once.
    """

    def __init__(self, chunks: Iterable[bytes | bytearray | memoryview]):
        self._reader = _Reader(chunks)
        length_bytes = bytearray(8)
        self._reader.readinto(memoryview(length_bytes), "the header length")
        (header_len,) = struct.unpack("<Q", length_bytes)
        if header_len < 2 or header_len > MAX_HEADER_BYTES:
            raise SerdeError(
                f"header length {header_len} is out of bounds (2..{MAX_HEADER_BYTES}); "
                "is this a safetensors model?"
            )
        raw = bytearray(header_len)
        self._reader.readinto(memoryview(raw), "the header")
        self.entries, metadata = parse_header(bytes(raw))
        self.model = Model(**_model_fields(metadata))  # params arrive with read() or blocks()
        # A quantized document's tables are read and checked now, before any code is used;
        # ``entries`` then name each tensor in the dtype it decodes to (atoll.fl.quantization).
        self._layout: quantization.Layout | None = None
        self._tables: dict[str, np.ndarray] = {}
        if quantization.METADATA_KEY in metadata:
            self._read_tables(metadata[quantization.METADATA_KEY])

    def _read_tables(self, raw: str) -> None:
        try:
            layout = quantization.parse_layout(raw, self.entries, DTYPES)
            count = layout.companions()
            for name, _, shape in self.entries[:count]:
                table = np.empty(shape, np.float32)
                self._reader.readinto(memoryview(table.reshape(-1).view(np.uint8)),
                                      f"tensor {name!r}")
                layout.check_scales(name, table)
                self._tables[name.removesuffix(quantization.SUFFIX)] = table
        except quantization.QuantizedPayloadError as exc:
            raise SerdeError(f"quantized payload refused: {exc}") from None
        except (MemoryError, ValueError) as exc:
            raise SerdeError(f"a quantization table cannot be allocated: {exc}") from None
        self._layout = layout
        self.entries = [(name, layout.tensors.get(name, dtype), shape)
                        for name, dtype, shape in self.entries[count:]]

    def _decoded(self, name: str, out: np.ndarray, first: int, codes: np.ndarray) -> None:
        """Read ``len(out)`` codes of tensor ``name`` from element ``first`` into ``codes``
        (scratch) and decode them into ``out``."""
        assert self._layout is not None
        self._reader.readinto(memoryview(codes), f"tensor {name!r}")
        quantization.decode_into(out, codes, first, self._tables[name], self._layout.block_size)

    def _finish(self) -> None:
        if not self._reader.at_end():
            raise SerdeError(
                "payload continues past the last tensor "
                f"(the header describes {self._reader.consumed} bytes)"
            )

    def read(self, spare: dict[str, np.ndarray] | None = None) -> Model:
        """The whole model, each array preallocated and filled from the chunks (one copy).

        ``spare``: arrays of an earlier model to fill again instead of allocating new ones,
        each only if its name, shape and dtype match and nothing else references it any more.
        """
        spare = spare if spare is not None else {}
        codes = np.empty(0, np.uint8)  # a quantized tensor's codes, a block at a time
        for name, dtype, shape in self.entries:
            array = _unused(spare.pop(name, None), shape, dtype)
            try:
                if array is None:
                    array = np.empty(shape, dtype=dtype)
            except (MemoryError, ValueError) as exc:
                raise SerdeError(
                    f"tensor {name!r} {list(shape)} cannot be allocated: {exc}"
                ) from None
            if name in self._tables:
                flat = array.reshape(-1)
                if len(codes) < min(flat.size, DECODED_VALUES):
                    codes = np.empty(min(flat.size, DECODED_VALUES), np.uint8)
                for start in range(0, flat.size, DECODED_VALUES):
                    part = flat[start : start + DECODED_VALUES]
                    self._decoded(name, part, start, codes[: part.size])
            elif array.nbytes:
                self._reader.readinto(
                    memoryview(array.reshape(-1).view(np.uint8)), f"tensor {name!r}"
                )
            self.model.params[name] = array
        self._finish()
        return self.model

    def blocks(self, block_bytes: int = CHUNK_SIZE) -> Iterator[tuple[str, int, np.ndarray]]:
        """Yield ``(name, first element, 1-D block)`` in data order, read-only: a view of the
        incoming chunk wherever whole elements lie in it (no copy), else a copy in one reused
        buffer (an element cut across two chunks). Use each block before asking for the next.
        Ends with the trailing-bytes check."""
        buffer = np.empty(0, dtype=np.uint8)  # made when an element is first cut in two
        for name, dtype, shape in self.entries:
            if name in self._tables:
                yield from self._decoded_blocks(name, dtype, math.prod(shape), block_bytes)
                continue
            total = math.prod(shape) * dtype.itemsize
            step = max(dtype.itemsize, block_bytes // dtype.itemsize * dtype.itemsize)
            done = 0
            while done < total:
                n = min(step, total - done)
                view = self._reader.take(n, dtype.itemsize)
                if view is not None:
                    block = np.frombuffer(view, dtype=dtype)
                    n = len(view)
                else:
                    if n > len(buffer):
                        buffer = np.empty(step, dtype=np.uint8)
                    copied = buffer[:n]
                    self._reader.readinto(memoryview(copied), f"tensor {name!r}")
                    block = copied.view(dtype)
                    block.flags.writeable = False  # the same promise as a view's
                yield name, done // dtype.itemsize, block
                done += n
        self._finish()

    def _decoded_blocks(self, name: str, dtype: np.dtype, size: int, block_bytes: int
                        ) -> Iterator[tuple[str, int, np.ndarray]]:
        """A quantized tensor's blocks, decoded to its dtype in one reused buffer."""
        step = max(1, min(size, block_bytes // dtype.itemsize))
        codes, out = np.empty(step, np.uint8), np.empty(step, dtype)
        for start in range(0, size, step):
            n = min(step, size - start)
            block = out[:n]
            self._decoded(name, block, start, codes[:n])
            block.flags.writeable = False  # the same promise as a plain block's
            yield name, start, block


def _unused(array: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """``array`` if it is ours to overwrite: it owns its memory and the only references left
    are this parameter and getrefcount's own (numpy's resize makes the same check before it
    reallocates). A variable anywhere, a view or a torch tensor from_numpy holds one more: such
    an array is left alone (tests/unit/fl/test_serde_spare.py pins this down)."""
    if (
        not isinstance(array, np.ndarray)
        or array.shape != tuple(shape)
        or array.dtype != dtype
        or not array.flags.owndata
        or not array.flags.writeable
        or sys.getrefcount(array) > 2
    ):
        return None
    return array


def open_model(chunks: Iterable[bytes | bytearray | memoryview]) -> ModelStream:
    """Read and validate a model's header; the arrays follow through the returned stream."""
    return ModelStream(chunks)


def decode(chunks: Iterable[bytes | bytearray | memoryview]) -> Model:
    """Rebuild a model from its chunks, filling preallocated arrays (one copy of the data)."""
    return ModelStream(chunks).read()


# --- files ------------------------------------------------------------------------------------


def save_file(model: Model, path: str | os.PathLike[str]) -> Path:
    """Write a model as a .safetensors file, streaming (atomic: written aside, then renamed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        for chunk in encode(model):
            f.write(chunk)
    os.replace(tmp, path)
    return path


def iter_file(path: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            yield chunk


def load_file(path: str | os.PathLike[str]) -> Model:
    """Read a .safetensors file (atoll's or any other tool's) into a Model."""
    try:
        return decode(iter_file(path))
    except SerdeError as exc:
        raise SerdeError(f"{path}: {exc}") from None
