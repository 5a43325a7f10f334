"""Each built-in filter's effect on a known update, value by value."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.privacy import filters
from atoll.spec.errors import SpecError
from atoll.spec.privacy import parse_privacy


def _update():
    return {"layer.weight": np.array([[3.0, -4.0], [0.5, -0.25]], np.float32),
            "layer.bias": np.array([1.0, -2.0], np.float32),
            "bn.num_batches_tracked": np.array(7, np.int64)}


def test_exclude_zeroes_matching_variables_and_keeps_the_others():
    out = filters.exclude(_update(), ["*.bias"])
    np.testing.assert_array_equal(out["layer.bias"], [0.0, 0.0])
    np.testing.assert_array_equal(out["layer.weight"], [[3.0, -4.0], [0.5, -0.25]])
    assert out["layer.bias"].dtype == np.float32


def test_exclude_on_a_task_drops_the_variables_so_the_site_keeps_its_own():
    out = filters.apply(parse_privacy({"filters": {"task": [
        {"type": "exclude", "patterns": ["layer.*"]}]}}, "t").filters.task, _update(),
        drop_excluded=True)
    assert sorted(out) == ["bn.num_batches_tracked"]


def test_percentile_shares_exactly_the_largest_fraction_by_magnitude():
    # 6 floating entries: |-4| 3 |-2| 1 0.5 |-0.25|; a third of them is the largest two
    out = filters.percentile(_update(), 1 / 3)
    np.testing.assert_array_equal(out["layer.weight"], [[3.0, -4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(out["layer.bias"], [0.0, 0.0])
    assert int(out["bn.num_batches_tracked"]) == 7  # integers are not part of an update's values
    half = filters.percentile(_update(), 0.5)  # ceil(3.0) = 3 entries
    np.testing.assert_array_equal(half["layer.bias"], [0.0, -2.0])


def test_clip_scales_the_whole_update_to_the_norm():
    # norm = sqrt(9 + 16 + 0.25 + 0.0625 + 1 + 4) = sqrt(30.3125)
    out = filters.clip(_update(), 1.0)
    scale = 1.0 / np.sqrt(30.3125)
    np.testing.assert_allclose(out["layer.weight"], np.array([[3.0, -4.0], [0.5, -0.25]]) * scale,
                               rtol=1e-6)
    np.testing.assert_allclose(out["layer.bias"], np.array([1.0, -2.0]) * scale, rtol=1e-6)
    assert filters.l2_norm(out) == pytest.approx(1.0, rel=1e-6)
    unchanged = filters.clip(_update(), 10.0)
    np.testing.assert_array_equal(unchanged["layer.weight"], _update()["layer.weight"])


def test_gaussian_adds_noise_of_noise_multiplier_times_the_clip_norm():
    settings = parse_privacy({"filters": {"reply": [
        {"type": "clip", "max_norm": 100.0}, {"type": "gaussian", "noise_multiplier": 0.5}]}}, "t")
    out = filters.apply(settings.filters.reply, _update(), np.random.default_rng(7))
    expected = np.random.default_rng(7)  # the same draws, in the same order: std 0.5 * 100
    weight = np.array([[3.0, -4.0], [0.5, -0.25]]) + expected.normal(0.0, 50.0, (2, 2))
    bias = np.array([1.0, -2.0]) + expected.normal(0.0, 50.0, (2,))
    np.testing.assert_allclose(out["layer.weight"], weight.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(out["layer.bias"], bias.astype(np.float32), rtol=1e-6)


def test_a_gaussian_filter_without_a_clip_before_it_is_refused_naming_it():
    with pytest.raises(SpecError) as refused:
        parse_privacy({"filters": {"reply": [{"type": "gaussian", "noise_multiplier": 1.0}]}},
                      "app.yaml")
    assert "reply[0]: a gaussian filter needs a clip filter before it" in str(refused.value)


def test_an_unknown_filter_names_its_field():
    with pytest.raises(SpecError) as refused:
        parse_privacy({"filters": {"reply": [{"type": "blur"}]}}, "app.yaml")
    assert "privacy.filters.reply[0]: Input tag 'blur'" in str(refused.value)
