"""Fixed-point encoding of an update for secure aggregation: masks need exact arithmetic.

Each site sends ``round(w * x * 2**f)`` as two's complement words (``w`` its example count,
``x`` its update), plus ``w`` itself, so the server learns the weighted sum and the total
weight, not any site's count. A variable's words are as wide as the variable (32 bits for
float32 and narrower, 64 for float64 and int64) unless app.yaml's
``privacy.secure_aggregation.word_bits`` is 64: a float32 model's masked reply is the size of
its plain one. Sums wrap modulo 2**32 or 2**64 (numpy's unsigned arithmetic), which is what
makes uniform masks hide each term and cancel in the sum.

The ring holds ``max_sum`` (``f = bits - 1 - ceil(log2(max_sum))``, spec.privacy.fraction_bits):
each site refuses an update whose ``w * |x|`` passes its share, ``max_sum / sites``, so the sum
of all sites never wraps past the sign. The rounding error is at most half the step 2**-f per
entry and site before dividing by the total weight (2**-16 in 32-bit words by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from atoll.spec.errors import AtollError
from atoll.spec.privacy import DEFAULT_MAX_SUM, SecureAggregation, fraction_bits

WEIGHT = "__secagg_weight__"  # the entry carrying the site's example count (64-bit words)
_BLOCK = 1 << 18  # elements converted at a time: a float64 scratch that stays in cache
_WORDS = {32: (np.uint32, np.int32, np.float32), 64: (np.uint64, np.int64, np.float64)}


class EncodingError(AtollError, ValueError):
    """An update that cannot be summed exactly; the message says what to change."""


@dataclass(frozen=True)
class Ring:
    """The fixed-point ring of a job: app.yaml ``privacy.secure_aggregation`` max_sum and
    word_bits, the same at every site and the server."""

    max_sum: float = DEFAULT_MAX_SUM
    word_bits: int = 32

    @classmethod
    def of(cls, settings: SecureAggregation | None) -> Ring:
        return cls() if settings is None else cls(settings.max_sum, settings.word_bits)

    def bits(self, dtype: np.dtype) -> int:
        """The word width of a variable of ``dtype``."""
        return 64 if self.word_bits == 64 or np.dtype(dtype).itemsize > 4 else 32

    def step(self, bits: int) -> float:
        """The fixed-point step of ``bits``-bit words."""
        return math.ldexp(1.0, -fraction_bits(bits, self.max_sum))


def encode(update: dict[str, np.ndarray], weight: int, sites: int, ring: Ring = Ring(),
           reuse: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The update's words; ``reuse``: arrays of an earlier call to fill again."""
    spare = reuse if reuse is not None else {}
    out: dict[str, np.ndarray] = {}
    for name, array in update.items():
        if array.dtype.kind not in "fiu":
            raise EncodingError(f"params[{name!r}] has dtype {array.dtype}: secure aggregation "
                                "sums numbers only")
        bits = ring.bits(array.dtype)
        unsigned, signed, _ = _WORDS[bits]
        scale = np.float64(weight / ring.step(bits))  # a float64 scalar: the product is too
        # each site's share of the ring; a hair under it, so float rounding never passes it
        limit = math.ldexp(1.0, bits - 1) / sites * (1 - 2.0**-40)
        flat = np.ascontiguousarray(array).reshape(-1)
        old = spare.get(name)
        words = (old.reshape(-1).view(signed) if old is not None and old.size == flat.size
                 and old.dtype == unsigned and old.flags.c_contiguous
                 else np.empty(flat.size, signed))
        scratch = np.empty(min(flat.size, _BLOCK), np.float64)
        for start in range(0, flat.size, _BLOCK):
            part = scratch[:min(_BLOCK, flat.size - start)]
            np.multiply(flat[start:start + len(part)], scale, out=part)  # exact in float64
            np.rint(part, out=part)
            # the range checked block by block, while the block is in cache
            low, high = float(part.min()), float(part.max())
            if not (math.isfinite(low) and math.isfinite(high)):
                raise EncodingError(f"params[{name!r}] holds NaN or infinite values: secure "
                                    "aggregation sums finite numbers only; check the training")
            if max(-low, high) > limit:
                largest = max(-float(flat.min()), float(flat.max()))
                raise EncodingError(
                    f"params[{name!r}]: num_examples x the update reaches "
                    f"{largest * weight:.3g}, above this site's share "
                    f"{ring.max_sum / sites:.3g} of privacy.secure_aggregation.max_sum "
                    f"({ring.max_sum:g} for {sites} sites), so the sum could overflow its "
                    "words; clip the update (privacy.dp.clip_norm or a clip filter), send a "
                    "smaller num_examples, or raise max_sum (a coarser step) or word_bits: 64")
            words[start:start + len(part)] = part  # exact: integral and inside the word
        out[name] = words.reshape(array.shape).view(unsigned)
    out[WEIGHT] = np.array([weight], dtype=np.uint64)
    return out


def decode(total: dict[str, np.ndarray], ring: Ring = Ring(), mean: bool = False
           ) -> tuple[dict[str, np.ndarray], float]:
    """The weighted sum (``mean``: divided by the total weight, in the same pass) and the total
    weight from an unmasked sum: float32 from 32-bit words, float64 from 64-bit ones, in the
    sum's own memory (a word and its float are one size)."""
    weight = float(total[WEIGHT][0])
    out: dict[str, np.ndarray] = {}
    for name, words in total.items():
        if name == WEIGHT:
            continue
        bits = words.dtype.itemsize * 8
        _, signed_type, real = _WORDS[bits]
        step = ring.step(bits) / (weight if mean and weight > 0 else 1.0)
        signed = words.view(signed_type).reshape(-1)
        values = signed.view(real)  # the same memory, filled block by block
        for start in range(0, signed.size, _BLOCK):
            block = signed[start:start + _BLOCK].astype(np.float64)
            np.multiply(block, step, out=block)
            values[start:start + _BLOCK] = block
        out[name] = values.reshape(words.shape)
    return out, weight
