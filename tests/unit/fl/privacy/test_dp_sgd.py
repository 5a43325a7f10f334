"""Example-level DP-SGD through Opacus: the epsilon each site reports is Opacus's RDP value for
the steps it took, computed here independently; a site's budget stops it."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

importlib.import_module("opacus")  # required: a process this test starts loads it

from opacus.accountants.analysis import rdp as opacus_rdp  # noqa: E402
from opacus.accountants.rdp import RDPAccountant  # noqa: E402

from atoll.fl.model import Model  # noqa: E402
from atoll.fl.privacy.dp_sgd import make_private  # noqa: E402
from atoll.fl.torch_bridge import load_params, to_params  # noqa: E402
from atoll.spec.privacy import PrivacySettings, parse_site_policy  # noqa: E402

from .sites import run_private  # noqa: E402

EXAMPLES, BATCH, NOISE = 64, 16, 1.2
SETTINGS = PrivacySettings.model_validate(
    {"dp_sgd": {"noise_multiplier": NOISE, "max_grad_norm": 1.0, "delta": 1e-5}})


def _trainer(seed: int):
    state: dict = {}

    def train(model: Model) -> Model:
        if not state:
            generator = torch.Generator().manual_seed(seed)
            x = torch.randn(EXAMPLES, 5, generator=generator)
            y = (x[:, 0] > 0).long()
            net = torch.nn.Linear(5, 2)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                 batch_size=BATCH)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            state["net"] = net
            state["private"] = make_private(net, optimizer, loader)
        net = state["net"]
        private_net, optimizer, loader = state["private"]
        load_params(net, model.params)
        for x, y in loader:  # one epoch of Poisson-sampled batches
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(private_net(x), y).backward()
            optimizer.step()
        return Model(params=to_params(net), num_examples=EXAMPLES)

    return train


def _initial():
    return {"weight": np.zeros((2, 5), np.float32), "bias": np.zeros(2, np.float32)}


def _opacus_epsilon(steps: int, delta: float) -> float:
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = opacus_rdp.compute_rdp(q=BATCH / EXAMPLES, noise_multiplier=NOISE, steps=steps,
                                 orders=orders)
    return float(opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


def test_each_round_reports_opacus_epsilon_for_the_steps_taken(tmp_path):
    federation, errors = run_private(SETTINGS, {"a": _trainer(0), "b": _trainer(1)}, tmp_path,
                                     _initial(), rounds=2)
    assert errors == {}
    rounds = [e for e in federation.events if e["event"] == "round"]
    steps_per_round = EXAMPLES // BATCH
    for index, event in enumerate(rounds):
        for site in ("a", "b"):
            assert event["sites"][site]["train"]["dp_sgd_epsilon"] == pytest.approx(
                _opacus_epsilon(steps_per_round * (index + 1), 1e-5), rel=1e-9)


def test_a_site_refuses_to_send_an_update_trained_past_its_budget(tmp_path):
    budget = (_opacus_epsilon(4, 1e-5) + _opacus_epsilon(8, 1e-5)) / 2  # between rounds 1 and 2
    policy = parse_site_policy({"format_version": 1, "budget": {"epsilon": budget}})
    federation, errors = run_private(SETTINGS, {"a": _trainer(0), "b": _trainer(1)}, tmp_path,
                                     _initial(), rounds=2, min_clients=1, policies={"a": policy})
    assert "BudgetExhausted: privacy budget of site a" in errors["a"]
    assert "DP-SGD training reached epsilon" in errors["a"]
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert sorted(rounds[0]["sites"]) == ["a", "b"] and sorted(rounds[1]["sites"]) == ["b"]
