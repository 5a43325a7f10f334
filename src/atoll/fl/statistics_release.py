"""What a site releases about one column: the site's grid, its small-cell suppression, rounded
extremes, and the Laplace mechanism of its dp mode. Pure functions of the values and the rules;
``atoll.fl.statistics_guard`` decides which questions get an answer at all.

Three modes, by the site's rules (``atoll.spec.statistics_rules``):

- exact: count, sum, squared deviations exactly; min and max rounded outward to the column's
  precision; the histogram on the site's own grid (cells ``[k p, (k+1) p)``, ``p`` the
  precision, from the cell of the minimum to the cell of the maximum) with every cell of 1 to
  ``min_count - 1`` records hidden, and one more cell hidden with them (the smallest released
  one) so that the column's count minus the released cells gives only the hidden cells' total,
  at least ``min_count`` more than their number less one: no hidden cell is determined by it.
- noise: as exact, each released number times ``1 + u`` (obfuscation only).
- dp: values clipped to the column's bounds; count, sum, squared deviations and every cell of
  the grid over the bounds (zeros too) get Laplace noise of scale sensitivity / epsilon; no
  min or max. Neighbouring tables differ by one record added or removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from atoll.spec.statistics_rules import StatisticsRules

MAX_CELLS = 10_000  # a grid finer than this for the data's range is refused, naming precision
_SNAP = 1e-9  # a value a hair under a cell edge (0.3 / 0.1 = 2.9999...) is in the cell above


def _too_few(count: float, rules: StatisticsRules) -> dict[str, str] | None:
    if count >= rules.min_count:
        return None
    return {"suppressed": f"fewer records than this site's min_count ({rules.min_count})"}


def cell_index(values: np.ndarray, precision: float) -> np.ndarray:
    """The grid cell k of each value: k p <= value < (k + 1) p."""
    return np.floor(values / precision + _SNAP).astype(np.int64)


def data_grid(values: np.ndarray, precision: float) -> tuple[int, int]:
    """(first cell, number of cells) from the minimum's cell to the maximum's."""
    cells = cell_index(np.asarray([values.min(), values.max()]), precision)
    return int(cells[0]), int(cells[1] - cells[0] + 1)


def bounds_grid(bounds: tuple[float, float], precision: float) -> tuple[int, int]:
    """(first cell, number of cells) covering the bounds: independent of the data (dp). A high
    bound on a cell edge closes the cell below it (a value equal to it counts there)."""
    first = int(cell_index(np.asarray([bounds[0]]), precision)[0])
    last = max(first, math.ceil(bounds[1] / precision - _SNAP) - 1)
    return first, last - first + 1


def grid_edges(first: int, cells: int, precision: float) -> list[float]:
    return [(first + i) * precision for i in range(cells + 1)]


def rounded_out(low: float, high: float, precision: float) -> tuple[float, float]:
    """The edges of the cells holding ``low`` and ``high``: min <= value < max for every value."""
    first, cells = data_grid(np.asarray([low, high]), precision)
    return first * precision, (first + cells) * precision


def cell_counts(values: np.ndarray, first: int, cells: int, precision: float) -> np.ndarray:
    index = np.clip(cell_index(values, precision) - first, 0, cells - 1)
    return np.bincount(index, minlength=cells)


def suppress(counts: Sequence[int], min_count: int) -> tuple[list[int | None], list[int]]:
    """Cells shown (None where hidden) and the hidden cells' indices.

    Primary: every cell of 1 to ``min_count - 1`` records. Complementary: with any primary, the
    smallest released non-empty cell too (lowest index on ties), so the hidden total ``T`` over
    ``k`` hidden cells satisfies ``T - (k - 1) >= min_count``: given the column's count and the
    released cells, every hidden cell could hold from 1 to at least ``min_count`` records. When
    no released cell is left to hide and that does not hold, every cell is hidden, empty ones
    too (a hidden cell is otherwise known to be non-empty).
    A stricter ``min_count`` hides a superset of the cells (nested), so answers under two
    min_counts give nothing more than the laxer one alone.
    """
    counts = [int(c) for c in counts]
    hidden = [i for i, c in enumerate(counts) if 0 < c < min_count]
    if hidden:
        shown = [i for i, c in enumerate(counts) if c >= min_count]
        if shown:
            hidden.append(min(shown, key=lambda i: (counts[i], i)))
        total = sum(counts[i] for i in hidden)
        if total - (len(hidden) - 1) < min_count:
            hidden = list(range(len(counts)))
    hidden.sort()
    gone = set(hidden)
    out: list[int | None] = [None if i in gone else c for i, c in enumerate(counts)]
    return out, hidden


def laplace(value: float, sensitivity: float, epsilon: float, rng: np.random.Generator) -> float:
    """The Laplace mechanism: ``value`` plus noise of scale ``sensitivity / epsilon``."""
    return float(value) + float(rng.laplace(0.0, sensitivity / epsilon))


def _times(value: float, rules: StatisticsRules, rng: np.random.Generator) -> float:
    if not rules.noise:
        return float(value)
    return float(value) * (1.0 + rng.uniform(-rules.noise, rules.noise))


def _needs_bounds(column: str) -> dict[str, str]:
    return {"refused": f"this site answers {column!r} only with dp noise, which needs the "
                       f"column's bounds: the site sets statistics.columns.{column}.bounds"}


def summarize(values: np.ndarray, rules: StatisticsRules, rng: np.random.Generator,
              column: str = "", epsilon: float | None = None) -> dict[str, Any]:
    """The first question for one column: count, sum, min and max (dp: count and sum only);
    ``epsilon``: what each of the two noisy numbers spends, in dp mode."""
    precision = rules.precision_of(column)
    if rules.dp is not None:
        bounds = rules.bounds_of(column)
        if bounds is None:
            return _needs_bounds(column)
        assert epsilon is not None, "dp answers are given an epsilon"
        clipped = np.clip(values, *bounds)
        count = laplace(len(values), 1.0, epsilon, rng)
        if (suppressed := _too_few(count, rules)) is not None:  # on the noisy count: post-processing
            return suppressed
        total = laplace(clipped.sum(), max(abs(bounds[0]), abs(bounds[1])), epsilon, rng)
        return {"count": count, "sum": total, "bounds": list(bounds), "precision": precision,
                "epsilon": 2 * epsilon}
    if (suppressed := _too_few(len(values), rules)) is not None:
        return suppressed
    low, high = rounded_out(float(values.min()), float(values.max()), precision)
    return {"count": _times(len(values), rules, rng), "sum": _times(values.sum(), rules, rng),
            "min": low, "max": high, "precision": precision}


def spread(values: np.ndarray, mean: float, rules: StatisticsRules, rng: np.random.Generator,
           column: str = "", epsilon: float | None = None,
           edges: Sequence[float] | None = None) -> dict[str, Any]:
    """The second question for one column: squared deviations from the global ``mean`` and the
    histogram on this site's grid. ``edges``, when a job sends them, must be that grid."""
    precision = rules.precision_of(column)
    bounds = rules.bounds_of(column)
    if rules.dp is not None and bounds is None:
        return _needs_bounds(column)
    if rules.dp is None and (suppressed := _too_few(len(values), rules)) is not None:
        return suppressed
    if bounds is not None:
        values = np.clip(values, *bounds)
        first, cells = bounds_grid(bounds, precision)
    else:
        first, cells = data_grid(values, precision)
    if cells > MAX_CELLS:
        return {"refused": f"{cells} histogram cells of width {precision} for {column!r}: more "
                           f"than {MAX_CELLS}; the site sets a coarser statistics.precision"}
    if edges is not None and not same_edges(edges, grid_edges(first, cells, precision)):
        return {"refused": f"this site answers {column!r} on its own grid only (cells of width "
                           f"{precision} from {first * precision:g} to "
                           f"{(first + cells) * precision:g}): ask without edges"}
    counts = cell_counts(values, first, cells, precision)
    # dp: deviations from the mean clipped to the bounds, or the sensitivity below would not hold
    centre = float(np.clip(mean, *bounds)) if rules.dp is not None else float(mean)
    deviations = values - centre
    squared = float(deviations @ deviations)
    answer: dict[str, Any] = {"first": first, "width": precision}
    if rules.dp is not None:
        assert epsilon is not None, "dp answers are given an epsilon"
        sensitivity = max((bounds[1] - centre) ** 2, (centre - bounds[0]) ** 2)
        answer.update(sum_squared_deviations=laplace(squared, sensitivity, epsilon, rng),
                      histogram=[laplace(c, 1.0, epsilon, rng) for c in counts.tolist()],
                      suppressed_bins=[], epsilon=2 * epsilon)
        return answer
    shown, hidden = suppress(counts.tolist(), rules.min_count)
    answer.update(sum_squared_deviations=_times(squared, rules, rng),
                  histogram=[None if c is None else (_times(c, rules, rng) if c else 0.0)
                             for c in shown],
                  suppressed_bins=hidden)
    return answer


def same_edges(asked: Sequence[float], own: list[float]) -> bool:
    try:
        values = [float(v) for v in asked]
    except (TypeError, ValueError):
        return False
    return len(values) == len(own) and all(
        math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for a, b in zip(values, own, strict=True))
