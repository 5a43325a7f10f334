"""Server-side DP-FedAvg (dp.mode: server): each update clipped at the server, the unweighted
sum noised once with std noise_multiplier x clip_norm, then averaged."""

from __future__ import annotations

import numpy as np

from atoll.fl.model import Model
from atoll.fl.privacy.server_privacy import CentralDP, apply_update


def test_updates_are_clipped_summed_noised_and_averaged():
    global_params = {"w": np.array([1.0, 1.0], np.float32)}
    central = CentralDP(global_params, clip_norm=1.0, noise_multiplier=0.5,
                        rng=np.random.default_rng(3))
    central.add(Model(params={"w": np.array([4.0, 5.0], np.float32)}, num_examples=9))  # d=(3,4)
    central.add(Model(params={"w": np.array([0.5, 0.0])}, params_type="diff", num_examples=1))
    noise = np.random.default_rng(3).normal(0.0, 0.5, (2,))
    expected = (np.array([0.6, 0.8]) + np.array([0.5, 0.0]) + noise) / 2  # weights ignored
    mean = central.mean_update()
    np.testing.assert_allclose(mean["w"], expected, rtol=1e-12)
    new = apply_update(global_params, mean)
    assert new["w"].dtype == np.float32
    np.testing.assert_allclose(new["w"], (1.0 + expected).astype(np.float32))
