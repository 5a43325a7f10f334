"""Federated statistics of numeric columns of a table each site holds (a CSV), in two round trips.

1. ``statistics_summary`` (args ``columns``): each site answers, per column, ``count``, ``sum``,
   ``min`` and ``max`` of its non-missing values.
2. ``statistics_spread`` (args ``columns``, the global ``means`` and histogram ``edges``): each
   site answers the sum of squared deviations from the global mean and its histogram counts.

From these the server has, per site and globally: count, sum, mean, variance and standard
deviation (sample, ``n - 1``), min, max, histograms, and quantiles read from the histograms
(linear within a bin: an approximation as fine as the bins). Squared deviations from the global
mean, not sums of squares, keep the variance exact (equal to the pooled data's to ~1e-12).

The site's rules (``statistics:`` of its study in ``local/study_runtime.yaml``, handed to its
worker by its parent, ``atoll.spec.statistics_rules``) are applied here, on the site, by
``serve``: a column with fewer than ``min_count`` values is answered ``{"suppressed": why}``;
a histogram bin holding 1 to ``min_count - 1`` records is ``None`` and listed as suppressed;
with ``noise``, every released number is multiplied by ``1 + u``, ``u`` uniform in
``[-noise, noise]``. A job may ask for a larger ``min_count`` (task arg), never a smaller one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.client_runtime import current
from atoll.fl.model import Model
from atoll.spec.errors import AtollError
from atoll.spec.statistics_rules import StatisticsRules

SUMMARY, SPREAD = "statistics_summary", "statistics_spread"
MISSING = {"", "na", "nan", "null", "none"}


class StatisticsError(AtollError, ValueError):
    """The table or the request cannot give statistics; the message names file, line, column."""


# --- the site ---------------------------------------------------------------------------------


def read_columns(path: Path, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The non-missing values of ``columns`` in the CSV ``path`` (header row first)."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise StatisticsError(f"{path}: cannot read the table: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise StatisticsError(f"{path}: empty file; the first line must name the columns")
        header = [h.strip() for h in header]
        unknown = [c for c in columns if c not in header]
        if unknown:
            raise StatisticsError(
                f"{path}: no column {', '.join(map(repr, unknown))}; columns: {', '.join(header)}"
            )
        where = {c: header.index(c) for c in columns}
        values: dict[str, list[float]] = {c: [] for c in columns}
        for line, row in enumerate(reader, start=2):
            for column, index in where.items():
                cell = row[index].strip() if index < len(row) else ""
                if cell.lower() in MISSING:
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    raise StatisticsError(
                        f"{path}:{line}: column {column!r} holds {cell[:40]!r}, not a number"
                    ) from None
                if math.isfinite(value):
                    values[column].append(value)
    return {c: np.asarray(v, dtype=np.float64) for c, v in values.items()}


def effective_rules(site_rules: dict[str, Any] | None, requested_min_count: Any = None) -> StatisticsRules:
    """The site's rules (defaults when it set none), made stricter by a job's ``min_count``."""
    rules = StatisticsRules.model_validate(site_rules or {})
    if isinstance(requested_min_count, int) and requested_min_count > rules.min_count:
        rules = StatisticsRules(min_count=requested_min_count, noise=rules.noise)
    return rules


def _noisy(value: float, rules: StatisticsRules, rng: np.random.Generator) -> float:
    if not rules.noise:
        return float(value)
    return float(value) * (1.0 + rng.uniform(-rules.noise, rules.noise))


def _too_few(count: int, rules: StatisticsRules) -> dict[str, str] | None:
    if count >= rules.min_count:
        return None
    return {"suppressed": f"fewer records than this site's min_count ({rules.min_count})"}


def summarize(
    values: np.ndarray, rules: StatisticsRules, rng: np.random.Generator
) -> dict[str, Any]:
    """Phase 1 for one column: count, sum, min, max, or why it is suppressed."""
    if (suppressed := _too_few(len(values), rules)) is not None:
        return suppressed
    return {
        "count": _noisy(len(values), rules, rng),
        "sum": _noisy(values.sum(), rules, rng),
        "min": _noisy(values.min(), rules, rng),
        "max": _noisy(values.max(), rules, rng),
    }


def spread(
    values: np.ndarray,
    mean: float,
    edges: Sequence[float],
    rules: StatisticsRules,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Phase 2 for one column: squared deviations from the global mean, and the histogram over
    ``edges`` (values outside them count in the first or last bin)."""
    if (suppressed := _too_few(len(values), rules)) is not None:
        return suppressed
    edges_array = np.asarray(edges, dtype=np.float64)
    if edges_array.ndim != 1 or len(edges_array) < 2 or np.any(np.diff(edges_array) < 0):
        raise StatisticsError("statistics_spread: edges must be an increasing list of 2+ numbers")
    clipped = np.clip(values, edges_array[0], edges_array[-1])
    counts, _ = np.histogram(clipped, bins=edges_array)
    histogram: list[float | None] = []
    hidden = []
    for index, count in enumerate(counts.tolist()):
        if 0 < count < rules.min_count:
            histogram.append(None)
            hidden.append(index)
        else:
            histogram.append(_noisy(count, rules, rng) if count else 0.0)
    deviations = values - float(mean)
    return {
        "sum_squared_deviations": _noisy(float(deviations @ deviations), rules, rng),
        "histogram": histogram,
        "suppressed_bins": hidden,
    }


def serve(table: Path) -> None:
    """A site's whole part of a statistics job: answer its tasks from the CSV ``table`` with
    this site's rules until the job ends. Other tasks are answered with an empty result."""
    session = current()
    session.initialized = True
    rng = np.random.default_rng()  # fresh entropy: noise nobody can replay
    while (model := session.receive()) is not None:
        task = model.meta.get("task")
        rules = effective_rules(session.statistics_rules, model.meta.get("min_count"))
        columns = model.meta.get("columns")
        if task not in (SUMMARY, SPREAD) or not isinstance(columns, list):
            session.send(Model(meta={"error": f"not a statistics task: {task}"}))
            continue
        values = read_columns(table, [str(c) for c in columns])
        if task == SUMMARY:
            answer = {c: summarize(values[c], rules, rng) for c in values}
        else:
            means, edges = model.meta.get("means", {}), model.meta.get("edges", {})
            answer = {
                c: spread(values[c], means[c], edges[c], rules, rng)
                for c in values
                if c in means and c in edges
            }
        rules_out = {"min_count": rules.min_count, "noise": rules.noise}
        session.send(Model(meta={"statistics": answer, "rules": rules_out}))


# --- the server -------------------------------------------------------------------------------


def combine_summaries(per_site: dict[str, dict[str, Any]], column: str) -> dict[str, Any]:
    """Global count, sum, mean, min, max of ``column`` over the sites that released it."""
    usable = {s: r[column] for s, r in per_site.items() if "count" in r.get(column, {})}
    if not usable:
        return {"suppressed": "no site released this column"}
    count = sum(r["count"] for r in usable.values())
    total = sum(r["sum"] for r in usable.values())
    return {
        "count": count,
        "sum": total,
        "mean": total / count,
        "min": min(r["min"] for r in usable.values()),
        "max": max(r["max"] for r in usable.values()),
        "sites": sorted(usable),
    }


def histogram_edges(summary: dict[str, Any], bins: int) -> list[float]:
    low, high = summary["min"], summary["max"]
    if high <= low:
        high = low + 1.0
    return np.linspace(low, high, bins + 1).tolist()


def quantiles(edges: Sequence[float], counts: Sequence[float], qs: Sequence[float]) -> dict:
    """Quantiles read from a histogram, linear within the bin where each falls."""
    counts_array = np.asarray(counts, dtype=np.float64)
    total = counts_array.sum()
    if total <= 0:
        return {}
    cumulative = np.concatenate([[0.0], np.cumsum(counts_array)])
    out = {}
    for q in qs:
        target = q * total
        index = int(np.clip(np.searchsorted(cumulative, target, side="left") - 1, 0,
                            len(counts_array) - 1))
        inside = counts_array[index]
        fraction = (target - cumulative[index]) / inside if inside > 0 else 0.0
        out[str(q)] = edges[index] + float(np.clip(fraction, 0, 1)) * (edges[index + 1] -
                                                                         edges[index])
    return out


def site_spread_stats(summary: dict[str, Any], spread_answer: dict[str, Any],
                      global_mean: float) -> dict[str, float]:
    """A site's own mean, variance and standard deviation from its two answers."""
    n, mean = summary["count"], summary["sum"] / summary["count"]
    own = spread_answer["sum_squared_deviations"] - n * (mean - global_mean) ** 2
    variance = max(own, 0.0) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "variance": variance, "std": math.sqrt(variance)}
