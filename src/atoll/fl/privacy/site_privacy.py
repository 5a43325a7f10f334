"""What a site worker does to what it receives and sends, as the job asks and the site demands.

``SitePrivacy`` sits between the channel and the training script (``ClientSession``):

- a task: its ``filters.task`` run on the model before the script sees it (an excluded variable
  is removed, so the script keeps its own value, and is never sent back either);
- a reply, whatever the task was called: sorted by what it carries (fl/privacy/egress.py). An
  update (any params) goes through ``filters.reply`` and client-mode DP's clip and noise; each
  release is accounted first by the job's accountant and then in the study's ledger at the site
  parent (``spend``, which refuses once the study's budget would be passed; nothing is sent
  then); with secure aggregation it leaves encoded and masked, once per round's shares. Metrics
  and statistics answers leave without the example count when secure aggregation is on; what
  cannot be classified is refused where the site's policy requires privacy;
- the secure aggregation steps (``secagg.*`` tasks) are answered here; the script never sees
  them.

The site's own policy (``local/privacy.yaml``, handed over by its parent in
``ATOLL_PRIVACY_POLICY``) is checked again here: a job asking for less is refused before the
script runs, whatever the parent did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from atoll.fl import bfloat16
from atoll.fl.model import Model
from atoll.fl.privacy import egress, filters
from atoll.fl.privacy.accounting import BudgetExhausted, Ledger
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.client import ADVERTISE, TOPICS, SecAggClient
from atoll.fl.privacy.secagg.identity import SiteIdentity
from atoll.spec.errors import AtollError
from atoll.spec.privacy import (
    ExcludeFilter,
    PrivacySettings,
    SitePrivacyPolicy,
    parse_site_policy,
    policy_violations,
    quantize_filter,
    reply_noise,
)
from atoll.spec.worker_env import PRIVACY_POLICY as POLICY_ENV

SECAGG_META = "secagg"  # the key of a train task's model.meta that carries the shares
DP_KIND = "dp"  # the ledger's kind for client-level DP and DP-SGD (site/privacy_ledger.py)
Spend = Callable[[str, float, float], float]  # (kind, job epsilon, delta) -> study's total


class PrivacyRefused(AtollError, RuntimeError):
    """This site will not run the job's privacy settings; the message names the rule."""


def policy_from_env() -> SitePrivacyPolicy | None:
    raw = os.environ.get(POLICY_ENV)
    if not raw:
        return None
    return parse_site_policy(json.loads(raw), f"{POLICY_ENV} (the site's local/privacy.yaml)")


class SitePrivacy:
    def __init__(self, settings: PrivacySettings, policy: SitePrivacyPolicy | None, site: str,
                 job_id: str, rng: np.random.Generator | None = None,
                 identity: SiteIdentity | None = None):
        violations = policy_violations(settings, policy)
        if violations:
            raise PrivacyRefused(f"{site} refuses the job's privacy settings (local/privacy.yaml): "
                                 + "; ".join(map(str, violations)))
        self.settings = settings
        self.site = site
        self.rng = rng if rng is not None else np.random.default_rng()
        self.task_filters = list(settings.filters.task)
        self.reply_filters = settings.reply_pipeline()
        self.task_excluded = [p for spec in self.task_filters if isinstance(spec, ExcludeFilter)
                              for p in spec.patterns]
        if self.task_excluded:  # what the site kept back from the task never leaves it either
            self.reply_filters.insert(0, ExcludeFilter(type="exclude",
                                                       patterns=self.task_excluded))
        # app.yaml's {type: quantize}, last in the reply pipeline: the update leaves 8-bit
        # (serde encodes it; a reply without float params of its size is unchanged by it)
        self.reply_quantization = quantize_filter(self.reply_filters)
        self.ledger = self._ledger(policy)
        self.secagg = _secagg_client(settings, policy, site, job_id, identity)
        self._received: dict[str, np.ndarray] = {}  # the global model this round's update is from
        # Buffers kept from round to round: fresh memory costs more than the work done in it
        # (1.7 s per GiB on the machines measured, docs/federated-learning.md).
        self._spare_received: dict[str, np.ndarray] = {}
        self._spare_words: dict[str, np.ndarray] = {}
        self._site_count = 0
        self._budget = policy.budget if policy is not None else None
        self._dp_sgd_engine: Any = None  # Opacus's PrivacyEngine, made by dp_sgd.make_private
        # Whether the site requires privacy: then what cannot be classified is not sent.
        self.required = policy is not None and (
            bool(policy.require.exclude) or policy.require.max_clip_norm is not None
            or policy.require.min_noise_multiplier is not None
            or policy.require.secure_aggregation or policy.budget is not None)
        # The study's ledger at the site parent (ClientSession.spend_budget); None: none kept
        self.spend: Spend | None = None
        self._mask_round: int | None = None  # the round whose shares the current task carried
        self._masked: set[int] = set()  # rounds this site has sent a masked update for

    def _ledger(self, policy: SitePrivacyPolicy | None) -> Ledger | None:
        _, noise = reply_noise(self.reply_filters)
        if noise is None:
            return None
        budget = policy.budget if policy is not None else None
        delta = budget.delta if budget else (self.settings.dp.delta if self.settings.dp else 1e-5)
        return Ledger(noise, delta, budget.epsilon if budget else None,
                      owner=f"site {self.site} (local/privacy.yaml budget.epsilon)")

    @property
    def delta(self) -> float:
        """The delta every release is measured at: the site's own when it set a budget."""
        if self._budget is not None:
            return self._budget.delta
        if self.settings.dp is not None:
            return self.settings.dp.delta
        return self.settings.dp_sgd.delta if self.settings.dp_sgd is not None else 1e-5

    @property
    def active(self) -> bool:
        return bool(self.task_filters or self.reply_filters or self.secagg
                    or self.settings.dp_sgd)

    def dp_sgd_engine(self) -> Any:
        """One Opacus PrivacyEngine per worker: its accountant spans every round's training."""
        if self._dp_sgd_engine is None:
            from opacus import PrivacyEngine

            self._dp_sgd_engine = PrivacyEngine(accountant="rdp")
        return self._dp_sgd_engine

    def _dp_sgd_spent(self) -> dict[str, float]:
        """Example-level epsilon of the training so far; BudgetExhausted past the site's."""
        dp_sgd = self.settings.dp_sgd
        if dp_sgd is None or self._dp_sgd_engine is None:
            return {}
        delta = self.delta
        spent = float(self._dp_sgd_engine.accountant.get_epsilon(delta=delta))
        if self._budget is not None and spent > self._budget.epsilon:
            raise BudgetExhausted(
                f"privacy budget of site {self.site} (local/privacy.yaml budget.epsilon) "
                f"exhausted: DP-SGD training reached epsilon {spent:.3f} > "
                f"{self._budget.epsilon} (delta {delta}); this round's update is not sent")
        return {"dp_sgd_epsilon": spent}

    @staticmethod
    def handles(topic: str) -> bool:
        return topic in TOPICS

    def answer(self, topic: str, round_: int, model: Model) -> Model:
        """A secure aggregation step, answered without the script."""
        if self.secagg is None:
            raise PrivacyRefused(f"the server asked for {topic}, but this site's app.yaml does not "
                                 "turn on privacy.secure_aggregation")
        answer = self.secagg.answer(topic, round_, model.meta)
        if topic == ADVERTISE:
            # Fresh keys for the round (the server ran it again from its start after a restart:
            # docs/federation.md): an update masked with them shares no mask with one sent
            # before, and the client never answers the unmask step of a round twice.
            self._masked.discard(round_)
        return Model(meta=answer)

    def on_task(self, topic: str, round_: int | None, model: Model) -> Model:
        routed = model.meta.pop(SECAGG_META, None)
        self._mask_round = None
        if self.secagg is not None and isinstance(routed, dict):  # shares, whatever the name
            if round_ is None:
                raise PrivacyRefused(f"a {topic!r} task carries secure aggregation data without "
                                     "a round")
            self.secagg.take_shares(round_, routed)
            self._site_count = len(routed.get("sites", []))
            self._mask_round = round_
        elif topic == "train" and self.secagg is not None:
            raise PrivacyRefused("a train task without secure aggregation data, while this "
                                 "site's app.yaml turns secure aggregation on")
        # The model an update is measured from: whatever the task is called (a validate reply
        # never carries params: ClientSession.send drops them, so no copy is kept for one).
        if topic != "validate" and (self.reply_filters or self.secagg is not None):
            # kept aside: the script may train in the received arrays themselves
            self._received = _copy_into(self._spare_received, model.params)
            self._spare_received = {}
        else:
            self._received = {}
        if self.task_filters:
            model.params = filters.apply(self.task_filters, model.params, self.rng,
                                         drop_excluded=True)
        return model

    def on_reply(self, topic: str, model: Model) -> Model:
        """What leaves the site for ``model``, the script's answer to a ``topic`` task: decided
        by what it carries (fl/privacy/egress.py), never by the task's name."""
        kind, why = egress.classify(model)
        if kind == egress.UNKNOWN:
            if self.required:
                raise PrivacyRefused(
                    f"{self.site} does not send its reply to task {topic!r}: its privacy policy "
                    f"(local/privacy.yaml) cannot classify it ({why}); a reply is an update "
                    "(params), metrics (named numbers) or a statistics answer")
            kind = egress.UPDATE if model.params else egress.METRICS
        if kind != egress.UPDATE:
            # the example count is a site's private number under secure aggregation
            return Model(metrics=model.metrics, round=model.round, meta=model.meta,
                         num_examples=0 if self.secagg is not None else model.num_examples)
        return self._release_update(model)

    def _release_update(self, model: Model) -> Model:
        metrics = dict(model.metrics)
        dp_sgd = self._dp_sgd_spent()  # BudgetExhausted past the job's own view of the budget
        metrics.update(dp_sgd)
        if not (self.reply_filters or self.secagg):
            if dp_sgd:
                self._spend(dp_sgd["dp_sgd_epsilon"])
            return Model(params=model.params, params_type=model.params_type,
                         num_examples=model.num_examples, metrics=metrics, round=model.round,
                         meta=model.meta)
        mask_round = self._mask_round
        if self.secagg is not None:
            if mask_round is None:
                raise PrivacyRefused("this reply carries params, and its task carried no secure "
                                     "aggregation shares: with secure aggregation on, an update "
                                     "leaves this site only masked")
            if mask_round in self._masked:
                raise PrivacyRefused(f"round {mask_round} has been masked and sent already: a "
                                     "second update masked with the same shares would reveal "
                                     "the difference of the two")
        update = self._update(model)
        update = filters.apply(self.reply_filters, update, self.rng)
        if self.ledger is not None:
            value = self.ledger.check_next()  # BudgetExhausted: the job's own accountant
            self._spend(value + dp_sgd.get("dp_sgd_epsilon", 0.0))  # the study's, at the parent
            self.ledger.steps += 1
            self.ledger.spent.append(value)
            metrics["privacy_epsilon"] = value
        elif dp_sgd:
            self._spend(dp_sgd["dp_sgd_epsilon"])
        if self.secagg is None:
            return Model(params=update, params_type="diff", num_examples=model.num_examples,
                         metrics=metrics, round=model.round, meta=model.meta)
        assert mask_round is not None
        encoded = masking.encode(update, model.num_examples, max(self._site_count, 1),
                                 masking.Ring.of(self.settings.secure_aggregation),
                                 reuse=self._spare_words)
        masked = self.secagg.mask(mask_round, encoded)
        self._masked.add(mask_round)
        self._mask_round = None
        self._spare_words = masked  # sent before the next round: free again then
        # the example count travels masked (inside the sum), not in the clear
        return Model(params=masked, params_type="diff", num_examples=0, metrics=metrics,
                     round=mask_round, meta=model.meta)

    def _spend(self, job_epsilon: float) -> None:
        """The study's ledger at the site parent records this release, or refuses it
        (BudgetExhausted, naming the ledger): then nothing is sent."""
        if self.spend is None:
            raise BudgetExhausted(f"site {self.site}: no privacy ledger to account this release "
                                  "in (the worker's channel keeps none); nothing is sent")
        self.spend(DP_KIND, job_epsilon, self.delta)

    def _update(self, model: Model) -> dict[str, np.ndarray]:
        received, self._received = self._received, {}
        if model.params_type == "diff":
            update = dict(model.params)
        else:
            if not received:
                raise PrivacyRefused(
                    "privacy filters and secure aggregation work on updates (the trained "
                    "weights minus the global model), and the task carried no global model: "
                    "give the server app an initial_model in app.yaml")
            # the difference is written over the received copy, which is ours alone; a bf16
            # one is taken in float32 (filters, clipping and noise work in float32)
            update = {name: (_difference(model.params[name], kept)
                             if name in model.params else np.zeros_like(kept))
                      for name, kept in received.items()}
            self._spare_received = received  # its memory, for the next round's copy
        extra = sorted(set(model.params) - set(received)) if received else []
        if extra:
            raise PrivacyRefused(f"the reply has variables the global model has not: {extra[:5]}")
        return update


def _secagg_client(settings: PrivacySettings, policy: SitePrivacyPolicy | None, site: str,
                   job_id: str, identity: SiteIdentity | None) -> SecAggClient | None:
    if settings.secure_aggregation is None:
        return None
    if identity is None:
        raise PrivacyRefused("secure aggregation needs this worker's site-certified key, which "
                             "its site parent hands over at launch; none came")
    wanted = policy.secure_aggregation if policy is not None else None
    return SecAggClient(site, job_id, identity, wanted.min_participants if wanted else None)


def _difference(trained: np.ndarray, kept: np.ndarray) -> np.ndarray:
    if bfloat16.is_bf16(kept.dtype) or bfloat16.is_bf16(trained.dtype):
        wide = bfloat16.widen(trained, np.dtype(np.float32))
        return np.subtract(wide, bfloat16.widen(kept, np.dtype(np.float32)), out=wide)
    return np.subtract(trained, kept, out=kept, casting="unsafe")


def _copy_into(spare: dict[str, np.ndarray], params: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """A copy of ``params``, in ``spare``'s arrays where name, shape and dtype match."""
    out = {}
    for name, array in params.items():
        target = spare.get(name)
        if target is None or target.shape != array.shape or target.dtype != array.dtype:
            target = np.empty_like(array)
        np.copyto(target, array)
        out[name] = target
    return out
