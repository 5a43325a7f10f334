"""8-bit quantized exchange: a model's float tensors as one byte per value, block by block.

Each float tensor of at least ``min_elements`` values is cut, flattened, into blocks of
``block_size`` values. A block spanning [lo, hi] travels as its ``lo`` and ``step`` =
(hi - lo) / 255 (two float32s) and one code per value, code = round((x - lo) / step) in 0..255;
the receiver takes lo + code * step, which is within step / 2 of x (float rounding aside), and
rounds that once to the tensor's own dtype (bfloat16, float16, float32 or float64). Float32
tensors then take a little over a quarter of their bytes (8 bytes of lo/step per block: 3 % at
the default 256), half-precision ones a little over half. Integer, bool, tiny and non-finite
tensors travel as they are.

On the wire it is still a safetensors document (``atoll.fl.serde``): the codes under the
tensor's own name, as U8 of its shape, and its blocks' (lo, step) as an F32 ``[blocks, 2]``
companion named ``<name>#q8``. Every companion comes first in data order, so a receiver reads
and checks them all before any code is used (``Layout.check_scales``): a malformed payload is
refused whole, never after part of it was folded into a sum. ``__metadata__["quantized"]``
says which tensors are quantized and in what dtype they decode:
``{"scheme": "q8", "block_size": 256, "tensors": {"fc.weight": "BF16"}}``.

This module is the codec and the check of a received layout; serde reads and writes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from atoll.fl import bfloat16
from atoll.spec.errors import EXIT_INVALID, AtollError

METADATA_KEY = "quantized"
SCHEME = "q8"
SUFFIX = "#q8"  # the companion of tensor "w" is "w#q8"
LEVELS = 255  # codes 0..255
MIN_BLOCK, MAX_BLOCK = 16, 1 << 16
DEFAULT_BLOCK = 256
DEFAULT_MIN_ELEMENTS = 1024
# The tables are read whole before any code: a received document may hold at most this much of
# them (an 8 GiB bf16 model at 256 a block needs 128 MiB)
MAX_TABLE_BYTES = 1 << 30
_WORK = 1 << 20  # values per pass of the encoder and decoder: a few MiB of scratch
_DECODED = ("F16", "BF16", "F32", "F64")  # dtypes a quantized tensor may decode to


class Settings(Protocol):
    """What the sender needs (app.yaml's ``{type: quantize}`` filter has both)."""

    block_size: int
    min_elements: int


class QuantizedPayloadError(AtollError, ValueError):
    """A received quantized payload that does not hold together; serde refuses it with this."""

    exit_code = EXIT_INVALID


def _wide(values: np.ndarray) -> np.ndarray:
    """Values as float64, whatever float dtype they are in (bf16 widened exactly)."""
    if bfloat16.is_bf16(values.dtype):
        return bfloat16.to_float32(values).astype(np.float64)
    return values.astype(np.float64)


def _numeric(values: np.ndarray) -> np.ndarray:
    """Values numpy can compare: bf16 widened (exactly) to float32, the others as they are."""
    return bfloat16.to_float32(values) if bfloat16.is_bf16(values.dtype) else values


def quantizable(array: np.ndarray, min_elements: int) -> bool:
    """Whether ``array`` travels quantized: a float tensor of ``min_elements`` values or more."""
    return (bfloat16.is_bf16(array.dtype) or array.dtype.kind == "f") and array.size >= max(
        1, min_elements)


def scales(array: np.ndarray, block_size: int) -> np.ndarray | None:
    """The (lo, step) of each block of ``array`` as float32 ``[blocks, 2]``; None when it cannot
    be quantized (a non-finite value, or a range float32 cannot hold)."""
    flat = array.reshape(-1)
    blocks = math.ceil(flat.size / block_size)
    out = np.empty((blocks, 2), np.float32)
    work = max(block_size, _WORK // block_size * block_size)
    for start in range(0, flat.size, work):
        x = _numeric(flat[start : start + work])
        if not np.isfinite(x).all():
            return None
        bounds = np.arange(0, x.size, block_size)  # min and max are exact in any dtype
        lo = np.minimum.reduceat(x, bounds).astype(np.float64)
        hi = np.maximum.reduceat(x, bounds).astype(np.float64)
        with np.errstate(over="ignore"):
            lo32 = lo.astype(np.float32)
            # lo rounded down and step up in float32, so every value lies in [lo, lo + 255 step]
            lo32 = np.where(lo32 > lo, np.nextafter(lo32, np.float32(-np.inf)), lo32)
            step = (hi - lo32.astype(np.float64)) / LEVELS
            step32 = step.astype(np.float32)
            step32 = np.where(step32 < step, np.nextafter(step32, np.float32(np.inf)), step32)
        if not (np.isfinite(lo32).all() and np.isfinite(step32).all()):
            return None
        row = start // block_size
        out[row : row + len(bounds), 0] = lo32
        out[row : row + len(bounds), 1] = step32
    return out


def codes(array: np.ndarray, table: np.ndarray, block_size: int,
          work: int = _WORK) -> Iterator[np.ndarray]:
    """The codes of ``array``'s values, in order, at most ``work`` at a time (uint8); the
    float64 scratch stays a few MiB whatever ``work`` is."""
    flat = array.reshape(-1)
    work = max(block_size, min(work, _WORK) // block_size * block_size)
    for start in range(0, flat.size, work):
        x = _wide(flat[start : start + work])
        rows = table[start // block_size : (start + x.size - 1) // block_size + 1]
        lo = np.repeat(rows[:, 0].astype(np.float64), block_size)[: x.size]
        step = np.repeat(rows[:, 1].astype(np.float64), block_size)[: x.size]
        x -= lo
        np.divide(x, step, out=x, where=step > 0)
        x[step == 0] = 0
        np.rint(x, out=x)
        np.clip(x, 0, LEVELS, out=x)
        yield x.astype(np.uint8)


def decode_into(out: np.ndarray, codes_: np.ndarray, first: int, table: np.ndarray,
                block_size: int) -> np.ndarray:
    """Write the values of ``codes_`` (elements ``first``.. of a tensor) into ``out`` (1-D, the
    tensor's own dtype): lo + code x step, computed in float32 (float64 for float64), then
    rounded once to that dtype."""
    wide = np.float64 if out.dtype == np.float64 else np.float32
    skip = first % block_size  # the first block may be entered part way
    rows = table[first // block_size : (first + codes_.size - 1) // block_size + 1].astype(wide)
    values = codes_.astype(wide)
    values *= np.repeat(rows[:, 1], block_size)[skip : skip + codes_.size]
    values += np.repeat(rows[:, 0], block_size)[skip : skip + codes_.size]
    if bfloat16.is_bf16(out.dtype):
        bfloat16.from_float32(values, out=out)
    else:
        out[...] = values
    return out


def dequantize(codes_: np.ndarray, table: np.ndarray, block_size: int,
               dtype: np.dtype) -> np.ndarray:
    """A whole tensor back in ``dtype`` from its codes (of its shape) and its (lo, step) table."""
    out = np.empty(codes_.shape, dtype)
    flat, wanted = out.reshape(-1), codes_.reshape(-1)
    for start in range(0, flat.size, _WORK):
        decode_into(flat[start : start + _WORK], wanted[start : start + _WORK], start, table,
                    block_size)
    return out


# --- the sender's plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One tensor as it will travel: quantized (``table`` set) or as it is."""

    name: str
    array: np.ndarray
    table: np.ndarray | None = None


def plan(params: dict[str, np.ndarray], settings: Settings, dtype_name: Any
         ) -> tuple[list[tuple[str, np.ndarray]], list[Planned], str | None]:
    """What ``serde.encode`` writes for ``params``: the companions (first in data order), each
    tensor as it will travel, and the metadata value (None when nothing is quantized).
    ``dtype_name`` is serde's (numpy dtype -> safetensors name)."""
    if not MIN_BLOCK <= settings.block_size <= MAX_BLOCK:
        raise ValueError(f"block_size must be {MIN_BLOCK}..{MAX_BLOCK}, got {settings.block_size}")
    clash = [name for name in params if name.endswith(SUFFIX)]
    if clash:
        raise ValueError(f"tensor names ending in {SUFFIX!r} are reserved for quantized "
                         f"exchange: {clash[:3]}; rename them or leave quantize out")
    companions: list[tuple[str, np.ndarray]] = []
    planned: list[Planned] = []
    decoded: dict[str, str] = {}
    for name, array in params.items():
        table = (scales(array, settings.block_size)
                 if quantizable(array, settings.min_elements) else None)
        if table is None:
            planned.append(Planned(name, array))
            continue
        companions.append((name + SUFFIX, table))
        planned.append(Planned(name, array, table))
        decoded[name] = dtype_name(array.dtype)
    if not decoded:
        return [], planned, None
    if sum(table.nbytes for _, table in companions) > MAX_TABLE_BYTES:
        raise ValueError(f"quantize: the lo/step tables would take more than {MAX_TABLE_BYTES} "
                         f"bytes, which receivers refuse; raise block_size "
                         f"({settings.block_size})")
    value = json.dumps({"scheme": SCHEME, "block_size": settings.block_size,
                        "tensors": decoded}, separators=(",", ":"))
    return companions, planned, value


# --- the receiver's check ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A received document's quantized tensors: name -> the dtype it decodes to."""

    block_size: int
    tensors: dict[str, np.dtype]

    def companions(self) -> int:
        return len(self.tensors)

    def check_scales(self, name: str, table: np.ndarray) -> None:
        """Refuse a (lo, step) table that would decode to non-finite or meaningless values."""
        name = name.removesuffix(SUFFIX)
        lo, step = table[:, 0], table[:, 1]
        if not (np.isfinite(lo).all() and np.isfinite(step).all()):
            raise QuantizedPayloadError(f"tensor {name!r}: a block's lo or step is not finite")
        if (step < 0).any():
            raise QuantizedPayloadError(f"tensor {name!r}: a block's step is negative")
        with np.errstate(over="ignore"):
            top = lo + np.float32(LEVELS) * step
        if not np.isfinite(top).all():
            raise QuantizedPayloadError(f"tensor {name!r}: a block's range leaves float32")


def parse_layout(raw: str, entries: list[tuple[str, np.dtype, tuple[int, ...]]],
                 dtypes: dict[str, np.dtype]) -> Layout:
    """Check ``__metadata__["quantized"]`` against the header's tensors (in data order): every
    quantized tensor is U8 with an F32 ``[blocks, 2]`` companion, the companions come first and
    nothing else is one. Raises QuantizedPayloadError naming what is wrong."""
    try:
        info = json.loads(raw)
    except json.JSONDecodeError:
        raise QuantizedPayloadError("__metadata__.quantized is not valid JSON") from None
    if not isinstance(info, dict) or set(info) != {"scheme", "block_size", "tensors"}:
        raise QuantizedPayloadError("__metadata__.quantized must have exactly scheme, "
                                    "block_size and tensors")
    if info["scheme"] != SCHEME:
        raise QuantizedPayloadError(f"quantization scheme {info['scheme']!r} is not supported "
                                    f"(only {SCHEME!r})")
    block = info["block_size"]
    if not isinstance(block, int) or isinstance(block, bool) or not (
            MIN_BLOCK <= block <= MAX_BLOCK):
        raise QuantizedPayloadError(f"quantized block_size must be an int in {MIN_BLOCK}.."
                                    f"{MAX_BLOCK}, got {block!r}")
    tensors = info["tensors"]
    if not isinstance(tensors, dict) or not tensors or not all(
            isinstance(v, str) and v in _DECODED for v in tensors.values()):
        raise QuantizedPayloadError(f"__metadata__.quantized.tensors must name each quantized "
                                    f"tensor's dtype, one of {', '.join(_DECODED)}")
    kinds = {name: (dtype, shape) for name, dtype, shape in entries}
    table_bytes = 0
    for name in tensors:
        where = f"quantized tensor {name!r}"
        if name not in kinds or kinds[name][0] != np.dtype(np.uint8):
            raise QuantizedPayloadError(f"{where}: its codes must be a U8 tensor of its name")
        blocks = math.ceil(math.prod(kinds[name][1]) / block)
        companion = kinds.get(name + SUFFIX)
        if companion is None or companion[0] != np.dtype(np.float32) or companion[1] != (
                blocks, 2):
            raise QuantizedPayloadError(f"{where}: needs an F32 [{blocks}, 2] tensor "
                                        f"{name + SUFFIX!r} (lo and step of each block)")
        table_bytes += blocks * 8
    if table_bytes > MAX_TABLE_BYTES:
        raise QuantizedPayloadError(f"the lo/step tables take {table_bytes} bytes, more than "
                                    f"{MAX_TABLE_BYTES}: the sender should use a larger "
                                    "block_size")
    first = [name for name, _, _ in entries[: len(tensors)]]
    if sorted(first) != sorted(n + SUFFIX for n in tensors):
        raise QuantizedPayloadError("the quantized tensors' lo/step tables must come first in "
                                    "data order")
    orphans = [n for n, _, _ in entries[len(tensors):] if n.endswith(SUFFIX)]
    if orphans:
        raise QuantizedPayloadError(f"tensor {orphans[0]!r} is named as a quantization table "
                                    "but no quantized tensor has it")
    return Layout(block, {name: dtypes[kind] for name, kind in tensors.items()})
