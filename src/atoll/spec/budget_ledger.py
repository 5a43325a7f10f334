"""A study's privacy spend at one site, across its jobs: the arithmetic, in plain Python.

Each job's worker reports, before each release, the job's cumulative epsilon so far for a kind
of release ("dp": client-level DP and DP-SGD) and the delta it is measured at. The study's spend
is the basic composition of its jobs (Dwork & Roth 2014, Theorem 3.16): the epsilons add up, and
so do the deltas. A job's own value only grows (a lower report refunds nothing). The site parent
keeps one ``StudyLedger`` per study in a file of its workspace (site/privacy_ledger.py); the
simulator keeps them in memory (fl/simulator.py). Both refuse with the same message, which names
the ledger: site, study, kind, spent and budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from atoll.spec.errors import AtollError


class LedgerRefused(AtollError, RuntimeError):
    """The release would pass the study's budget, or the report is not one the ledger takes;
    the message names the ledger."""


@dataclass(frozen=True)
class StudyBudget:
    epsilon: float
    delta: float  # every job's releases are measured at this delta (at most)
    source: str  # where the site set it, e.g. "local/privacy.yaml budget"


@dataclass
class StudyLedger:
    site: str
    study: str
    where: str  # the ledger's place, for messages: its file, or "in memory"
    # kind -> job id -> [epsilon, delta]: each job's cumulative spend
    spent: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def total(self, kind: str) -> tuple[float, float, int]:
        """(epsilon, delta, jobs) of the study for ``kind``: the sum over its jobs."""
        jobs = self.spent.get(kind, {})
        return (math.fsum(v[0] for v in jobs.values()), math.fsum(v[1] for v in jobs.values()),
                len(jobs))

    def spend(self, kind: str, job_id: str, epsilon: float, delta: float,
              budget: StudyBudget | None) -> float:
        """Record that ``job_id`` has spent ``epsilon`` (cumulative) at ``delta`` for ``kind``;
        the study's total epsilon after it. LedgerRefused, recording nothing, past ``budget``."""
        name = (f"privacy ledger of site {self.site}, study {self.study}, kind {kind} "
                f"({self.where})")
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0):
            raise LedgerRefused(f"{name}: epsilon {epsilon!r} is not a finite number >= 0")
        if not (isinstance(delta, int | float) and 0 <= delta < 1):
            raise LedgerRefused(f"{name}: delta {delta!r} is not in [0, 1)")
        if budget is not None and delta > budget.delta:
            # a larger delta buys a smaller epsilon: the site's delta is the one measured at
            raise LedgerRefused(f"{name}: the job measures its epsilon at delta {delta}, above "
                                f"the site's delta {budget.delta} ({budget.source})")
        jobs = self.spent.setdefault(kind, {})
        before = jobs.get(job_id, [0.0, 0.0])
        after = [max(before[0], float(epsilon)), max(before[1], float(delta))]
        others_eps = math.fsum(v[0] for j, v in jobs.items() if j != job_id)
        others_delta = math.fsum(v[1] for j, v in jobs.items() if j != job_id)
        total_eps = others_eps + after[0]
        if budget is not None and total_eps > budget.epsilon:
            if not jobs.get(job_id):
                jobs.pop(job_id, None)
            if not jobs:
                self.spent.pop(kind, None)
            spent_now = others_eps + before[0]
            raise LedgerRefused(
                f"{name}: budget exhausted: the study has spent epsilon {spent_now:.4g} "
                f"(delta {others_delta + before[1]:.3g}) over {len(self.spent.get(kind, {}))} "
                f"job(s); this release would bring it to {total_eps:.4g} > the budget "
                f"epsilon {budget.epsilon} ({budget.source}); nothing was sent")
        jobs[job_id] = after
        return total_eps

    # --- storage --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"format_version": 1, "site": self.site, "study": self.study, "spent": self.spent}

    @classmethod
    def from_json(cls, data: Any, site: str, study: str, where: str) -> StudyLedger:
        """A ledger read back; LedgerRefused when it is not one (the site refuses to guess)."""
        bad = LedgerRefused(f"privacy ledger of site {site}, study {study} ({where}) is not a "
                            "ledger this version reads; the site refuses every release of the "
                            "study until an operator repairs or removes it (docs/privacy.md)")
        if not isinstance(data, dict) or data.get("format_version") != 1 \
                or data.get("study") != study or not isinstance(data.get("spent"), dict):
            raise bad
        spent: dict[str, dict[str, list[float]]] = {}
        for kind, jobs in data["spent"].items():
            if not isinstance(jobs, dict):
                raise bad
            spent[str(kind)] = {}
            for job, value in jobs.items():
                if (not isinstance(value, list) or len(value) != 2
                        or not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0
                                   for v in value)):
                    raise bad
                spent[str(kind)][str(job)] = [float(value[0]), float(value[1])]
        return cls(site, study, where, spent)
