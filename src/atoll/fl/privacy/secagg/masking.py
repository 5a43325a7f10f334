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


def encode(update: dict[str, np.ndarray], weight: int, sites: int) -> dict[str, np.ndarray]:
    scale = float(2**SCALE_BITS) * weight
    out: dict[str, np.ndarray] = {}
    for name, array in update.items():
        if array.dtype.kind not in "fiu":
            raise EncodingError(f"params[{name!r}] has dtype {array.dtype}: secure aggregation "
                                "sums numbers only")
        values = array.astype(np.float64)  # one float64 buffer, worked on in place
        values *= scale
        np.rint(values, out=values)
        if values.size and max(-float(values.min()), float(values.max())) * sites >= _LIMIT:
            raise EncodingError(
                f"params[{name!r}]: num_examples x the update reaches "
                f"{float(np.max(np.abs(array))) * weight:.3g}, too large to sum exactly "
                f"(limit {_LIMIT / 2**SCALE_BITS / sites:.3g} per site); clip the update (privacy.dp.clip_norm or a clip "
                "filter) or send a smaller num_examples")
        out[name] = values.astype(np.int64).view(np.uint64)
    out[WEIGHT] = np.array([weight], dtype=np.uint64)
    return out


def decode(total: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """The weighted sum (float64) and the total weight from an unmasked sum."""
    weight = float(total[WEIGHT][0])
    scale = float(2**SCALE_BITS)
    return ({name: a.view(np.int64).astype(np.float64) / scale
             for name, a in total.items() if name != WEIGHT}, weight)
