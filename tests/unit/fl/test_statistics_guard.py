"""How often, and to what, a site answers one job's statistics questions
(atoll.fl.statistics_guard): rules frozen at the first question, repeats answered from the first
answer, max_queries per column, dp answers paid for through the site's ledger, checked here
against a ledger kept independently by the test."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.privacy.accounting import BudgetExhausted
from atoll.fl.statistics_guard import (
    KIND,
    SPREAD,
    SUMMARY,
    StatisticsGuard,
    StatisticsRefused,
    effective_rules,
)

VALUES = {"x": np.random.default_rng(5).uniform(0, 100, 300),
          "y": np.random.default_rng(6).normal(10, 2, 300)}


def _table(asked):
    return {c: VALUES[c] for c in asked}


class StudyLedger:
    """The site parent's per-study ledger as ClientSession.spend_budget offers it to one job:
    told the job's cumulative epsilon, it adds the other jobs' and refuses past its budget."""

    def __init__(self, budget):
        self.budget, self.calls, self.jobs = budget, [], {}

    def for_job(self, job):
        def spend(kind, epsilon, delta):
            others = sum(e for j, e in self.jobs.items() if j != job)
            if others + epsilon > self.budget + 1e-12:
                raise BudgetExhausted(f"{kind} budget of study alpha at site-1 (site ledger) "
                                      f"exhausted")
            self.jobs[job] = max(self.jobs.get(job, 0.0), epsilon)
            self.calls.append((kind, epsilon, delta))
            return others + self.jobs[job]
        return spend


def test_a_repeated_question_gets_its_first_answer_and_does_not_count():
    guard = StatisticsGuard({"noise": 0.2, "max_queries": 1}, rng=np.random.default_rng(0))
    first = guard.answer(SUMMARY, {"columns": ["x"]}, _table)
    again = guard.answer(SUMMARY, {"columns": ["x", "x"]}, _table)
    assert again == first  # the same noise: no fresh view to average
    spread = {"columns": ["x"], "means": {"x": 50.0}}
    one = guard.answer(SPREAD, spread, _table)
    assert guard.answer(SPREAD, spread, _table) == one
    other = guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 49.0}}, _table)
    assert other["x"] == {"refused": "'x' was answered 1 time(s) to statistics_spread in this "
                                     "job: this site's statistics.max_queries"}


def test_max_queries_counts_per_column_and_question():
    guard = StatisticsGuard({"max_queries": 2}, rng=np.random.default_rng(0))
    for mean in (1.0, 2.0):
        assert "histogram" in guard.answer(SPREAD, {"columns": ["x"], "means": {"x": mean}},
                                           _table)["x"]
    third = guard.answer(SPREAD, {"columns": ["x", "y"], "means": {"x": 3.0, "y": 3.0}}, _table)
    assert "refused" in third["x"] and "histogram" in third["y"]
    assert "count" in guard.answer(SUMMARY, {"columns": ["x"]}, _table)["x"]  # its own count


def test_rules_are_frozen_at_the_first_question():
    guard = StatisticsGuard({"min_count": 5})
    guard.answer(SUMMARY, {"columns": ["x"], "min_count": 20}, _table)
    with pytest.raises(StatisticsRefused, match="min_count 20 .*min_count 21 is refused"):
        guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0}, "min_count": 21}, _table)
    with pytest.raises(StatisticsRefused, match="min_count 20 .*min_count 5 is refused"):
        guard.answer(SUMMARY, {"columns": ["x"]}, _table)  # back to the site's own: refused too
    assert effective_rules({"min_count": 5}, True).min_count == 5  # a bool is not a count
    assert effective_rules({"min_count": 10}, 2).min_count == 10  # a job never loosens it
    assert effective_rules({"min_count": 10}, 12).min_count == 12


def test_malformed_questions_are_refused_without_counting():
    guard = StatisticsGuard({"max_queries": 1})
    with pytest.raises(StatisticsRefused, match="columns must be a list"):
        guard.answer(SUMMARY, {"columns": "x"}, _table)
    for mean in (float("nan"), True, "1"):
        assert "finite number" in guard.answer(
            SPREAD, {"columns": ["x"], "means": {"x": mean}}, _table)["x"]["refused"]
    bad = guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0},
                                "edges": {"x": [0, 33.3, 100]}}, _table)
    assert "own grid only" in bad["x"]["refused"]
    assert "histogram" in guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0}},
                                       _table)["x"]  # the refusals did not use max_queries


DP = {"min_count": 5, "precision": 10.0, "max_queries": 3,
      "columns": {"x": {"bounds": [0.0, 100.0]}, "y": {"bounds": [0.0, 20.0]}},
      "dp": {"epsilon": 0.5, "budget": 4.0}}


def test_dp_answers_spend_the_studys_budget_across_jobs():
    ledger = StudyLedger(budget=4.0)
    answered = 0
    for job in range(5):  # each job: a summary, a spread, then both again (cached: free)
        guard = StatisticsGuard(DP, ledger.for_job(job), rng=np.random.default_rng(job))
        asked = [(SUMMARY, {"columns": ["x", "y"]}),
                 (SPREAD, {"columns": ["x", "y"], "means": {"x": 50.0, "y": 10.0}})]
        for task, meta in asked * 2:
            answer = guard.answer(task, meta, _table)
            if all("refused" not in a for a in answer.values()):
                answered += 1
            else:
                assert all("budget of study alpha at site-1 (site ledger) exhausted"
                           in a["refused"] for a in answer.values())
    # independently: 0.5 per new answer, 4.0 in all -> 8 new answers, 4 jobs; repeats free;
    # each job tells the ledger its running total
    assert ledger.calls == [(KIND, 0.5, 0.0), (KIND, 1.0, 0.0)] * 4
    assert sum(ledger.jobs.values()) == pytest.approx(4.0)
    assert answered == 8 * 2  # each job's two repeats were answered from its first answers


def test_dp_epsilon_is_split_among_the_new_answers_numbers():
    guard = StatisticsGuard(DP, StudyLedger(4.0).for_job(0), rng=np.random.default_rng(0))
    answer = guard.answer(SUMMARY, {"columns": ["x", "y"]}, _table)
    assert answer["x"]["epsilon"] + answer["y"]["epsilon"] == pytest.approx(0.5)
    lone = StatisticsGuard(DP, StudyLedger(4.0).for_job(0), rng=np.random.default_rng(0))
    assert lone.answer(SUMMARY, {"columns": ["x"]}, _table)["x"]["epsilon"] == 0.5


def test_dp_refusals_known_without_the_data_spend_nothing():
    ledger = StudyLedger(4.0)
    guard = StatisticsGuard({**DP, "columns": {"x": {"bounds": [0.0, 100.0]}}}, ledger.for_job(0))
    answer = guard.answer(SUMMARY, {"columns": ["y"]}, _table)
    assert "statistics.columns.y.bounds" in answer["y"]["refused"]
    edges = guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0},
                                  "edges": {"x": [0.0, 50.0, 100.0]}}, _table)
    assert "own grid only" in edges["x"]["refused"]
    assert ledger.calls == []


def test_without_a_site_ledger_the_budget_holds_for_the_job():
    guard = StatisticsGuard({**DP, "dp": {"epsilon": 1.0, "budget": 1.5}}, owner="site-1 (job)")
    assert "count" in guard.answer(SUMMARY, {"columns": ["x"]}, _table)["x"]
    refused = guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0}}, _table)["x"]
    assert refused == {"refused": "statistics budget of site-1 (job) exhausted: spent epsilon 1 "
                                  "of 1.5, one more answer needs 1"}


def test_a_dp_grid_too_fine_is_refused_before_spending():
    ledger = StudyLedger(4.0)
    rules = {**DP, "columns": {"x": {"bounds": [0.0, 1e6], "precision": 1.0}}}
    guard = StatisticsGuard(rules, ledger.for_job(0))
    answer = guard.answer(SPREAD, {"columns": ["x"], "means": {"x": 1.0}}, _table)
    assert "coarser statistics.precision" in answer["x"]["refused"] and ledger.calls == []


def test_two_tables_served_in_one_job_keep_their_own_answers():
    guard = StatisticsGuard({"min_count": 5})
    one = guard.answer(SUMMARY, {"columns": ["x"]}, _table, "a.csv")
    other = guard.answer(SUMMARY, {"columns": ["x"]}, lambda asked: {"x": VALUES["y"]}, "b.csv")
    assert one["x"]["count"] == other["x"]["count"] and one["x"]["sum"] != other["x"]["sum"]
