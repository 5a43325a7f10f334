"""What one site's answer about one column releases (atoll.fl.statistics_release): its own grid,
small cells hidden with a complementary cell, extremes rounded outward, and dp's Laplace noise
at the scale its sensitivity and epsilon give (checked statistically, fixed seeds)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from atoll.fl.statistics_release import (
    MAX_CELLS,
    cell_index,
    rounded_out,
    spread,
    summarize,
    suppress,
)
from atoll.spec.statistics_rules import StatisticsRules


def _hidden_cells_bound(counts, min_count):
    """Independently: what an attacker who knows the column's count, the released cells and
    that a hidden cell is non-empty can say of each hidden cell: at most T - (k - 1)."""
    shown, hidden = suppress(counts, min_count)
    if not hidden:
        return shown, None
    total = sum(counts) - sum(c for c in shown if c is not None)
    return shown, total - (len(hidden) - 1)


def test_small_cells_and_one_more_are_hidden():
    shown, hidden = suppress([0, 3, 12, 25, 0, 15], 10)
    assert hidden == [1, 2] and shown == [0, None, None, 25, 0, 15]
    # the count (55) minus the released cells gives 15 over two cells: either could be 1..14
    assert suppress([0, 12, 25], 10) == ([0, 12, 25], [])
    # only small cells and too few records among them: nothing of the histogram is released
    assert suppress([1, 0, 2, 1], 3) == ([None] * 4, [0, 1, 2, 3])


def test_no_hidden_cell_is_determined_by_the_count_and_the_released_cells():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        counts = rng.integers(0, 25, size=rng.integers(1, 9)).tolist()
        min_count = int(rng.integers(1, 15))
        shown, bound = _hidden_cells_bound(counts, min_count)
        assert all(c is None or c == 0 or c >= min_count for c in shown)
        if bound is not None and any(c is not None for c in shown):
            assert bound >= min_count  # each hidden cell could hold min_count records or more
        elif bound is not None:
            assert all(c is None for c in shown)  # everything hidden, empty cells too


def test_a_stricter_min_count_hides_a_superset():
    for counts in itertools.product([0, 2, 9, 10, 11, 30], repeat=4):
        for low, high in ((5, 10), (10, 11), (3, 31)):
            assert set(suppress(list(counts), low)[1]) <= set(suppress(list(counts), high)[1])


def test_cells_and_rounded_extremes():
    assert cell_index(np.asarray([0.3, 2.99, -0.5, 5.0]), 0.1).tolist() == [3, 29, -5, 50]
    assert rounded_out(3.2, 7.9, 0.5) == (3.0, 8.0)
    assert rounded_out(18.0, 99.0, 1.0) == (18.0, 100.0)  # max < 100: the cell above 99
    values = np.random.default_rng(1).normal(50, 10, 200)
    rules = StatisticsRules(min_count=5, precision=2.0)
    answer = summarize(values, rules, np.random.default_rng(0))
    assert answer["min"] <= values.min() < answer["min"] + 2
    assert answer["max"] - 2 <= values.max() < answer["max"]
    assert answer["min"] not in values and answer["max"] not in values


def test_histograms_only_on_the_sites_grid():
    values = np.arange(0.0, 100.0, 0.5)
    rules = StatisticsRules(min_count=5, precision=10.0)
    rng = np.random.default_rng(0)
    own = spread(values, 50.0, rules, rng)
    assert (own["first"], own["width"]) == (0, 10.0)
    assert own["histogram"] == [20.0] * 10
    assert spread(values, 50.0, rules, rng, edges=[float(e) for e in range(0, 110, 10)]) == own
    refused = spread(values, 50.0, rules, rng, edges=[0, 49.99, 100])
    assert "own grid only" in refused["refused"] and "histogram" not in refused
    fine = StatisticsRules(precision=1.0 / MAX_CELLS)
    assert "coarser statistics.precision" in spread(values, 50.0, fine, rng)["refused"]


def _dp_rules(epsilon=1.0):
    return StatisticsRules.model_validate({
        "min_count": 5, "precision": 10.0, "columns": {"x": {"bounds": [0.0, 100.0]}},
        "dp": {"epsilon": epsilon, "budget": 100.0}})


def test_dp_noise_has_the_laplace_scale_of_its_sensitivity():
    values = np.random.default_rng(3).uniform(0, 100, 500)
    rules, rng, epsilon = _dp_rules(), np.random.default_rng(11), 0.25
    counts, sums, ssd, cells = [], [], [], []
    mean = 40.0
    own_cells, _ = np.histogram(values, bins=np.arange(0, 110, 10))
    for _ in range(3000):
        first = summarize(values, rules, rng, "x", epsilon)
        counts.append(first["count"] - len(values))
        sums.append(first["sum"] - values.sum())
        second = spread(values, mean, rules, rng, "x", epsilon)
        ssd.append(second["sum_squared_deviations"] - ((values - mean) ** 2).sum())
        cells.append(np.asarray(second["histogram"]) - own_cells)
    # scale b = sensitivity / epsilon: count 1, sum max|bound| 100, squared deviations
    # max((100 - 40)^2, 40^2) = 3600, a cell 1 (a record is in one cell)
    for noise, sensitivity in ((counts, 1.0), (sums, 100.0), (ssd, 3600.0),
                               (np.concatenate(cells), 1.0)):
        scale = sensitivity / epsilon
        assert stats.kstest(np.asarray(noise), "laplace", args=(0, scale)).pvalue > 1e-3
        assert np.std(noise) == pytest.approx(np.sqrt(2) * scale, rel=0.06)
    assert "min" not in first and "max" not in first and first["epsilon"] == 2 * epsilon
    assert (second["first"], len(second["histogram"])) == (0, 10)  # the bounds' grid


def test_dp_needs_bounds_and_clips_to_them():
    rules, rng = _dp_rules(), np.random.default_rng(0)
    assert "statistics.columns.y.bounds" in summarize(np.ones(50), rules, rng, "y", 1.0)["refused"]
    big = np.full(1000, 1e9)  # clipped to 100: the sum's noise covers one record's change
    assert summarize(big, rules, rng, "x", 10.0)["sum"] == pytest.approx(1e5, abs=200)
    assert summarize(np.ones(2), rules, rng, "x", 100.0) == {
        "suppressed": "fewer records than this site's min_count (5)"}  # on the noisy count
    # a mean outside the bounds is clipped to them: deviations from 100, sensitivity 100^2
    far = spread(np.full(10, 100.0), 1e6, rules, rng, "x", 1e9)["sum_squared_deviations"]
    assert far == pytest.approx(0.0, abs=1e-3)
    # values outside the bounds are clipped too: each deviates by 50 from a mean of 50
    out = spread(np.full(10, 1e9), 50.0, rules, rng, "x", 1e9)["sum_squared_deviations"]
    assert out == pytest.approx(10 * 50.0**2, abs=1e-3)
