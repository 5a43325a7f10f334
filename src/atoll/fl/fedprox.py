"""FedProx's client side (Li et al., MLSys 2020): a proximal term added to the local loss.

    loss = task_loss + proximal_term(net, global_params, mu)
    proximal_term = mu / 2 · Σ_w ‖w − w_global‖²   over the module's trainable parameters

It keeps each site's local model near the global model it started the round from, which limits
client drift on non-IID data. The server side is plain FedAvg (``workflow: fedprox`` in
app.yaml); ``mu`` reaches the site in ``model.meta["fedprox_mu"]`` (``mu_of(model)``).

    model = fl.receive()
    torch_bridge.load_params(net, model.params)
    anchor = snapshot(net)                      # the global weights, detached, on net's device
    ...
    loss = criterion(net(x), y) + proximal_term(net, anchor, mu_of(model))

``global_params`` may also be the numpy ``model.params`` (turned into CPU tensors at each call
without a copy); a snapshot avoids that work and any device transfer.

Plain numpy training loops use ``proximal_gradient`` (add it to the task's gradient) and
``proximal_value``; this module imports torch only for the torch functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.fl.model import Model

if TYPE_CHECKING:
    import torch


def mu_of(model: Model, default: float = 0.0) -> float:
    """The proximal weight the fedprox workflow sent with this model."""
    value = model.meta.get("fedprox_mu", default)
    return float(value)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the module's trainable parameters (take it right after loading)."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def proximal_term(
    module: torch.nn.Module, global_params: Mapping[str, Any], mu: float
) -> torch.Tensor:
    """mu/2 · Σ ‖w − w_global‖² over the trainable parameters named in ``global_params``."""
    import torch

    terms = []
    for name, param in module.named_parameters():
        if not param.requires_grad or name not in global_params:
            continue
        anchor = global_params[name]
        if isinstance(anchor, np.ndarray):
            anchor = torch.from_numpy(np.asarray(anchor))
        anchor = anchor.to(device=param.device, dtype=param.dtype)
        terms.append(torch.sum((param - anchor) ** 2))
    if not terms:
        raise ValueError(
            "proximal_term: no trainable parameter of the module is named in global_params; "
            "pass the received model.params or snapshot(module)"
        )
    return (mu / 2.0) * torch.stack(terms).sum()


def proximal_gradient(params: Mapping[str, np.ndarray], global_params: Mapping[str, np.ndarray],
                      mu: float) -> dict[str, np.ndarray]:
    """The proximal term's gradient, mu · (w − w_global), for each array of ``params``."""
    return {name: mu * (value - global_params[name]) for name, value in params.items()
            if name in global_params}


def proximal_value(params: Mapping[str, np.ndarray], global_params: Mapping[str, np.ndarray],
                   mu: float) -> float:
    """mu/2 · Σ ‖w − w_global‖² over the arrays both name (numpy)."""
    return float(mu / 2.0 * sum(np.sum((value - global_params[name]) ** 2)
                                for name, value in params.items() if name in global_params))
