"""Federated statistics of numeric columns of a table each site holds (a CSV), in two round trips.

1. ``statistics_summary`` (args ``columns``): each site answers, per column, ``count``, ``sum``,
   ``min`` and ``max`` of its non-missing values (min and max rounded outward to the site's
   precision; none in dp mode).
2. ``statistics_spread`` (args ``columns`` and the global ``means``): each site answers the sum
   of squared deviations from the global mean and its histogram on its own grid (``first``
   cell, cell ``width``: the site's precision). A job may send ``edges``; only the site's own
   grid is answered.

From these the server has, per site and globally: count, sum, mean, variance and standard
deviation (sample, ``n - 1``), min, max, histograms, and quantiles read from the histograms
(linear within a cell). Squared deviations from the global mean, not sums of squares, keep the
variance exact (equal to the pooled data's to ~1e-12 in exact mode).

The site's rules (``statistics:`` of its study in ``local/study_runtime.yaml``, handed to its
worker by its parent, ``atoll.spec.statistics_rules``) are applied here, on the site, by
``serve``: what each answer releases is ``atoll.fl.statistics_release``'s (suppression of small
columns and cells with a complementary cell, rounded extremes, dp's Laplace noise), how often
and to what a job is answered is ``atoll.fl.statistics_guard``'s. A job may ask for a larger
``min_count`` (task arg) at its first question, never a smaller one. docs/privacy.md states the
guarantee.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.client_runtime import current
from atoll.fl.model import Model
from atoll.fl.statistics_guard import (
    SPREAD,
    SUMMARY,
    Spend,
    StatisticsGuard,
    StatisticsRefused,
    effective_rules,
)
from atoll.fl.statistics_release import spread, summarize
from atoll.spec.errors import AtollError

__all__ = ["SPREAD", "SUMMARY", "StatisticsError", "StatisticsRefused", "combine_histograms",
           "combine_summaries", "effective_rules", "quantiles", "read_columns", "serve", "serve_values",
           "site_spread_stats", "spread", "summarize"]

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


def serve(table: Path, *, spend: Spend | None = None,
          rng: np.random.Generator | None = None) -> None:
    """A site's whole part of a statistics job: answer its tasks from the CSV ``table`` with
    this site's rules until the job ends (``serve_values`` over ``read_columns``)."""
    serve_values(lambda asked: read_columns(table, asked), str(table), spend=spend, rng=rng)


def serve_values(values: Callable[[list[str]], dict[str, np.ndarray]], source: str, *,
                 spend: Spend | None = None, rng: np.random.Generator | None = None) -> None:
    """Answer the job's statistics tasks with this site's rules until the job ends, the values
    of each asked column read by ``values`` (the non-missing, finite numbers; an unknown
    column raises StatisticsError naming the known ones); ``source`` names the table. Other
    tasks are answered with an error.

    The job's questions go through one ``StatisticsGuard`` per worker (kept on the session, so
    a script that calls ``serve`` again gets the same one): rules frozen at the first question,
    repeats answered from the first answer, ``max_queries`` per column and question, and in dp
    mode each new answer's epsilon spent by ``spend``: the site parent's ledger
    (``session.spend_budget(kind, epsilon, delta)``) when the worker has it, else a ledger of
    this job alone. ``rng``: for tests; fresh entropy otherwise.
    """
    session = current()
    session.initialized = True
    guard = session.statistics_guard
    if guard is None:
        if spend is None and callable(getattr(session, "spend_budget", None)):
            spend = session.spend_budget  # the site parent's per-study ledger
        owner = (f"site {session.site} (statistics.dp.budget of its study_runtime.yaml, kept "
                 "for this job only)")
        guard = session.statistics_guard = StatisticsGuard(
            session.statistics_rules, spend, owner, rng or np.random.default_rng())
    while (model := session.receive()) is not None:
        task = model.meta.get("task")
        if task not in (SUMMARY, SPREAD):
            session.send(Model(meta={"error": f"not a statistics task: {task}"}))
            continue
        try:
            answer = guard.answer(task, model.meta, values, source)
        except StatisticsRefused as exc:
            session.send(Model(meta={"refused": str(exc), "rules": _public(guard)}))
            continue
        session.send(Model(meta={"statistics": answer, "rules": _public(guard)}))


def _public(guard: StatisticsGuard) -> dict[str, Any]:
    """The rules this site answers with, as the job sees them."""
    rules = guard.rules or effective_rules(guard.site_rules)
    return rules.model_dump(exclude_none=True, exclude={"columns"}) | {
        "columns": {c: r.model_dump(exclude_none=True) for c, r in rules.columns.items()}}


# --- the server -------------------------------------------------------------------------------


def combine_summaries(per_site: dict[str, dict[str, Any]], column: str) -> dict[str, Any]:
    """Global count, sum, mean (and min, max where every site released them: not in dp mode)
    of ``column`` over the sites that released it."""
    usable = {s: r[column] for s, r in per_site.items() if "count" in r.get(column, {})}
    if not usable:
        return {"suppressed": "no site released this column"}
    count = sum(r["count"] for r in usable.values())
    total = sum(r["sum"] for r in usable.values())
    out = {"count": count, "sum": total, "mean": total / count if count > 0 else 0.0,
           "sites": sorted(usable)}
    if all("min" in r for r in usable.values()):
        out["min"] = min(r["min"] for r in usable.values())
        out["max"] = max(r["max"] for r in usable.values())
    return out


def combine_histograms(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The global histogram from the sites' answers on their own grids: on the coarsest width,
    finer grids summed into it where it is a whole multiple of theirs. A hidden cell counts 0
    and its global cell is listed in ``incomplete``; a site whose grid does not fit is listed
    in ``left_out`` with why."""
    usable = {s: a for s, a in parts.items() if "histogram" in a}
    if not usable:
        return {}
    width = max(a["width"] for a in usable.values())
    cells: dict[int, float] = {}
    incomplete: set[int] = set()
    left_out = {}
    for site, answer in sorted(usable.items()):
        ratio = width / answer["width"]
        if abs(ratio - round(ratio)) > 1e-9:
            left_out[site] = (f"its cells of {answer['width']:g} do not divide the others' "
                              f"{width:g}")
            continue
        for offset, count in enumerate(answer["histogram"]):
            index = (int(answer["first"]) + offset) // round(ratio)
            cells[index] = cells.get(index, 0.0) + (count or 0.0)
            if count is None:
                incomplete.add(index)
    if not cells:
        return {"left_out": left_out}
    first, last = min(cells), max(cells)
    return {"first": first, "width": width,
            "edges": [(first + i) * width for i in range(last - first + 2)],
            "histogram": [cells.get(i, 0.0) for i in range(first, last + 1)],
            "incomplete": sorted(i - first for i in incomplete), "left_out": left_out}


def quantiles(edges: Sequence[float], counts: Sequence[float], qs: Sequence[float]) -> dict:
    """Quantiles read from a histogram, linear within the bin where each falls."""
    counts_array = np.clip(np.asarray(counts, dtype=np.float64), 0, None)  # dp: noisy counts
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
