"""The filters themselves never add noise that no clip scaled, whatever reached them: the spec
refuses that order (test_filters.py), and apply() refuses it again for a pipeline built in code."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.privacy.filters import apply
from atoll.spec.privacy import ClipFilter, GaussianFilter


def test_a_gaussian_without_a_clip_before_it_is_refused_by_apply():
    update = {"w": np.ones(4, np.float32)}
    with pytest.raises(ValueError, match="a gaussian filter needs a clip filter before it"):
        apply([GaussianFilter(type="gaussian", noise_multiplier=1.0)], update,
              np.random.default_rng(0))
    out = apply([ClipFilter(type="clip", max_norm=1.0),
                 GaussianFilter(type="gaussian", noise_multiplier=1.0)], update,
                np.random.default_rng(0))
    assert out["w"].shape == (4,) and not np.array_equal(out["w"], update["w"])
