"""How often, and to what, a site's worker answers a job's statistics questions.

One guard per job, in the site worker, held by atoll's code (``atoll.fl.statistics.serve``),
not by the workflow that asks:

- the rules are frozen at the job's first question: a later one asking another ``min_count`` is
  refused (answers under two suppression levels must not be compared);
- a question asked again (same column, same question, same arguments) gets its first answer
  back, noise and all: repeating a query gives no fresh view;
- each column gets at most ``max_queries`` distinct answers per question (summary, spread) in
  the job; more are refused for that column;
- in dp mode each answer that releases anything new spends the rules' ``epsilon`` through
  ``spend("statistics", epsilon, 0.0)``: the site parent's per-study ledger
  (``ClientSession.spend_budget``) when the worker has one, else this job's own ``JobLedger``.
  A refused spend (``BudgetExhausted``, naming the ledger) releases nothing new.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.fl.privacy.accounting import BudgetExhausted
from atoll.fl.statistics_release import (
    MAX_CELLS,
    bounds_grid,
    grid_edges,
    same_edges,
    spread,
    summarize,
)
from atoll.spec.errors import AtollError
from atoll.spec.statistics_rules import StatisticsRules

SUMMARY, SPREAD = "statistics_summary", "statistics_spread"
KIND = "statistics"  # the ledger's name for these releases
MAX_COLUMNS = 1000
Spend = Callable[[str, float, float], float]  # (kind, epsilon, delta) -> the study's total


class StatisticsRefused(AtollError, ValueError):
    """A whole question is refused; the message says why and what the job may ask instead."""


def effective_rules(site_rules: dict[str, Any] | None,
                    requested_min_count: Any = None) -> StatisticsRules:
    """The site's rules (defaults when it set none), made stricter by a job's ``min_count``."""
    rules = StatisticsRules.model_validate(site_rules or {})
    if (isinstance(requested_min_count, int) and not isinstance(requested_min_count, bool)
            and requested_min_count > rules.min_count):
        rules = rules.model_copy(update={"min_count": requested_min_count})
    return rules


@dataclass
class JobLedger:
    """The budget when no site-parent ledger is wired (a worker without ``spend_budget``): it
    holds for this job only. Like the parent's ledger it takes the job's cumulative epsilon."""

    budget: float
    owner: str
    spent: float = 0.0

    def spend(self, kind: str, epsilon: float, delta: float) -> float:
        if epsilon > self.budget + 1e-12:
            raise BudgetExhausted(
                f"{kind} budget of {self.owner} exhausted: spent epsilon {self.spent:g} of "
                f"{self.budget:g}, one more answer needs {epsilon - self.spent:g}")
        self.spent = max(self.spent, epsilon)
        return self.spent


@dataclass
class StatisticsGuard:
    site_rules: dict[str, Any] | None
    spend: Spend | None = None
    owner: str = "this job"
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    rules: StatisticsRules | None = None  # frozen at the first question
    answers: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    asked: Counter[tuple[str, str]] = field(default_factory=Counter)
    spent: float = 0.0  # this job's statistics epsilon so far: what a ledger is told

    def freeze(self, requested_min_count: Any) -> StatisticsRules:
        rules = effective_rules(self.site_rules, requested_min_count)
        if self.rules is None:
            self.rules = rules
            if rules.dp is not None and self.spend is None:
                self.spend = JobLedger(rules.dp.budget, self.owner).spend
        elif rules.min_count != self.rules.min_count:
            raise StatisticsRefused(
                f"this job's statistics are answered with min_count {self.rules.min_count} "
                f"(its first question); a question with min_count {rules.min_count} is refused")
        return self.rules

    def answer(self, task: str, meta: dict[str, Any],
               values: Callable[[list[str]], dict[str, np.ndarray]],
               source: str = "") -> dict[str, Any]:
        """The statistics of one task, column by column; ``values`` reads the site's table
        (``source`` names it: a script serving two tables gets each its own answers)."""
        rules = self.freeze(meta.get("min_count"))
        columns = _columns(meta.get("columns"))
        means, edges = meta.get("means") or {}, meta.get("edges") or {}
        if task == SPREAD and (not isinstance(means, dict) or not isinstance(edges, dict)):
            raise StatisticsRefused("statistics_spread: means and edges must map columns")
        if task == SPREAD:
            columns = [c for c in columns if c in means]
        out: dict[str, dict[str, Any]] = {}
        new: dict[str, tuple[Any, ...]] = {}
        for column in columns:
            key = _key(source, task, column, means.get(column), edges.get(column))
            if isinstance(key, str):
                out[column] = {"refused": key}
            elif key in self.answers:
                out[column] = self.answers[key]
            elif self.asked[task, column] >= rules.max_queries:
                out[column] = {"refused": f"{column!r} was answered {rules.max_queries} "
                                          f"time(s) to {task} in this job: this site's "
                                          f"statistics.max_queries"}
            elif (why := _dp_refusal(rules, column, key)) is not None:
                out[column] = {"refused": why}  # known before any epsilon is spent
            else:
                new[column] = key
        if new:
            out.update(self._release(task, rules, new, means, edges, values))
        return out

    def _release(self, task, rules, new, means, edges, values) -> dict[str, dict[str, Any]]:
        epsilon = None
        if rules.dp is not None:
            assert self.spend is not None
            try:  # the ledger takes the job's cumulative epsilon (site/privacy_ledger.py)
                self.spend(KIND, self.spent + rules.dp.epsilon, 0.0)
            except BudgetExhausted as exc:
                return {c: {"refused": str(exc)} for c in new}
            self.spent += rules.dp.epsilon
            epsilon = rules.dp.epsilon / (2 * len(new))  # two noisy quantities per column
        table = values(list(new))
        out = {}
        for column, key in new.items():
            if task == SUMMARY:
                answer = summarize(table[column], rules, self.rng, column, epsilon)
            else:
                answer = spread(table[column], float(means[column]), rules, self.rng, column,
                                epsilon, edges.get(column))
            out[column] = answer
            if "refused" not in answer:  # a refusal releases nothing: not kept, not counted
                self.answers[key] = answer
                self.asked[task, column] += 1
        return out


def _dp_refusal(rules: StatisticsRules, column: str, key: tuple[Any, ...]) -> str | None:
    """In dp mode, what ``spread``/``summarize`` would refuse, found without the data (``key``:
    source, task, column, mean, edges)."""
    if rules.dp is None:
        return None
    bounds = rules.bounds_of(column)
    if bounds is None:
        return (f"this site answers {column!r} only with dp noise, which needs the column's "
                f"bounds: the site sets statistics.columns.{column}.bounds")
    if key[1] == SPREAD:
        precision = rules.precision_of(column)
        first, cells = bounds_grid(bounds, precision)
        if cells > MAX_CELLS:
            return (f"{cells} histogram cells of width {precision} for {column!r}: more than "
                    f"{MAX_CELLS}; the site sets a coarser statistics.precision")
        if key[4] is not None and not same_edges(key[4], grid_edges(first, cells, precision)):
            return (f"this site answers {column!r} on its own grid only (cells of width "
                    f"{precision} over its bounds {bounds[0]:g} to {bounds[1]:g}): ask "
                    f"without edges")
    return None


def _columns(asked: Any) -> list[str]:
    if (not isinstance(asked, list) or not asked or len(asked) > MAX_COLUMNS
            or not all(isinstance(c, str) and c for c in asked)):
        raise StatisticsRefused(f"columns must be a list of 1 to {MAX_COLUMNS} column names")
    return list(dict.fromkeys(asked))  # a column asked twice in one task is one question


def _key(source: str, task: str, column: str, mean: Any,
         edges: Any) -> tuple[Any, ...] | str:
    """What makes two questions the same, or why the question is malformed."""
    if task == SUMMARY:
        return (source, task, column, None, None)
    if isinstance(mean, bool) or not isinstance(mean, int | float) or not math.isfinite(mean):
        return f"the mean of {column!r} must be a finite number"
    if edges is None:
        return (source, task, column, float(mean), None)
    if not isinstance(edges, Sequence) or isinstance(edges, str) or len(edges) > 100_001:
        return f"edges of {column!r} must be a list of numbers"
    try:
        return (source, task, column, float(mean), tuple(float(e) for e in edges))
    except (TypeError, ValueError):
        return f"edges of {column!r} must be a list of numbers"
