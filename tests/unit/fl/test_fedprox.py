"""FedProx: FedAvg on the server, mu sent to the sites, the proximal term on the client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atoll.fl.app_config import FedProxArgs
from atoll.fl.fedprox import mu_of, proximal_term, snapshot  # noqa: E402
from atoll.fl.model import Model
from atoll.fl.torch_bridge import to_params  # noqa: E402
from atoll.fl.workflows import run_fedprox

from .helpers import run_workflow


def test_sites_receive_mu_with_the_model(tmp_path):
    seen = []

    def site(topic, model):
        seen.append((topic, mu_of(model)))
        if topic == "validate":
            return Model(metrics={"accuracy": 1.0}, num_examples=1)
        return Model(params={"w": np.ones(2)}, num_examples=1)

    run_workflow(
        run_fedprox,
        FedProxArgs(num_rounds=2, mu=0.25, cross_site_eval="none"),
        {"a": site},
        tmp_path,
    )
    assert ("train", 0.25) in seen and all(mu == 0.25 for topic, mu in seen if topic == "train")


def test_proximal_term_value_and_gradient():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    anchor_np = {k: v.copy() for k, v in to_params(net).items()}
    anchor = snapshot(net)
    with torch.no_grad():
        net.weight.add_(0.5)
        net.bias.sub_(1.0)
    mu = 0.1
    expected = mu / 2 * (6 * 0.5**2 + 2 * 1.0**2)
    for global_params in (anchor, anchor_np):  # tensors or the received numpy params
        net.zero_grad()
        term = proximal_term(net, global_params, mu)
        assert term.item() == pytest.approx(expected)
        term.backward()
        # d/dw mu/2 (w - g)^2 = mu (w - g)
        assert torch.allclose(net.weight.grad, torch.full_like(net.weight, mu * 0.5))
        assert torch.allclose(net.bias.grad, torch.full_like(net.bias, -mu * 1.0))


def test_proximal_term_needs_matching_names():
    with pytest.raises(ValueError, match="no trainable parameter of the module is named"):
        proximal_term(torch.nn.Linear(2, 2), {"other": np.zeros(2)}, 0.1)
