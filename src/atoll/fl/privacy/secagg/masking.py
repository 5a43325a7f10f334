"""Fixed-point encoding of an update for secure aggregation: masks need exact arithmetic.

Each site sends ``round(w * x * 2**SCALE_BITS)`` as 64-bit two's complement words (``w`` its
example count, ``x`` its update), plus ``w`` itself, so the server learns the weighted sum and
the total weight, not any site's count. Sums wrap modulo 2**64 (numpy's uint64 arithmetic),
which is what makes uniform masks hide each term and cancel in the sum. The rounding error is
at most 2**-25 per entry and site before dividing by the total weight.
"""

from __future__ import annotations

import numpy as np

from atoll.spec.errors import AtollError

SCALE_BITS = 24
WEIGHT = "__secagg_weight__"  # the entry carrying the site's example count
_LIMIT = 2.0**62  # the sum of all sites' encoded values must stay inside int64


class EncodingError(AtollError, ValueError):
    """An update too large to encode exactly; the message says what to change."""


_BLOCK = 1 << 18  # elements converted at a time: a float64 scratch that stays in cache


def encode(update: dict[str, np.ndarray], weight: int, sites: int,
           reuse: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The update's words; ``reuse``: uint64 arrays of an earlier call to fill again."""
    spare = reuse if reuse is not None else {}
    scale = float(2**SCALE_BITS) * weight
    limit = _LIMIT / sites
    out: dict[str, np.ndarray] = {}
    for name, array in update.items():
        if array.dtype.kind not in "fiu":
            raise EncodingError(f"params[{name!r}] has dtype {array.dtype}: secure aggregation "
                                "sums numbers only")
        flat = np.ascontiguousarray(array).reshape(-1)
        largest = max(-float(flat.min()), float(flat.max())) if flat.size else 0.0
        if np.rint(largest * scale) >= limit or not np.isfinite(largest):
            raise EncodingError(
                f"params[{name!r}]: num_examples x the update reaches {largest * weight:.3g}, "
                f"too large to sum exactly (limit {limit / 2**SCALE_BITS:.3g} per site); clip "
                "the update (privacy.dp.clip_norm or a clip filter) or send a smaller "
                "num_examples")
        old = spare.get(name)
        words = (old.reshape(-1).view(np.int64) if old is not None and old.size == flat.size
                 and old.flags.c_contiguous else np.empty(flat.size, np.int64))
        scratch = np.empty(min(flat.size, _BLOCK), np.float64)
        for start in range(0, flat.size, _BLOCK):
            part = scratch[:min(_BLOCK, flat.size - start)]
            np.multiply(flat[start:start + len(part)], scale, out=part)
            np.rint(part, out=part)
            words[start:start + len(part)] = part  # exact: integral and inside int64
        out[name] = words.reshape(array.shape).view(np.uint64)
    out[WEIGHT] = np.array([weight], dtype=np.uint64)
    return out


def decode(total: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """The weighted sum (float64) and the total weight from an unmasked sum; the sum's buffers
    are reused for the result (int64 and float64 have the same size)."""
    weight = float(total[WEIGHT][0])
    scale = 1.0 / float(2**SCALE_BITS)
    out: dict[str, np.ndarray] = {}
    for name, words in total.items():
        if name == WEIGHT:
            continue
        signed = words.view(np.int64).reshape(-1)
        values = signed.view(np.float64)  # the same memory, filled block by block
        for start in range(0, signed.size, _BLOCK):
            block = signed[start:start + _BLOCK].astype(np.float64)
            np.multiply(block, scale, out=values[start:start + _BLOCK])
        out[name] = values.reshape(words.shape)
    return out, weight
