"""Federated statistics (examples/statistics on the simulator): the global values are the pooled
data's (computed here with numpy alone, the site's grid and suppression rule written out
independently), and each site's own rules (min_count, precision, noise) hold whatever the job
asks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from atoll.fl.simulator import simulate
from atoll.fl.statistics import (
    StatisticsError,
    effective_rules,
    quantiles,
    read_columns,
    spread,
    summarize,
)
from atoll.spec.statistics_rules import StatisticsRules

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "statistics"
COLUMNS = ["age", "bmi", "systolic_bp", "length_of_stay"]


def _make_data():
    spec = importlib.util.spec_from_file_location("make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pooled(folders, column):
    """Independently of atoll: numpy's own CSV reader, every site's rows in one array."""
    parts = []
    for folder in folders.values():
        table = np.genfromtxt(folder / "cohort.csv", delimiter=",", names=True, dtype=None,
                              encoding="utf-8", missing_values="", filling_values=np.nan)
        values = np.asarray(table[column], dtype=np.float64)
        parts.append(values[~np.isnan(values)])
    return np.concatenate(parts)


def _run(tmp_path, rules=None):
    folders = _make_data().write_cohorts(tmp_path / "data")
    sites = {site: {"cohort": str(folder)} for site, folder in folders.items()}
    result = simulate(EXAMPLE, sites, results_dir=tmp_path / "results", statistics_rules=rules)
    assert result.site_errors == {}
    return folders, json.loads((tmp_path / "results" / "statistics.json").read_text())


def _reference_cells(values, precision, min_count):
    """The site's rule, independently: cells floor(v / p) from the minimum's to the maximum's;
    cells of 1..min_count-1 hidden with the smallest shown one; everything hidden if that
    leaves the hidden total under min_count + (hidden - 1)."""
    cells = np.floor(values / precision + 1e-9).astype(int)
    index = np.arange(cells.min(), cells.max() + 1)
    counts = np.array([(cells == k).sum() for k in index])
    small = [i for i, c in enumerate(counts) if 0 < c < min_count]
    hidden = set(small)
    if small:
        big = [i for i, c in enumerate(counts) if c >= min_count]
        if big:
            hidden.add(min(big, key=lambda i: (counts[i], i)))
        if counts[list(hidden)].sum() - (len(hidden) - 1) < min_count:
            hidden = set(range(len(counts)))
    return {int(k): (None if i in hidden else int(c))
            for i, (k, c) in enumerate(zip(index, counts, strict=True))}


def test_global_statistics_equal_the_pooled_data_without_noise(tmp_path):
    folders, result = _run(tmp_path)
    for column in COLUMNS:
        pooled = _pooled(folders, column)
        got = result["columns"][column]["global"]
        assert got["count"] == len(pooled)
        assert got["sum"] == pytest.approx(pooled.sum(), abs=1e-9)
        assert abs(got["mean"] - pooled.mean()) <= 1e-9
        assert abs(got["variance"] - pooled.var(ddof=1)) <= 1e-9
        assert abs(got["std"] - pooled.std(ddof=1)) <= 1e-9
        # min and max: the edges of the unit cells holding them, never a record's own value
        assert (got["min"], got["max"]) == (np.floor(pooled.min()), np.floor(pooled.max()) + 1)
        # the global histogram: the sum of each site's released cells (hidden ones count 0)
        expected: dict[int, int] = {}
        for site, folder in folders.items():
            own = _reference_cells(_pooled({site: folder}, column), 1.0, 10)
            mine = result["columns"][column]["sites"][site]
            assert mine["histogram"] == list(own.values())
            assert mine["edges"][0] == min(own) and mine["edges"][-1] == max(own) + 1
            for k, c in own.items():
                expected[k] = expected.get(k, 0) + (c or 0)
            released = [c for c in own.values() if c is not None]
            assert all(c == 0 or c >= 10 for c in released)
        edges = result["columns"][column]["edges"]
        assert edges == [float(k) for k in range(min(expected), max(expected) + 2)]
        assert got["histogram"] == [expected[k] for k in sorted(expected)]
    assert (tmp_path / "results" / "histograms.png").stat().st_size > 1000


def test_a_site_suppresses_cells_and_columns_under_its_min_count(tmp_path):
    # hospital-3 has 120 records: min_count 200 hides every column there; hospital-2 hides cells;
    # hospital-1 counts age in cells of 5 years
    folders, result = _run(tmp_path, {"hospital-3": {"min_count": 200},
                                      "hospital-2": {"min_count": 30},
                                      "hospital-1": {"columns": {"age": {"precision": 5.0}}}})
    age = result["columns"]["age"]
    assert age["sites"]["hospital-3"] == {
        "suppressed": "fewer records than this site's min_count (200)"}
    assert "hospital-3: age suppressed: fewer records than this site's min_count (200)" in \
        result["notes"]
    pooled = _pooled({s: f for s, f in folders.items() if s != "hospital-3"}, "age")
    assert abs(age["global"]["mean"] - pooled.mean()) <= 1e-9  # from the sites that released
    own = _reference_cells(_pooled({"hospital-2": folders["hospital-2"]}, "age"), 1.0, 30)
    assert age["sites"]["hospital-2"]["histogram"] == list(own.values())
    hidden = [k for k, c in own.items() if c is None]
    assert len(hidden) >= 2  # the small cells and one more
    for k in hidden:
        assert (f"hospital-2: age cell {k:.4g} to {k + 1:.4g} suppressed: under its min_count "
                "or hidden with such cells") in result["notes"]
    five = _reference_cells(_pooled({"hospital-1": folders["hospital-1"]}, "age"), 5.0, 10)
    assert age["sites"]["hospital-1"]["histogram"] == list(five.values())
    assert age["sites"]["hospital-1"]["min"] % 5 == 0
    # the global histogram is on the coarsest grid (5): hospital-2's unit cells summed into it
    assert age["edges"][1] - age["edges"][0] == 5.0
    expected: dict[int, int] = {}
    for k, c in five.items():
        expected[k] = expected.get(k, 0) + (c or 0)
    for k, c in own.items():
        expected[k // 5] = expected.get(k // 5, 0) + (c or 0)
    assert age["global"]["histogram"] == [expected.get(k, 0)
                                          for k in range(min(expected), max(expected) + 1)]
    assert result["rules"]["hospital-2"]["min_count"] == 30


def test_noise_stays_within_the_sites_level_and_a_job_cannot_lower_min_count():
    rules = effective_rules({"min_count": 5, "noise": 0.1}, requested_min_count=2)
    assert rules.min_count == 5  # a job asks for less than the site allows: the site's holds
    assert effective_rules({"min_count": 5}, requested_min_count=50).min_count == 50
    assert effective_rules(None).min_count == 10  # a site that set nothing: the default
    values = np.arange(1.0, 101.0)
    rng = np.random.default_rng(1)
    noisy = [summarize(values, rules, rng) for _ in range(50)]
    assert all(90 <= r["count"] <= 110 and 4545 <= r["sum"] <= 5555 for r in noisy)
    assert len({r["sum"] for r in noisy}) > 1
    assert summarize(values[:4], rules, rng) == {
        "suppressed": "fewer records than this site's min_count (5)"}
    assert spread(values[:4], 2.0, rules, rng)["suppressed"]
    assert StatisticsRules.model_validate({"min_count": 5}).min_count == 5


def test_bad_tables_name_file_line_and_column(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("age,bmi\n40,20\nforty,21\n")
    with pytest.raises(StatisticsError, match=r"t.csv:3: column 'age' holds 'forty'"):
        read_columns(table, ["age"])
    with pytest.raises(StatisticsError, match="no column 'weight'; columns: age, bmi"):
        read_columns(table, ["weight"])


def test_quantiles_from_a_histogram_interpolate_within_bins():
    assert quantiles([0, 1, 2], [10, 10], [0.25, 0.5, 0.75]) == {
        "0.25": 0.5, "0.5": 1.0, "0.75": 1.5}


def test_noise_and_a_jobs_stricter_min_count_through_the_job(tmp_path):
    import shutil

    import yaml

    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("__pycache__"))
    app = yaml.safe_load((job / "app" / "app.yaml").read_text())
    app["server"]["args"]["min_count"] = 130  # stricter than every site: hospital-3 has 120
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    folders = _make_data().write_cohorts(tmp_path / "data")
    sites = {site: {"cohort": str(folder)} for site, folder in folders.items()}
    simulate(job, sites, results_dir=tmp_path / "results",
             statistics_rules={s: {"min_count": 5, "noise": 0.05} for s in sites})
    result = json.loads((tmp_path / "results" / "statistics.json").read_text())
    assert result["rules"]["hospital-1"]["min_count"] == 130
    assert result["rules"]["hospital-1"]["noise"] == 0.05
    age = result["columns"]["age"]
    assert "suppressed" in age["sites"]["hospital-3"]
    pooled = _pooled({s: f for s, f in folders.items() if s != "hospital-3"}, "age")
    got = age["global"]
    assert got["count"] != len(pooled)  # noisy
    assert abs(got["count"] - len(pooled)) <= 0.05 * len(pooled)
    assert abs(got["mean"] - pooled.mean()) <= 0.11 * pooled.mean()  # sum and count each +-5 %


def test_a_dp_site_through_the_job(tmp_path):
    """hospital-1 answers with dp: no min or max, noisy count and sum within what the Laplace
    scale allows, a histogram over its bounds; the job's two answers spend 2 x epsilon."""
    folders = _make_data().write_cohorts(tmp_path / "data")
    sites = {site: {"cohort": str(folder)} for site, folder in folders.items()}
    bounds = {c: {"bounds": [0.0, 300.0]} for c in COLUMNS}
    dp = {"min_count": 5, "columns": bounds, "dp": {"epsilon": 2.0, "budget": 4.0}}
    simulate(EXAMPLE, sites, results_dir=tmp_path / "results",
             statistics_rules={"hospital-1": dp})
    result = json.loads((tmp_path / "results" / "statistics.json").read_text())
    mine = result["columns"]["age"]["sites"]["hospital-1"]
    own = _pooled({"hospital-1": folders["hospital-1"]}, "age")
    assert "min" not in mine and mine["bounds"] == [0.0, 300.0]
    # each of 4 columns x 2 numbers gets epsilon 2 / 8: Laplace scale 4 on the count, 1200 on
    # the sum; 10 scales is a 1 in 40,000 event
    assert mine["count"] != len(own) and abs(mine["count"] - len(own)) < 40
    assert abs(mine["sum"] - own.sum()) < 12_000
    assert len(mine["histogram"]) == 300 and mine["edges"][0] == 0.0
    assert result["rules"]["hospital-1"]["dp"] == {"epsilon": 2.0, "budget": 4.0}
    assert "min" not in result["columns"]["age"]["global"]  # not every site released one


def test_a_dp_sites_budget_holds_in_the_simulator_too(tmp_path):
    """With a budget of one answer, the job's second question (the spread) is refused by the
    simulated site's ledger, naming it, and nothing of it is released."""
    folders = _make_data().write_cohorts(tmp_path / "data")
    sites = {site: {"cohort": str(folder)} for site, folder in folders.items()}
    bounds = {c: {"bounds": [0.0, 300.0]} for c in COLUMNS}
    dp = {"min_count": 5, "columns": bounds, "dp": {"epsilon": 2.0, "budget": 2.0}}
    simulate(EXAMPLE, sites, results_dir=tmp_path / "results",
             statistics_rules={"hospital-1": dp}, raise_on_error=False)
    result = json.loads((tmp_path / "results" / "statistics.json").read_text())
    mine = result["columns"]["age"]["sites"]["hospital-1"]
    assert "count" in mine  # the summary was answered
    assert "histogram" not in mine, mine  # the spread was refused
    text = json.dumps(result)
    assert "the simulated site's statistics.dp" in text, text[:2000]


def test_a_query_the_server_restarted_runs_again_and_answers_the_same(tmp_path):
    folders, fresh = _run(tmp_path / "fresh")
    sites = {site: {"cohort": str(folder)} for site, folder in folders.items()}
    # the runner's path after a server restart that found no committed round (fl/runner.py)
    result = simulate(EXAMPLE, sites, results_dir=tmp_path / "resumed",
                      job_args={"resume": {"attempt": 1}})
    assert result.site_errors == {}
    assert json.loads((tmp_path / "resumed" / "statistics.json").read_text()) == fresh
