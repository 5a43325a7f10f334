"""FedOpt: FedAvg's loop with an adaptive optimizer on the server (Reddi et al., ICLR 2021).

"Adaptive Federated Optimization", Algorithm 2. With x_t the global model sent in round t and
x̄_t the example-weighted mean of the sites' results, the averaged pseudo-gradient is

    Δ_t = x̄_t − x_t
    m_t = β1 · m_{t−1} + (1 − β1) · Δ_t
    v_t = v_{t−1} + Δ_t²                                         (FedAdagrad)
    v_t = β2 · v_{t−1} + (1 − β2) · Δ_t²                         (FedAdam)
    v_t = v_{t−1} − (1 − β2) · Δ_t² · sign(v_{t−1} − Δ_t²)       (FedYogi)
    x_{t+1} = x_t + η · m_t / (√v_t + τ)

with m_{−1} = 0 and v_{−1} = τ², element-wise, no bias correction (as in the paper). η is
``server_lr``, τ ``tau`` (the adaptivity: how far a coordinate with tiny updates may move).
Floating-point parameters only: integer ones (counters) take the plain mean. Without an
initial model the first round's mean becomes x_1 and the optimizer starts from there.
The state (m, v) is kept in each parameter's own float dtype, two extra copies of the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.fl import bfloat16
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.workflows.api import BuiltinArgs
from atoll.fl.workflows.fedavg import FedAvgFamily, FedAvgRun, Params, run_fedavg

if TYPE_CHECKING:  # the model loads on first use (api.BuiltinArgs)
    from atoll.fl.app_config import FedOptArgs


class ServerOptimizer:
    """The server step of FedAdam / FedYogi / FedAdagrad, applied once per round."""

    def __init__(
        self,
        optimizer: str = "adam",
        server_lr: float = 0.1,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
    ):
        if optimizer not in ("adam", "yogi", "adagrad"):
            raise ValueError(f"optimizer must be adam, yogi or adagrad, got {optimizer!r}")
        self.optimizer = optimizer
        self.lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.m: Params = {}
        self.v: Params = {}

    def state(self) -> dict[str, Any]:
        """The moments, for the job's checkpoint (server restarts)."""
        return {"m": self.m, "v": self.v}

    def restore(self, state: dict[str, Any]) -> None:
        self.m, self.v = dict(state["m"]), dict(state["v"])

    @classmethod
    def from_args(cls, args: FedOptArgs) -> ServerOptimizer:
        return cls(args.optimizer, args.server_lr, args.beta1, args.beta2, args.tau)

    def __call__(self, current: Params, mean: Params, round_: int = 0) -> Params:
        """The new global model from the one sent (``current``) and the sites' mean."""
        new: Params = {}
        for name, x in current.items():
            half = bfloat16.is_bf16(x.dtype)  # bf16: the optimizer runs in float32, rounded once
            if half:
                x = bfloat16.to_float32(x)
            elif x.dtype.kind != "f":
                new[name] = mean[name]
                continue
            delta = bfloat16.widen(mean[name], x.dtype)
            delta -= x
            m = self.m.get(name)
            if m is None:
                m = self.m[name] = np.zeros_like(x)
                self.v[name] = np.full_like(x, self.tau**2)
            v = self.v[name]
            m *= self.beta1
            m += (1 - self.beta1) * delta
            delta *= delta  # Δ², in place: delta is not needed any more
            if self.optimizer == "adam":
                v *= self.beta2
                v += (1 - self.beta2) * delta
            elif self.optimizer == "yogi":
                v -= (1 - self.beta2) * delta * np.sign(v - delta)
            else:  # adagrad
                v += delta
            step = np.sqrt(v, out=np.empty_like(v))  # out=: 0-d stays an array
            step += self.tau
            np.divide(m, step, out=step)
            step *= self.lr
            step += x
            new[name] = bfloat16.from_float32(step) if half else step
        return new


def run_fedopt(
    channel: ServerChannel, args: FedOptArgs, initial: Model | None, job_args: dict[str, Any]
) -> None:
    run_fedavg(
        channel,
        args,
        initial,
        job_args,
        workflow=f"fedopt-{args.optimizer}",
        server_update=ServerOptimizer.from_args(args),
    )


class FedOpt(FedAvgFamily):
    """``workflow: fedopt``: FedAvg's loop with the server optimizer as its server update."""

    Args = BuiltinArgs("FedOptArgs")

    def make_loop(self) -> FedAvgRun:
        args = self.args
        return FedAvgRun.on(
            self.ctx, f"fedopt-{args.optimizer}", server_update=ServerOptimizer.from_args(args))
