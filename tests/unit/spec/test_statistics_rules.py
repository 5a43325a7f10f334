"""The statistics rules of a study (study_runtime.yaml ``statistics:``): every rule validated
strictly, and the per-study dp budget the site parent's ledger reads."""

from __future__ import annotations

import pytest

from atoll.spec.errors import SpecError
from atoll.spec.statistics_rules import StatisticsRules, statistics_budget
from atoll.spec.study_runtime import parse_study_runtime


def _runtime(rules):
    return parse_study_runtime({"format_version": 2, "studies": {"alpha": {"statistics": rules},
                                                                 "beta": {}}}, "process")


def test_defaults_and_per_column_rules():
    rules = StatisticsRules()
    assert (rules.min_count, rules.precision, rules.max_queries, rules.dp) == (10, 1.0, 2, None)
    rules = StatisticsRules.model_validate(
        {"precision": 2.0, "columns": {"bmi": {"precision": 0.5, "bounds": [10, 70]},
                                       "age": {"bounds": [0, 120]}}})
    assert rules.precision_of("bmi") == 0.5 and rules.precision_of("age") == 2.0
    assert rules.bounds_of("age") == (0.0, 120.0) and rules.bounds_of("other") is None


@pytest.mark.parametrize(("rules", "where", "says"), [
    ({"precision": 0}, "precision", "greater than 0"),
    ({"max_queries": 0}, "max_queries", "must be at least 1, not 0"),
    ({"columns": {"age": {"bounds": [5, 5]}}}, "columns.age.bounds", "low < high"),
    ({"columns": {"age": {"bounds": [1, 2, 3]}}}, "columns.age.bounds", "low < high"),
    ({"columns": {"age": {"width": 1}}}, "columns.age.width", ""),
    ({"dp": {"epsilon": 0.5}}, "dp.budget", ""),
    ({"dp": {"epsilon": 0, "budget": 1}}, "dp.epsilon", "greater than 0"),
    ({"dp": {"epsilon": 2, "budget": 1}}, "dp", "more than the whole budget"),
    ({"dp": {"epsilon": 1, "budget": 2}, "noise": 0.1}, "statistics", "exclude each other"),
])
def test_bad_rules_are_named(rules, where, says):
    with pytest.raises(SpecError) as failure:
        _runtime(rules)
    assert f"studies.alpha.statistics.{where}" in str(failure.value) or (
        where == "statistics" and "studies.alpha.statistics" in str(failure.value))
    assert says in str(failure.value)


def test_the_study_budget_for_the_site_ledger():
    runtime = _runtime({"dp": {"epsilon": 0.5, "budget": 4.0},
                        "columns": {"age": {"bounds": [0, 120]}}})
    assert statistics_budget(runtime, "alpha") == (4.0, 0.0)
    assert statistics_budget(runtime, "beta") is None  # no statistics rules: nothing to keep
    assert statistics_budget(runtime, "gamma") is None
    assert statistics_budget(_runtime({"min_count": 5}), "alpha") is None  # no dp
