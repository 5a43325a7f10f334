"""The site's privacy ledger (site/privacy_ledger.py, spec/budget_ledger.py): per study, across
jobs, durable, its budget read from the site's own privacy.yaml at each release."""

from __future__ import annotations

import json
import stat

import pytest

from atoll.site.privacy_ledger import SitePrivacyLedger
from atoll.spec.budget_ledger import LedgerRefused, StudyBudget, StudyLedger

POLICY = "format_version: 1\nbudget: {{epsilon: {eps}, delta: 1.0e-5}}\n"


@pytest.fixture
def site(tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "privacy.yaml").write_text(POLICY.format(eps=10.0))
    return tmp_path


def test_jobs_of_a_study_add_up_and_a_job_past_the_budget_is_refused_naming_the_ledger(site):
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    assert ledger.spend("alpha", "job-1", "dp", 3.0, 1e-5) == 3.0
    assert ledger.spend("alpha", "job-1", "dp", 6.0, 1e-5) == 6.0  # cumulative, not added
    assert ledger.spend("alpha", "job-2", "dp", 4.0, 1e-5) == 10.0
    with pytest.raises(LedgerRefused) as refused:
        ledger.spend("alpha", "job-3", "dp", 0.5, 1e-5)
    path = site / "workspace" / "privacy_ledger" / "alpha.json"
    assert str(refused.value) == (
        f"privacy ledger of site site-1, study alpha, kind dp ({path}): budget exhausted: the "
        "study has spent epsilon 10 (delta 2e-05) over 2 job(s); this release would bring it "
        "to 10.5 > the budget epsilon 10.0 (local/privacy.yaml budget, per study); nothing "
        "was sent")
    # another study has its own ledger
    assert ledger.spend("beta", "job-4", "dp", 9.0, 1e-5) == 9.0


def test_the_ledger_is_on_disk_before_it_answers_and_survives_a_restart(site):
    SitePrivacyLedger("site-1", site / "workspace", site / "local").spend(
        "alpha", "job-1", "dp", 7.5, 1e-5)
    path = site / "workspace" / "privacy_ledger" / "alpha.json"
    assert json.loads(path.read_text())["spent"] == {"dp": {"job-1": [7.5, 1e-5]}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = SitePrivacyLedger("site-1", site / "workspace", site / "local")  # a new parent
    with pytest.raises(LedgerRefused, match="has spent epsilon 7.5"):
        again.spend("alpha", "job-2", "dp", 3.0, 1e-5)


def test_a_jobs_own_value_never_goes_down(site):
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    ledger.spend("alpha", "job-1", "dp", 5.0, 1e-5)
    assert ledger.spend("alpha", "job-1", "dp", 1.0, 1e-5) == 5.0  # no refund


def test_the_budget_is_the_sites_own_read_at_each_release(site):
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    ledger.spend("alpha", "job-1", "dp", 5.0, 1e-5)
    (site / "local" / "privacy.yaml").write_text(POLICY.format(eps=4.0))
    with pytest.raises(LedgerRefused, match="the budget epsilon 4.0"):
        ledger.spend("alpha", "job-1", "dp", 5.5, 1e-5)
    (site / "local" / "privacy.yaml").unlink()  # no budget: recorded, never refused
    assert ledger.spend("alpha", "job-1", "dp", 50.0, 1e-5) == 50.0


@pytest.mark.parametrize(("study", "kind", "eps", "delta", "why"), [
    ("../local", "dp", 1.0, 1e-5, "study name"),
    ("alpha", "statistics-x", 1.0, 1e-5, "unknown kind"),
    ("alpha", "dp", float("nan"), 1e-5, "not a finite number"),
    ("alpha", "dp", -1.0, 1e-5, "not a finite number"),
    ("alpha", "dp", 1.0, 1.5, r"not in \[0, 1\)"),
    ("alpha", "dp", 1.0, 1e-3, "above the site's delta"),  # a larger delta buys a smaller eps
])
def test_reports_the_ledger_does_not_take(site, study, kind, eps, delta, why):
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    with pytest.raises(LedgerRefused, match=why):
        ledger.spend(study, "job-1", kind, eps, delta)
    assert not (site / "workspace" / "privacy_ledger" / "alpha.json").exists()  # nothing kept


def test_a_damaged_ledger_refuses_every_release_until_an_operator_repairs_it(site):
    folder = site / "workspace" / "privacy_ledger"
    folder.mkdir(parents=True)
    (folder / "alpha.json").write_text('{"format_version": 1, "study": "alpha", "spent": {"dp":'
                                       ' {"job-1": [-3, 0]}}}')
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    with pytest.raises(LedgerRefused, match="until an operator repairs or removes it"):
        ledger.spend("alpha", "job-2", "dp", 1.0, 1e-5)


@pytest.mark.parametrize("doc", [
    {"format_version": 2, "study": "alpha", "spent": {}},  # a later version's: never guessed at
    {"study": "alpha", "spent": {}},
    {"format_version": 1, "study": "beta", "spent": {}},  # another study's ledger moved here
    {"format_version": 1, "study": "alpha", "spent": []},
])
def test_a_ledger_not_of_this_format_and_study_is_refused(site, doc):
    folder = site / "workspace" / "privacy_ledger"
    folder.mkdir(parents=True)
    (folder / "alpha.json").write_text(json.dumps(doc))
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    with pytest.raises(LedgerRefused, match="is not a ledger this version reads"):
        ledger.spend("alpha", "job-2", "dp", 1.0, 1e-5)


def test_basic_composition_adds_epsilons_and_deltas():
    ledger = StudyLedger("s", "alpha", "in memory")
    budget = StudyBudget(10.0, 1e-5, "test")
    ledger.spend("dp", "a", 2.0, 1e-5, budget)
    ledger.spend("dp", "b", 3.0, 5e-6, budget)
    assert ledger.total("dp") == (5.0, pytest.approx(1.5e-5), 2)
    assert StudyLedger.from_json(ledger.to_json(), "s", "alpha", "x").spent == ledger.spent


RUNTIME = """format_version: 2
studies:
  alpha:
    statistics: {dp: {epsilon: 0.5, budget: 1.0}}
  beta: {}
"""


def test_statistics_releases_spend_the_studys_budget_from_study_runtime(site):
    (site / "local" / "study_runtime.yaml").write_text(RUNTIME)
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    assert ledger.spend("alpha", "job-1", "statistics", 0.5, 0.0) == 0.5
    assert ledger.spend("alpha", "job-2", "statistics", 0.5, 0.0) == 1.0
    with pytest.raises(LedgerRefused, match=r"kind statistics .*local/study_runtime.yaml "
                                            r"statistics.dp.budget"):
        ledger.spend("alpha", "job-3", "statistics", 0.5, 0.0)
    # its dp updates keep their own account; a study without statistics.dp is not limited
    assert ledger.spend("alpha", "job-3", "dp", 2.0, 1e-5) == 2.0
    assert ledger.spend("beta", "job-4", "statistics", 9.0, 0.0) == 9.0


def test_a_broken_study_runtime_refuses_statistics_releases(site):
    (site / "local" / "study_runtime.yaml").write_text("format_version: 2\nstudies: [nope]\n")
    ledger = SitePrivacyLedger("site-1", site / "workspace", site / "local")
    with pytest.raises(LedgerRefused, match="budget for statistics cannot be read"):
        ledger.spend("alpha", "job-1", "statistics", 0.5, 0.0)
