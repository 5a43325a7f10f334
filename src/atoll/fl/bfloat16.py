"""bfloat16 in numpy, which has no such dtype: the raw 16-bit words under a tag, and the two
conversions FedAvg needs (exact widening to float32, and rounding back once).

``BF16`` is a one-field structured dtype (``[("bf16", "<u2")]``): two bytes per element, in
the layout torch and safetensors use (the upper half of a float32). Being structured, numpy
refuses arithmetic on it instead of silently treating the words as integers; widen first with
``to_float32``. ``atoll.fl.torch_bridge`` maps torch.bfloat16 tensors onto it without a copy,
and ``atoll.fl.serde`` writes it as safetensors "BF16".

``from_float32`` rounds to nearest, ties to even, as torch's ``Tensor.to(torch.bfloat16)``
does (NaN stays a NaN), so an average computed in float32 and rounded here equals torch's.
"""

from __future__ import annotations

import numpy as np

BF16 = np.dtype([("bf16", "<u2")])
_BLOCK = 1 << 20  # elements per pass of from_float32 (4 MiB of scratch)


def is_bf16(dtype: np.dtype) -> bool:
    return dtype == BF16


def words(array: np.ndarray) -> np.ndarray:
    """The raw 16-bit words of a BF16 array, as uint16 (a view, no copy)."""
    if array.dtype != BF16:
        raise TypeError(f"expected a bfloat16 array (atoll.fl.bfloat16.BF16), got {array.dtype}")
    return array.view(np.uint16)


def from_words(raw: np.ndarray) -> np.ndarray:
    """uint16 words (or int16, as torch views them) as a BF16 array (a view, no copy)."""
    if raw.dtype.itemsize != 2 or raw.dtype.kind not in "iu":
        raise TypeError(f"bfloat16 words are 16-bit integers, got {raw.dtype}")
    return raw.view(BF16)


def to_float32(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A BF16 array widened to float32 (exact: bf16 is float32's upper half)."""
    bits = words(array)
    if out is None:
        out = np.empty(bits.shape, np.float32)
    wide = out.view(np.uint32)
    np.left_shift(bits, 16, out=wide, dtype=np.uint32)
    return out


def from_float32(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values rounded once to bfloat16 (nearest, ties to even, as torch; a NaN becomes
    the quiet NaN 0x7FC0, where torch's vector path writes 0xFFFF: both NaN).
    Block by block, so a large tensor needs only a few MiB of scratch."""
    values = np.asarray(values, dtype=np.float32)
    if out is None:
        out = np.empty(values.shape, BF16)
    flat_in = values.reshape(-1).view(np.uint32)
    flat_out = words(out).reshape(-1)
    rounded = np.empty(min(len(flat_in), _BLOCK), np.uint32)
    for start in range(0, len(flat_in), _BLOCK):
        bits = flat_in[start : start + _BLOCK]
        r = rounded[: len(bits)]
        # bias = 0x7FFF + the lowest bit kept: adding it, then dropping 16 bits, rounds half even
        np.right_shift(bits, 16, out=r)
        r &= 1
        r += 0x7FFF
        r += bits
        r >>= 16
        r[(bits & 0x7FFFFFFF) > 0x7F800000] = 0x7FC0  # NaN
        flat_out[start : start + len(bits)] = r
    return out


def widen(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as ``dtype`` (a new array), widening bfloat16 first where it is one."""
    if array.dtype == BF16:
        return to_float32(array).astype(dtype, copy=False)
    return np.array(array, dtype=dtype)  # (np.array keeps 0-d arrays arrays)


def narrow(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` in ``dtype``; to bfloat16 by one rounding from float32."""
    if dtype == BF16:
        return from_float32(array.astype(np.float32, copy=False))
    return array.astype(dtype, copy=False)
