"""The site's privacy ledger: what each study has spent at this site, across its jobs.

It lives in the site parent, out of job code's reach, in one file per study:
``<workspace>/privacy_ledger/<study>.json`` (0600, written atomically and before the worker is
answered, so a crash never forgets a release that was sent). A worker asks before each release
(the WorkerLink's ``SpendBudget``, parent/worker_endpoint.py) with its job's cumulative epsilon
for a kind and the delta it is measured at; the parent takes the study from its own record of
the job and the budget from the site's own files, never from the worker, and composes the jobs
with ``spec/budget_ledger.py``. An operator resets a study's spend by removing its file while
the site is stopped (docs/privacy.md).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from atoll.base.files import PRIVATE, private_dir, write_atomic
from atoll.spec.budget_ledger import LedgerRefused, StudyBudget, StudyLedger
from atoll.spec.errors import SpecError
from atoll.spec.names import is_site_name

LEDGER_DIR = "privacy_ledger"

BudgetOf = Callable[[Path, str], "StudyBudget | None"]  # (local dir, study) -> its budget


def _dp_budget(local_dir: Path, study: str) -> StudyBudget | None:
    from atoll.spec.privacy import load_site_policy  # at the first release, not at rest (pydantic)

    policy = load_site_policy(local_dir)  # read now: an operator's change holds at once
    if policy is None or policy.budget is None:
        return None
    return StudyBudget(policy.budget.epsilon, policy.budget.delta,
                       "local/privacy.yaml budget, per study")


def _statistics_budget(local_dir: Path, study: str) -> StudyBudget | None:
    from atoll.spec.statistics_rules import statistics_budget
    from atoll.spec.study_runtime import load_study_runtime

    # read now, like privacy.yaml; the launcher's own fields do not matter to the budget
    found = statistics_budget(load_study_runtime(local_dir, None), study)
    if found is None:
        return None
    return StudyBudget(found[0], found[1],
                       "local/study_runtime.yaml statistics.dp.budget, per study")


# The kinds of release the ledger accounts, each with where the site sets its budget. A kind
# without a budget is recorded and never refused. Another kind is one entry here.
KINDS: dict[str, BudgetOf] = {
    "dp": _dp_budget,  # client-level DP updates and DP-SGD training (fl/privacy/site_privacy.py)
    "statistics": _statistics_budget,  # statistics in dp mode (fl/statistics_guard.py)
}


class SitePrivacyLedger:
    def __init__(self, site: str, workspace: Path, local_dir: Path,
                 kinds: dict[str, BudgetOf] | None = None):
        self.site = site
        self.folder = Path(workspace) / LEDGER_DIR
        self.local_dir = Path(local_dir)
        self.kinds = dict(KINDS if kinds is None else kinds)
        self._lock = threading.Lock()  # one parent per workspace; its threads take turns

    def path(self, study: str) -> Path:
        if not is_site_name(study):  # the study becomes a file name
            raise LedgerRefused(f"privacy ledger of site {self.site}: study name {study!r} is "
                                "not one this site keeps a ledger for")
        return self.folder / f"{study}.json"

    def read(self, study: str) -> StudyLedger:
        path = self.path(study)
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return StudyLedger(self.site, study, where)
        except OSError as exc:
            raise LedgerRefused(f"privacy ledger of site {self.site}, study {study} ({where}) "
                                f"cannot be read: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        return StudyLedger.from_json(data, self.site, study, where)

    def spend(self, study: str, job_id: str, kind: str, epsilon: float, delta: float) -> float:
        """The study's total epsilon for ``kind`` once this release is recorded (on disk before
        this returns); LedgerRefused, with the ledger named, past the site's budget."""
        budget_of = self.kinds.get(kind)
        if budget_of is None:
            raise LedgerRefused(f"privacy ledger of site {self.site}: unknown kind {kind!r}; "
                                f"it accounts {', '.join(sorted(self.kinds))}")
        with self._lock:
            ledger = self.read(study)
            try:
                budget = budget_of(self.local_dir, study)
            except SpecError as exc:  # a broken file of the site's: refuse, never assume none
                raise LedgerRefused(f"privacy ledger of site {self.site}, study {study}: the "
                                    f"site's budget for {kind} cannot be read: {exc}") from None
            total = ledger.spend(kind, job_id, epsilon, delta, budget)
            private_dir(self.folder)
            write_atomic(self.path(study), json.dumps(ledger.to_json(), indent=1), PRIVATE)
        return total
