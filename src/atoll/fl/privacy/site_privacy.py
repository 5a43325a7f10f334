"""What a site worker does to what it receives and sends, as the job asks and the site demands.

``SitePrivacy`` sits between the channel and the training script (``ClientSession``):

- a task: its ``filters.task`` run on the model before the script sees it (an excluded variable
  is removed, so the script keeps its own value, and is never sent back either);
- a train reply: the update (the script's weights minus the global model received, or its diff)
  goes through ``filters.reply`` and client-mode DP's clip and noise, the site's accountant
  records the release (refusing it once the site's budget would be passed), and with secure
  aggregation it leaves encoded and masked;
- the secure aggregation steps (``secagg.*`` tasks) are answered here; the script never sees
  them.

The site's own policy (``local/privacy.yaml``, handed over by its parent in
``ATOLL_PRIVACY_POLICY``) is checked again here: a job asking for less is refused before the
script runs, whatever the parent did.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from atoll.fl.model import Model
from atoll.fl.privacy import filters
from atoll.fl.privacy.accounting import BudgetExhausted, Ledger
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.client import TOPICS, SecAggClient
from atoll.fl.privacy.secagg.identity import SiteIdentity
from atoll.spec.errors import AtollError
from atoll.spec.privacy import (
    POLICY_ENV,
    ExcludeFilter,
    PrivacySettings,
    SitePrivacyPolicy,
    parse_site_policy,
    policy_violations,
    reply_noise,
)

SECAGG_META = "secagg"  # the key of a train task's model.meta that carries the shares


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

    def _ledger(self, policy: SitePrivacyPolicy | None) -> Ledger | None:
        _, noise = reply_noise(self.reply_filters)
        if noise is None:
            return None
        budget = policy.budget if policy is not None else None
        delta = budget.delta if budget else (self.settings.dp.delta if self.settings.dp else 1e-5)
        return Ledger(noise, delta, budget.epsilon if budget else None,
                      owner=f"site {self.site} (local/privacy.yaml budget.epsilon)")

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
        delta = self._budget.delta if self._budget else dp_sgd.delta
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
        return Model(meta=self.secagg.answer(topic, round_, model.meta))

    def on_task(self, topic: str, round_: int | None, model: Model) -> Model:
        routed = model.meta.pop(SECAGG_META, None)
        if topic == "train" and self.secagg is not None:
            if round_ is None or not isinstance(routed, dict):
                raise PrivacyRefused("a train task without secure aggregation data, while this "
                                     "site's app.yaml turns secure aggregation on")
            self.secagg.take_shares(round_, routed)
            self._site_count = len(routed.get("sites", []))
        if topic == "train" and (self.reply_filters or self.secagg is not None):
            # kept aside: the script may train in the received arrays themselves
            self._received = _copy_into(self._spare_received, model.params)
            self._spare_received = {}
        if self.task_filters:
            model.params = filters.apply(self.task_filters, model.params, self.rng,
                                         drop_excluded=True)
        return model

    def on_reply(self, topic: str, model: Model) -> Model:
        """What leaves the site for ``model``, the script's answer to a ``topic`` task."""
        if topic != "train":
            return model
        metrics = {**model.metrics, **self._dp_sgd_spent()}
        if not (self.reply_filters or self.secagg):
            return Model(params=model.params, params_type=model.params_type,
                         num_examples=model.num_examples, metrics=metrics, round=model.round,
                         meta=model.meta)
        update = self._update(model)
        update = filters.apply(self.reply_filters, update, self.rng)
        if self.ledger is not None:
            metrics["privacy_epsilon"] = self.ledger.record()  # BudgetExhausted: nothing sent
        if self.secagg is None:
            return Model(params=update, params_type="diff", num_examples=model.num_examples,
                         metrics=metrics, round=model.round, meta=model.meta)
        if model.round is None:
            raise PrivacyRefused("a train reply without a round cannot be masked")
        encoded = masking.encode(update, model.num_examples, max(self._site_count, 1),
                                 reuse=self._spare_words)
        masked = self.secagg.mask(model.round, encoded)
        self._spare_words = masked  # sent before the next round: free again then
        # the example count travels masked (inside the sum), not in the clear
        return Model(params=masked, params_type="diff", num_examples=0, metrics=metrics,
                     round=model.round, meta=model.meta)

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
            # the difference is written over the received copy, which is ours alone
            update = {name: (np.subtract(model.params[name], kept, out=kept, casting="unsafe")
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
