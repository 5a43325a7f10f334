"""FLARE's tabular statistics generators on atoll's federated statistics.

A FLARE statistics job (``FedStatsRecipe``) runs the user's generator at each site: a
``DFStatisticsCore`` subclass whose ``load_data(fl_ctx)`` gives each dataset ("train",
"test"...) as a pandas DataFrame. ``atoll job import-flare`` points the generator's imports of
FLARE (``nvflare.apis.fl_context``, ``nvflare.app_common.abstract.statistics_spec``,
``nvflare.app_opt.statistics.df.df_core_statistics``) here and writes a site script that
calls ``serve_generator(Generator(**args))``.

What the generator gives is its data, never its numbers: ``serve_generator`` initializes it
(``initialize(fl_ctx)``, which loads the tables), then answers the job's questions with
``atoll.fl.statistics.serve_values`` over those tables, column ``DATASET/FEATURE`` (for example
``train/Age``): atoll's own code computes every released number under this site's statistics
rules (min_count, precision, dp, max_queries), as for any atoll statistics job. The generator's
own ``count``/``sum``/``histogram``... are not called; a generator that has no DataFrames
(a plain ``Statistics`` implementation) cannot be served, and says so.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

import atoll.client as fl
from atoll.fl.statistics import StatisticsError, serve_values

__all__ = ["Bin", "BinRange", "DFStatisticsCore", "DataType", "FLContext", "Feature",
           "Histogram", "HistogramType", "StatisticConfig", "Statistics", "serve_generator"]

SEPARATOR = "/"  # a column is DATASET/FEATURE


class DataType(IntEnum):
    INT = 0
    FLOAT = 1
    STRING = 2
    BYTES = 3
    STRUCT = 4
    DATETIME = 5


class BinRange(NamedTuple):
    min_value: float
    max_value: float


class Bin(NamedTuple):
    low_value: float
    high_value: float
    sample_count: float


class HistogramType(IntEnum):
    STANDARD = 0
    QUANTILES = 1


class Histogram(NamedTuple):
    hist_type: HistogramType
    bins: list[Bin]
    hist_name: str | None = None


class Feature(NamedTuple):
    feature_name: str
    data_type: DataType


class StatisticConfig(NamedTuple):
    name: str
    config: dict


class FLContext:
    """What a generator reads of FLARE's ``FLContext``: the site's name, the job's id, and
    properties (none: atoll's site hands a job none)."""

    def get_identity_name(self, default: str = "") -> str:
        return fl.site_name() or default

    def get_job_id(self, default: Any = None) -> Any:
        return fl.job_id() or default

    def get_prop(self, key: Any, default: Any = None) -> Any:
        return default


class Statistics:
    """FLARE's ``Statistics`` spec: its hooks, for a generator's ``super()`` calls."""

    def initialize(self, fl_ctx: FLContext) -> None:
        pass

    def finalize(self, fl_ctx: FLContext) -> None:
        pass


class DFStatisticsCore(Statistics):
    """FLARE's ``DFStatisticsCore``: ``self.data`` holds each dataset as a DataFrame."""

    def __init__(self, max_bin: int | None = None) -> None:
        super().__init__()
        self.data: dict[str, Any] | None = None
        self.max_bin = max_bin

    def load_data(self, fl_ctx: FLContext) -> dict[str, Any]:
        raise NotImplementedError("the generator must implement load_data(fl_ctx)")

    def initialize(self, fl_ctx: FLContext) -> None:
        self.data = self.load_data(fl_ctx)

    def features(self) -> dict[str, list[Feature]]:
        return {name: [Feature(str(f), DataType.FLOAT) for f in frame]
                for name, frame in (self.data or {}).items()}


def serve_generator(generator: Any) -> None:
    """A site's whole part of an imported FLARE statistics job: initialize ``generator`` and
    answer the job's statistics tasks from its DataFrames under this site's rules."""
    fl.init()
    context = FLContext()
    generator.initialize(context)
    tables = getattr(generator, "data", None)
    if not isinstance(tables, dict) or not all(hasattr(t, "columns") for t in tables.values()):
        raise StatisticsError(
            f"{type(generator).__name__}: atoll serves a FLARE statistics generator from its "
            "DataFrames (DFStatisticsCore's data, set by initialize/load_data); this one has "
            "none, and its own statistics are not released (the site's rules compute them)")
    try:
        serve_values(lambda asked: _values(tables, asked), type(generator).__name__)
    finally:
        generator.finalize(context)


def _values(tables: dict[str, Any], asked: list[str]) -> dict[str, np.ndarray]:
    import pandas as pd  # FLARE's generators are pandas code; only their sites need it

    known = [f"{d}{SEPARATOR}{c}" for d, t in tables.items() for c in t.columns]
    out = {}
    for column in asked:
        dataset, _, feature = column.partition(SEPARATOR)
        frame = tables.get(dataset)
        if frame is None or feature not in frame.columns:
            raise StatisticsError(f"no column {column!r}; the generator's columns: "
                                  f"{', '.join(known)}")
        numbers = pd.to_numeric(frame[feature], errors="coerce").to_numpy(dtype=np.float64)
        out[column] = numbers[np.isfinite(numbers)]  # missing and non-numeric values are left out
    return out
