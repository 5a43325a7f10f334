"""FedOpt (Reddi et al. 2021, Algorithm 2) against a reference written out here, step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atoll.fl.app_config import FedOptArgs
from atoll.fl.model import Model
from atoll.fl.serde import load_file
from atoll.fl.workflows import run_fedopt
from atoll.fl.workflows.fedopt import ServerOptimizer

from .helpers import run_workflow


def reference(optimizer, x0, means_of, rounds, lr, b1, b2, tau):
    """Scalar loops over a flat list: a deliberately naive re-derivation of the paper's update."""
    x = [float(v) for v in x0]
    m = [0.0] * len(x)
    v = [tau * tau] * len(x)
    for t in range(rounds):
        target = means_of(t, x)
        for i in range(len(x)):
            d = target[i] - x[i]
            m[i] = b1 * m[i] + (1 - b1) * d
            if optimizer == "adam":
                v[i] = b2 * v[i] + (1 - b2) * d * d
            elif optimizer == "yogi":
                s = 1.0 if v[i] - d * d > 0 else (-1.0 if v[i] - d * d < 0 else 0.0)
                v[i] = v[i] - (1 - b2) * d * d * s
            else:
                v[i] = v[i] + d * d
            x[i] = x[i] + lr * m[i] / (math.sqrt(v[i]) + tau)
    return x


def _means(t, x):
    # the sites' averaged result moves each coordinate differently each round
    return [xi + (-1) ** (t + i) * 0.3 * (i + 1) + 0.05 * t for i, xi in enumerate(x)]


@pytest.mark.parametrize("optimizer", ["adam", "yogi", "adagrad"])
def test_server_optimizer_matches_the_reference(optimizer):
    x0 = np.array([0.5, -1.0, 2.0, 0.0, 3.0])
    hyper = {"lr": 0.1, "b1": 0.9, "b2": 0.99, "tau": 1e-3}
    expected = reference(optimizer, x0, _means, 6, **hyper)
    opt = ServerOptimizer(optimizer, hyper["lr"], hyper["b1"], hyper["b2"], hyper["tau"])
    x = {"w": x0.copy(), "steps": np.array(4, np.int64)}
    for t in range(6):
        mean = {"w": np.array(_means(t, list(x["w"]))), "steps": np.array(7, np.int64)}
        x = opt(x, mean, t)
    np.testing.assert_allclose(x["w"], expected, rtol=1e-12, atol=1e-12)
    assert int(x["steps"]) == 7  # integer params take the plain mean


@pytest.mark.parametrize("optimizer", ["adam", "yogi"])
def test_fedopt_workflow_matches_the_reference(tmp_path, optimizer):
    """Two sites with different weights; the reference sees only their weighted mean."""
    shifts, weights = {"a": 1.0, "b": -0.5}, {"a": 3, "b": 1}

    def site(name):
        def handler(topic, model):
            if topic == "validate":
                return Model(metrics={"accuracy": 0.5}, num_examples=1)
            return Model(
                params={"w": model.params["w"] + shifts[name] * model.round},
                num_examples=weights[name],
            )

        return handler

    args = FedOptArgs(
        num_rounds=4,
        optimizer=optimizer,
        server_lr=0.2,
        beta1=0.8,
        beta2=0.9,
        tau=0.01,
        evaluate_every=0,
        cross_site_eval="none",
    )
    x0 = np.array([1.0, 2.0, -3.0])
    run_workflow(
        run_fedopt,
        args,
        {"a": site("a"), "b": site("b")},
        tmp_path,
        initial=Model(params={"w": x0.copy()}),
    )
    mean_shift = (3 * 1.0 + 1 * -0.5) / 4

    def means(t, x):
        return [xi + mean_shift * (t + 1) for xi in x]

    expected = reference(optimizer, x0, means, 4, lr=0.2, b1=0.8, b2=0.9, tau=0.01)
    final = load_file(tmp_path / "global_model_final.safetensors")
    np.testing.assert_allclose(final.params["w"], expected, rtol=1e-9, atol=1e-9)


def test_without_an_initial_model_the_first_mean_becomes_the_global_model(tmp_path):
    def handler(topic, model):
        w = model.params["w"] if model.params else np.zeros(2)
        return Model(params={"w": w + 1.0}, num_examples=1)

    args = FedOptArgs(
        num_rounds=2, evaluate_every=0, cross_site_eval="none", server_lr=0.5, tau=0.1
    )
    run_workflow(run_fedopt, args, {"a": handler}, tmp_path)
    expected = reference(
        "adam", [1.0, 1.0], lambda t, x: [xi + 1.0 for xi in x], 1, lr=0.5, b1=0.9, b2=0.99, tau=0.1
    )
    final = load_file(tmp_path / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(final, expected, rtol=1e-12)
