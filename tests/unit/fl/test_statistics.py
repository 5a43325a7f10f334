"""Federated statistics (examples/statistics on the simulator): the global values are the pooled
data's, and each site's own rules (min_count, noise) hold whatever the job asks."""

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
        assert (got["min"], got["max"]) == (pooled.min(), pooled.max())
        for site, folder in folders.items():
            own = _pooled({site: folder}, column)
            mine = result["columns"][column]["sites"][site]
            assert mine["count"] == len(own)
            assert abs(mine["mean"] - own.mean()) <= 1e-9
            assert abs(mine["variance"] - own.var(ddof=1)) <= 1e-9
        edges = result["columns"][column]["edges"]
        counts, _ = np.histogram(pooled, bins=edges)
        shown = got["histogram"]
        hidden = {n for n in result["notes"] if f": {column} bin " in n}
        if not hidden:
            assert shown == counts.tolist()
        assert sum(shown) <= len(pooled)
    assert (tmp_path / "results" / "histograms.png").stat().st_size > 1000


def test_a_site_suppresses_bins_and_columns_under_its_min_count(tmp_path):
    # hospital-3 has 120 records: min_count 200 hides every column there; hospital-2 hides bins
    folders, result = _run(tmp_path, {"hospital-3": {"min_count": 200},
                                      "hospital-2": {"min_count": 30}})
    age = result["columns"]["age"]
    assert age["sites"]["hospital-3"] == {
        "suppressed": "fewer records than this site's min_count (200)"}
    assert "hospital-3: age suppressed: fewer records than this site's min_count (200)" in \
        result["notes"]
    pooled = _pooled({s: f for s, f in folders.items() if s != "hospital-3"}, "age")
    assert abs(age["global"]["mean"] - pooled.mean()) <= 1e-9  # from the sites that released
    histogram = age["sites"]["hospital-2"]["histogram"]
    own, _ = np.histogram(_pooled({"hospital-2": folders["hospital-2"]}, "age"),
                          bins=age["edges"])
    for index, count in enumerate(own.tolist()):
        if 0 < count < 30:
            assert histogram[index] is None
            assert any(n.startswith(f"hospital-2: age bin {index} ") for n in result["notes"])
        else:
            assert histogram[index] == count
    assert result["rules"]["hospital-2"] == {"min_count": 30, "noise": 0.0}


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
    assert spread(values[:4], 2.0, [0, 10], rules, rng)["suppressed"]


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
    assert result["rules"]["hospital-1"] == {"min_count": 130, "noise": 0.05}
    age = result["columns"]["age"]
    assert "suppressed" in age["sites"]["hospital-3"]
    pooled = _pooled({s: f for s, f in folders.items() if s != "hospital-3"}, "age")
    got = age["global"]
    assert got["count"] != len(pooled)  # noisy
    assert abs(got["count"] - len(pooled)) <= 0.05 * len(pooled)
    assert abs(got["mean"] - pooled.mean()) <= 0.11 * pooled.mean()  # sum and count each +-5 %
