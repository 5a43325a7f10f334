"""Aggregators a workflow hands to ``ctx.gather``: one instance per task, fed each site's result.

- ``WeightedAverage``: the example-weighted mean (FedAvg), folded in as results stream in, one
  model in memory whatever the number of sites (``atoll.fl.aggregation.WeightedMean``).
- ``CoordinateMedian``: per coordinate, the median of the sites' values (Yin et al. 2018).
- ``TrimmedMean``: per coordinate, the mean after dropping the ``trim`` fraction of the lowest
  and of the highest values (Yin et al. 2018); ``trim=0`` is the plain mean.

The robust two hold every result (they need all values of a coordinate at once) and ignore
``num_examples``: a site could inflate its weight. A result of ``params_type="diff"`` is turned
into weights with the ``reference`` (the global model sent). Write your own by following the
``Aggregator`` protocol of ``atoll.fl.workflows.api``: ``add(site, model)`` and ``result()``.
"""

from __future__ import annotations

import math
import os

import numpy as np

from atoll.fl import bfloat16
from atoll.fl.aggregation import ResultRejected, WeightedMean
from atoll.fl.model import Model
from atoll.fl.serde import ModelStream

Params = dict[str, np.ndarray]


class WeightedAverage:
    """Example-weighted mean; see ``WeightedMean`` for ``reference``, ``reuse_reference``
    and ``spill`` (the sum in a file in that folder)."""

    def __init__(self, reference: Params | None = None, *, reuse_reference: bool = False,
                 spill: str | os.PathLike[str] | None = None):
        self._mean = WeightedMean(reference, reuse_reference=reuse_reference, spill=spill)

    @property
    def total_weight(self) -> float:
        return self._mean.total_weight

    def check(self, model: Model) -> None:
        self._mean.check(model)

    def add(self, site: str, model: Model) -> None:
        self._mean.add(model)

    def add_stream(self, site: str, stream: ModelStream) -> Model:
        return self._mean.add_stream(stream)

    def result(self) -> Params:
        return self._mean.result()


class _Collected:
    """Holds every result as full float64 params, checked against the first one's names/shapes."""

    def __init__(self, reference: Params | None = None):
        self.reference = reference
        self.values: dict[str, list[np.ndarray]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.sites: list[str] = []

    def check(self, model: Model) -> None:
        if not model.params:
            raise ResultRejected("sent no params: a train result needs fl.Model(params=...)")
        if model.params_type == "diff" and not self.reference:
            raise ResultRejected("sent params_type='diff' but the server has no global model")
        expected = self.reference or ({k: v[0] for k, v in self.values.items()} or None)
        if expected is None:
            return
        if set(expected) != set(model.params):
            raise ResultRejected(
                f"params names differ from the others: missing "
                f"{sorted(set(expected) - set(model.params))[:5]}, unexpected "
                f"{sorted(set(model.params) - set(expected))[:5]}"
            )
        for name, array in model.params.items():
            if array.shape != expected[name].shape:
                raise ResultRejected(
                    f"params[{name!r}] has shape {list(array.shape)}, expected "
                    f"{list(expected[name].shape)}"
                )

    def add(self, site: str, model: Model) -> None:
        self.check(model)
        for name, array in model.params.items():
            value = bfloat16.widen(array, np.dtype(np.float64))
            if model.params_type == "diff":
                assert self.reference is not None
                value = value + bfloat16.widen(self.reference[name], np.dtype(np.float64))
            self.values.setdefault(name, []).append(value)
            self.dtypes.setdefault(name, (self.reference or model.params)[name].dtype)
        self.sites.append(site)

    def combine(self, reduce) -> Params:  # noqa: ANN001 - (stacked values) -> array
        if not self.sites:
            raise ValueError("no results to aggregate")
        out: Params = {}
        for name, values in self.values.items():
            value = reduce(np.stack(values))
            dtype = self.dtypes[name]
            if dtype.kind in "iub":
                value = np.rint(value)
            out[name] = bfloat16.narrow(np.asarray(value), dtype)
        return out


class CoordinateMedian(_Collected):
    """Per coordinate, the median over the sites' results."""

    def result(self) -> Params:
        return self.combine(lambda stacked: np.median(stacked, axis=0))


class TrimmedMean(_Collected):
    """Per coordinate, the mean without the ``floor(trim * n)`` lowest and highest values."""

    def __init__(self, trim: float = 0.2, reference: Params | None = None):
        if not 0 <= trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {trim}")
        super().__init__(reference)
        self.trim = trim

    def result(self) -> Params:
        cut = math.floor(self.trim * len(self.sites))

        def reduce(stacked: np.ndarray) -> np.ndarray:
            ordered = np.sort(stacked, axis=0)
            return ordered[cut : len(ordered) - cut].mean(axis=0)

        return self.combine(reduce)
