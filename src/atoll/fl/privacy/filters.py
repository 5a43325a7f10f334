"""The built-in filters, as pure functions on an update (named numpy arrays).

A filter never changes the names or shapes of an update, so every site's reply still adds up
with the others (and under secure aggregation, into one fixed-size vector): a value that must
not be shared becomes zero, which in a diff means "no change".

- ``exclude``: variables whose names match a pattern (fnmatch) are not shared (zeroed).
- ``percentile``: only the largest-magnitude ``fraction`` of all entries is shared (exactly
  ceil(fraction * N) entries; the others are zeroed), as FLARE's percentile privacy does.
- ``clip``: the whole update is scaled so its L2 norm is at most ``max_norm``.
- ``gaussian``: N(0, (noise_multiplier * C)^2) is added to every entry, C being the norm of the
  clip before it (the Gaussian mechanism of DP-FedAvg).
- ``quantize``: nothing here; it is how the update travels (``atoll.fl.serde`` encodes it, 8-bit,
  with ``atoll.fl.quantization``), so the spec keeps it last, after every change above.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from atoll.spec.privacy import (
    ClipFilter,
    ExcludeFilter,
    GaussianFilter,
    PercentileFilter,
    QuantizeFilter,
)

Params = dict[str, np.ndarray]


def _floating(update: Params) -> list[str]:
    return [name for name, a in update.items() if a.dtype.kind == "f" and a.size]


def exclude(update: Params, patterns: Iterable[str]) -> Params:
    patterns = list(patterns)
    return {name: (np.zeros_like(a) if any(fnmatch.fnmatchcase(name, p) for p in patterns) else a)
            for name, a in update.items()}


def excluded_dropped(update: Params, patterns: Iterable[str]) -> Params:
    patterns = list(patterns)
    return {name: a for name, a in update.items()
            if not any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def percentile(update: Params, fraction: float) -> Params:
    names = _floating(update)
    total = sum(update[n].size for n in names)
    keep = math.ceil(fraction * total)
    if keep >= total:
        return dict(update)
    flat = np.concatenate([np.abs(update[n], dtype=np.float64).ravel() for n in names])
    # the indices of the `keep` largest magnitudes: exactly that many, ties broken by position
    kept = np.zeros(total, dtype=bool)
    kept[np.argpartition(-flat, keep - 1, kind="introselect")[:keep]] = True
    out, start = dict(update), 0
    for name in names:
        size = update[name].size
        mask = kept[start:start + size].reshape(update[name].shape)
        out[name] = np.where(mask, update[name], 0).astype(update[name].dtype)
        start += size
    return out


def l2_norm(update: Params) -> float:
    return math.sqrt(sum(float(np.sum(np.square(update[n], dtype=np.float64)))
                         for n in _floating(update)))


def clip(update: Params, max_norm: float) -> Params:
    norm = l2_norm(update)
    if norm <= max_norm:
        return dict(update)
    scale = max_norm / norm
    return {name: (a * a.dtype.type(scale) if a.dtype.kind == "f" else a)
            for name, a in update.items()}


def gaussian(update: Params, std: float, rng: np.random.Generator) -> Params:
    return {name: ((a + rng.normal(0.0, std, a.shape)).astype(a.dtype) if a.dtype.kind == "f"
                   else a) for name, a in update.items()}


def apply(pipeline: list[Any], update: Params, rng: np.random.Generator | None = None,
          *, drop_excluded: bool = False) -> Params:
    """Run ``pipeline`` (spec filter models, in order) on ``update``; returns a new dict.

    ``drop_excluded`` (tasks: full weights, not a diff) removes excluded variables instead of
    zeroing them: the site script keeps its own values for them."""
    rng = rng if rng is not None else np.random.default_rng()  # seeded from the OS
    clip_norm: float | None = None
    for spec in pipeline:
        if isinstance(spec, ExcludeFilter):
            update = (excluded_dropped(update, spec.patterns) if drop_excluded
                      else exclude(update, spec.patterns))
        elif isinstance(spec, PercentileFilter):
            update = percentile(update, spec.fraction)
        elif isinstance(spec, ClipFilter):
            update, clip_norm = clip(update, spec.max_norm), spec.max_norm
        elif isinstance(spec, GaussianFilter):
            if clip_norm is None:  # spec.privacy refuses this order; never noise unscaled
                raise ValueError("a gaussian filter needs a clip filter before it")
            update = gaussian(update, spec.noise_multiplier * clip_norm, rng)
        elif isinstance(spec, QuantizeFilter):
            continue  # the wire encoding, applied as the model is sent
        else:
            raise TypeError(f"unknown filter {spec!r}")
    return update
