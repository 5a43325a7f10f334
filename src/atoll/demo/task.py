"""The demo's model and training loop (PyTorch, CPU), shared by its site script and baselines.

A softmax regression (one linear layer, 64 pixels -> 10 digits) started from zeros: no random
initialization, so every site and every baseline starts from the same point. Local training is
Adam on shuffled mini-batches with a private ``torch.Generator``, deterministic even when
simulated sites train in threads of one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

NUM_FEATURES, NUM_CLASSES = 64, 10


@dataclass(frozen=True)
class TrainSettings:
    """Hyperparameters of local training; app.yaml's ``site.config`` overrides them."""

    epochs: int = 2  # per round
    lr: float = 0.02
    batch_size: int = 16
    seed: int = 0
    dp_sgd: bool = False  # train with DP-SGD (Opacus), as app.yaml's privacy.dp_sgd sets it

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TrainSettings:
        known = {k: config[k] for k in ("epochs", "lr", "batch_size", "seed", "dp_sgd")
                 if k in config}
        return cls(**known)


def make_model() -> torch.nn.Module:
    net = torch.nn.Linear(NUM_FEATURES, NUM_CLASSES)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
    return net


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(
        y.astype(np.int64)
    )


def train(
    net: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    epochs: int,
    settings: TrainSettings,
    seed: int,
) -> float:
    """Train in place for ``epochs``; returns the mean loss of the last epoch."""
    xs, ys = _tensors(x, y)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=settings.lr)
    net.train()
    last = 0.0
    for _ in range(epochs):
        total = 0.0
        for batch in torch.randperm(len(xs), generator=generator).split(settings.batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xs[batch]), ys[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        last = total / len(xs)
    return last


def evaluate(net: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    xs, ys = _tensors(x, y)
    net.eval()
    with torch.no_grad():
        logits = net(xs)
        loss = torch.nn.functional.cross_entropy(logits, ys).item()
        accuracy = (logits.argmax(1) == ys).double().mean().item()
    return {"accuracy": accuracy, "loss": loss}


def private_trainer(net: torch.nn.Module, x: np.ndarray, y: np.ndarray,
                    settings: TrainSettings) -> Callable[[int], float]:
    """DP-SGD for the demo's site script: the same model and optimizer, Poisson-sampled
    batches and per-example clipping and noise from Opacus, with the noise multiplier and
    gradient bound of app.yaml's ``privacy.dp_sgd`` (atoll.fl.privacy.dp_sgd). Made once per
    site: the optimizer and the accountant span every round. Returns train(epochs) -> loss."""
    from atoll.fl.privacy.dp_sgd import make_private

    xs, ys = _tensors(x, y)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(xs, ys), batch_size=settings.batch_size,
        generator=torch.Generator().manual_seed(settings.seed))
    optimizer = torch.optim.Adam(net.parameters(), lr=settings.lr)
    private_net, optimizer, loader = make_private(net, optimizer, loader)

    def train_epochs(epochs: int) -> float:
        private_net.train()
        total, seen = 0.0, 0
        for _ in range(epochs):
            total, seen = 0.0, 0
            for xb, yb in loader:
                if len(yb) == 0:  # Poisson sampling can draw an empty batch
                    continue
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(private_net(xb), yb)
                loss.backward()
                optimizer.step()
                total, seen = total + loss.item() * len(yb), seen + len(yb)
        return total / max(seen, 1)

    return train_epochs
