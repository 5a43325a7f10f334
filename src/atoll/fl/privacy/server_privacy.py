"""The server's side of privacy in the FedAvg family: the budget, central DP, secure rounds.

``ServerPrivacy`` is the one object the workflow holds (``FedAvgRun.privacy``); its seams are
narrow so they can move to another workflow API unchanged:

- ``stop_reason()`` before a round: the job's own budget (``privacy.dp.max_epsilon``);
- ``record_round()`` after it: epsilon at delta for the metrics and results;
- ``CentralDP`` (``dp.mode: server``): each site's update clipped on arrival, the unweighted
  sum noised once, so the server (trusted) adds the noise;
- ``train_round()``: one training round in which the server learns only the sum (secure
  aggregation) or clips each update and noises the sum (server-side DP).

Client-level epsilon: in client mode each site's release is a Gaussian mechanism of its own
(noise multiplier z on its clipped update), so the epsilon reported is what each site spends
per round, whatever the others do; in server mode it is the epsilon of the noised sum
(add/remove one site's data), trusting the server. Sampling rate 1: every site, every round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.fl import bfloat16
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.privacy import filters
from atoll.fl.privacy.accounting import BudgetExhausted, Ledger
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.server import SecureRound
from atoll.fl.privacy.site_privacy import SECAGG_META
from atoll.fl.serde import ModelStream, encode
from atoll.fl.workflows.rounds import Outcome, WorkflowError, gather, require
from atoll.spec.privacy import PrivacySettings, reply_noise

log = logging.getLogger(__name__)

Params = dict[str, np.ndarray]


class ServerPrivacy:
    def __init__(self, settings: PrivacySettings):
        self.settings = settings
        dp = settings.dp
        noise = (dp.noise_multiplier if dp is not None and dp.mode == "server"
                 else reply_noise(settings.reply_pipeline())[1])
        delta = dp.delta if dp is not None else 1e-5
        self._spare: dict[str, np.ndarray] = {}  # last round's sum memory, for the next sum
        self.task_quantization = settings.task_quantization  # the model sent 8-bit
        self.ledger = (Ledger(noise, delta, dp.max_epsilon if dp else None,
                              owner="the job (app.yaml privacy.dp.max_epsilon)")
                       if noise is not None else None)

    @property
    def secure(self) -> bool:
        return self.settings.secure_aggregation is not None

    @property
    def central(self) -> bool:
        return self.settings.dp is not None and self.settings.dp.mode == "server"

    def stop_reason(self) -> str | None:
        """Why no further round may run, or None."""
        if self.ledger is None:
            return None
        try:
            self.ledger.check_next()
        except BudgetExhausted as exc:
            return str(exc)
        return None

    def record_round(self) -> dict[str, float]:
        if self.ledger is None:
            return {}
        return {"epsilon": self.ledger.record(), "delta": self.ledger.delta}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"secure_aggregation": self.secure,
                               "dp": self.settings.dp.mode if self.settings.dp else None}
        if self.ledger is not None:
            out.update(epsilon=self.ledger.current, delta=self.ledger.delta,
                       noise_multiplier=self.ledger.noise_multiplier, rounds=self.ledger.steps,
                       epsilon_per_round=self.ledger.spent)
        return out

    def train_round(self, channel: ServerChannel, active: Sequence[str], outgoing: Model,
                    headers: dict[str, Any], timeout: float | None, min_clients: int,
                    global_params: Params, settle: Callable[[], None] = lambda: None
                    ) -> PrivateRound:
        """Send the train task and take the replies, securely or with server-side DP; the
        caller reads ``mean_update()`` once ``outcome`` is accounted for. ``settle``: waits
        for the last round's checkpoint, still being written (Context.settle_checkpoint);
        called once the train task is out, before the first reply is taken: the key and share
        steps and the task only read the global model."""
        if not self.secure:
            central = CentralDP(global_params, *self._central_settings())
            task_id = channel.send(list(active), "train", headers,
                                   encode(outgoing, quantize=self.task_quantization))
            settle()
            result = PrivateRound(central)
            result.outcome = gather(channel, task_id, active, timeout, result.take_plain,
                                    min_clients)
            return result
        assert self.settings.secure_aggregation is not None
        secure = SecureRound(channel, headers["round"], headers, timeout, min_clients,
                             self.settings.secure_aggregation.threshold,
                             masking.Ring.of(self.settings.secure_aggregation), spare=self._spare)
        self._spare = {}
        sites = secure.setup(list(active))
        outgoing.meta = {**outgoing.meta, SECAGG_META: secure.train_meta()}
        task_id = channel.send(sites, "train", headers,
                               encode(outgoing, quantize=self.task_quantization))
        outgoing.meta.pop(SECAGG_META)
        settle()
        result = PrivateRound(secure)
        result.outcome = gather(channel, task_id, sites, timeout, result.take_masked, min_clients)
        for site, reason in secure.failed.items():  # who failed during the setup steps
            result.outcome.dropped.setdefault(site, reason)
        return result

    def recycle(self, update: Params, new_global: Params) -> None:
        """Keep the memory of a secure round's mean update for the next round's sum, unless
        it became the new global model itself."""
        self._spare = {name: a.reshape(-1).view(f"u{a.dtype.itemsize}")
                       for name, a in update.items()
                       if a.dtype in (np.float32, np.float64) and a.flags.c_contiguous
                       and new_global.get(name) is not a}

    def _central_settings(self) -> tuple[float, float]:
        assert self.settings.dp is not None
        return self.settings.dp.clip_norm, self.settings.dp.noise_multiplier


@dataclass
class PrivateRound:
    """One round's replies, folded securely (``SecureRound``) or with server-side DP."""

    aggregator: SecureRound | CentralDP
    outcome: Outcome = field(default_factory=Outcome)
    train: dict[str, tuple[dict[str, float], int]] = field(default_factory=dict)
    total_weight: float = 0.0

    def take_masked(self, site: str, stream: ModelStream) -> None:
        assert isinstance(self.aggregator, SecureRound)
        model = self.aggregator.add_masked(site, stream)
        self.train[site] = (model.metrics, model.num_examples)

    def take_plain(self, site: str, stream: ModelStream) -> None:
        assert isinstance(self.aggregator, CentralDP)
        model = stream.read()
        self.aggregator.add(model)
        self.train[site] = (model.metrics, model.num_examples)
        self.total_weight += model.num_examples

    def mean_update(self, min_clients: int, what: str) -> Params:
        require(self.outcome, min_clients, what)
        if isinstance(self.aggregator, CentralDP):
            return self.aggregator.mean_update()
        total, weight = self.aggregator.unmask(mean=True)  # the sum's memory becomes the mean
        if weight <= 0:
            raise WorkflowError(f"{what}: the sites' example counts sum to 0")
        self.total_weight = weight
        return total


class CentralDP:
    """DP-FedAvg with the noise added by the server: the unweighted mean of clipped updates,
    plus N(0, (z C)^2) on their sum (McMahan et al. 2018, fixed weights)."""

    def __init__(self, global_params: Params, clip_norm: float, noise_multiplier: float,
                 rng: np.random.Generator | None = None):
        self.global_params = global_params
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.rng = rng if rng is not None else np.random.default_rng()
        self.sum: Params = {}
        self.count = 0

    def add(self, model: Model) -> None:
        if model.params_type == "diff":
            update = model.params
        else:
            wide = np.dtype(np.float64)
            update = {n: bfloat16.widen(model.params[n], wide) - bfloat16.widen(g, wide)
                      for n, g in self.global_params.items()}
        clipped = filters.clip({n: bfloat16.widen(a, np.dtype(np.float64))
                                for n, a in update.items()},
                               self.clip_norm)
        for name, array in clipped.items():
            self.sum[name] = self.sum[name] + array if name in self.sum else array.copy()
        self.count += 1

    def mean_update(self) -> Params:
        std = self.noise_multiplier * self.clip_norm
        return {n: (s + self.rng.normal(0.0, std, s.shape)) / self.count
                for n, s in self.sum.items()}


def apply_update(global_params: Params, mean_update: Params, in_place: bool = False) -> Params:
    """The new global model: the old one plus the mean update, in the global model's dtypes.
    ``in_place``: written over the old global model's arrays (nothing else needs them: the
    round's task was sent), so the round needs no fresh memory for it."""
    out = {}
    for name, g in global_params.items():
        if name not in mean_update:
            out[name] = g
        elif in_place and g.flags.writeable and g.dtype.kind == "f":
            np.add(g, mean_update[name], out=g, casting="unsafe")
            out[name] = g
        else:
            update = mean_update[name]
            update += bfloat16.to_float32(g) if bfloat16.is_bf16(g.dtype) else g  # its memory
            if g.dtype.kind in "iub":  # counters (num_batches_tracked): rounded, as FedAvg does
                np.rint(update, out=update)
            out[name] = bfloat16.narrow(update, g.dtype)  # bf16: rounded once
    return out
