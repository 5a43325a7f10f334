"""A site's rules for federated statistics: ``statistics:`` of a study in study_runtime.yaml.

```yaml
studies:
  outcomes:
    datasets: {records: {source: /srv/outcomes, mode: ro}}
    statistics:
      min_count: 10     # no statistic, and no histogram cell, about 1 to 9 records
      precision: 1.0    # histogram cells [k, k+1) of this width; min/max rounded out to them
      max_queries: 2    # distinct answers per column, job and question (summary, spread)
      columns:          # per column: its own precision; bounds (needed by dp)
        bmi: {precision: 0.5, bounds: [10, 70]}
        age: {bounds: [0, 120]}
      dp: {epsilon: 0.5, budget: 4.0}   # Laplace noise; epsilon per answer, budget per study
```

The site owns them: its parent hands them to its workers (``ATOLL_STATISTICS_RULES``, an
atoll-owned variable a study's ``env`` cannot set), atoll's statistics code in the site worker
applies them (``atoll.fl.statistics``), and a job can only ask for a stricter ``min_count``.
``statistics_budget`` gives the per-study epsilon budget the site parent's ledger keeps across
jobs. docs/privacy.md states what each mode guarantees.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from atoll.spec import worker_env
from atoll.spec.model import NoNullModel

if TYPE_CHECKING:
    from atoll.spec.study_runtime import StudyRuntime

RULES_ENV = worker_env.STATISTICS_RULES
DEFAULT_MIN_COUNT = 10  # when a site sets no rules: secure by default
DEFAULT_PRECISION = 1.0
DEFAULT_MAX_QUERIES = 2  # one summary and one spread per column is what the template asks
MAX_COLUMN_NAME = 200


class ColumnRules(NoNullModel):
    """One column's own rules."""

    precision: float | None = Field(
        None, gt=0, description="Cell width and rounding of this column (default: precision)")
    bounds: list[float] | None = Field(
        None, description="[low, high]: values are clipped to them; dp needs them (the "
        "sensitivity of a sum); the histogram then covers exactly these bounds")

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return value
        if len(value) != 2 or not all(math.isfinite(v) for v in value) or value[0] >= value[1]:
            raise ValueError("must be [low, high], two finite numbers with low < high")
        return [float(v) for v in value]


class DpRules(NoNullModel):
    """Differential privacy of this study's statistics at this site (the Laplace mechanism)."""

    epsilon: float = Field(
        gt=0, description="Epsilon one answer spends: one task's reply, all its columns and "
        "numbers together (each record adds to every column), split evenly among them")
    budget: float = Field(
        gt=0, description="Epsilon this study may spend on statistics at this site, over all "
        "its jobs (the site parent's ledger); an answer that would pass it is refused")

    @model_validator(mode="after")
    def _one_answer_fits(self) -> DpRules:
        if self.epsilon > self.budget:
            raise ValueError(f"epsilon {self.epsilon} per answer is more than the whole budget "
                             f"{self.budget}: no answer could be given")
        return self


class StatisticsRules(NoNullModel):
    """What this site's answers to federated statistics may reveal."""

    min_count: int = Field(
        DEFAULT_MIN_COUNT,
        ge=1,
        description="No statistic (count, sum, mean...) of fewer records, and no histogram cell "
        "holding 1 to min_count - 1 (a cell of 0 is reported as 0); one more cell is hidden "
        "with them so that the total cannot give them back",
    )
    noise: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Relative noise: each released number is multiplied by 1 + u, u drawn "
        "uniformly in [-noise, noise] once per job; obfuscation, not a guarantee (use dp)",
    )
    precision: float = Field(
        DEFAULT_PRECISION, gt=0,
        description="Histogram cells are [k x precision, (k+1) x precision): the only edges this "
        "site answers; min and max are released rounded outward to them")
    max_queries: int = Field(
        DEFAULT_MAX_QUERIES, ge=1,
        description="Distinct answers per column a job gets to each question (summary, spread); "
        "a question asked again gets its first answer back and does not count")
    columns: dict[str, ColumnRules] = Field(
        default_factory=dict, description="Column name -> its own precision and bounds")
    dp: DpRules | None = Field(
        None, description="Differential privacy (Laplace noise on every released number)")

    @field_validator("columns")
    @classmethod
    def _column_names(cls, value: dict[str, ColumnRules]) -> dict[str, ColumnRules]:
        bad = [n for n in value if not n.strip() or len(n) > MAX_COLUMN_NAME or "\0" in n]
        if bad:
            raise ValueError(f"column names must be 1 to {MAX_COLUMN_NAME} characters: {bad!r}")
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> StatisticsRules:
        if self.dp is not None and self.noise:
            raise ValueError("noise and dp exclude each other: dp's Laplace noise replaces it")
        return self

    def precision_of(self, column: str) -> float:
        own = self.columns.get(column)
        return own.precision if own is not None and own.precision is not None else self.precision

    def bounds_of(self, column: str) -> tuple[float, float] | None:
        own = self.columns.get(column)
        return (own.bounds[0], own.bounds[1]) if own is not None and own.bounds else None

    def budget(self) -> tuple[float, float] | None:
        """(epsilon budget, delta) of this study's statistics, or None without dp (Laplace:
        pure epsilon-DP, delta 0)."""
        return (self.dp.budget, 0.0) if self.dp is not None else None

    def to_env(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True)


def statistics_budget(runtime: StudyRuntime, study: str) -> tuple[float, float] | None:
    """The (epsilon budget, delta) a site keeps for ``study``'s statistics across its jobs, or
    None when the study has no ``statistics.dp`` at this site (nothing to account)."""
    entry = runtime.studies.get(study)
    if entry is None or entry.statistics is None:
        return None
    return entry.statistics.budget()
