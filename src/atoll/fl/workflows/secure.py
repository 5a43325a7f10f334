"""Secure aggregation and server-side DP on the workflow API: the round that
``Context.secure_round`` and the FedAvg family run, and what it returns. The server folds the
sites' masked updates into one sum and unmasks the sum alone (atoll.fl.privacy); nothing here
ever holds one site's update."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from atoll.fl.aggregation import weighted_metrics
from atoll.fl.model import Model
from atoll.fl.workflows.rounds import Outcome, WorkflowError

if TYPE_CHECKING:
    from atoll.fl.channels import ServerChannel
    from atoll.fl.privacy.server_privacy import PrivateRound, ServerPrivacy

Params = dict[str, np.ndarray]


class RoundContext(Protocol):
    """What a private round reads of the job's context (fl/workflows/api.py's ``Context``
    is one): declared here so that this module never imports the one that imports it."""

    sites: list[str]
    active: list[str]
    min_clients: int

    @property
    def channel(self) -> ServerChannel: ...

    def note_dropouts(self, outcome: Outcome) -> None: ...


@dataclass
class SecureResult:
    """One securely aggregated train round (``Context.secure_round``): the server learned the
    sum of the survivors' updates and their total example count, never one site's update."""

    round: int
    aggregate: Params  # the model sent plus the example-weighted mean of the sites' updates
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> train metrics
    outcome: Outcome = field(default_factory=Outcome)
    total_weight: float = 0.0  # the survivors' example counts, learned only as their sum
    privacy: dict[str, float] = field(default_factory=dict)  # epsilon, delta after this round

    @property
    def ok(self) -> list[str]:
        """Sites whose masked update is in the sum."""
        return list(self.outcome.ok)

    @property
    def failed(self) -> dict[str, str]:
        """Sites that dropped out, sent something unusable or were late, with why."""
        return self.outcome.failed

    def mean_metrics(self) -> dict[str, float]:
        """Each metric's mean over the sites that reported it (unweighted: a site's example
        count travels masked, so the server never learns it)."""
        return weighted_metrics((m, 0) for m in self.metrics.values())


def server_privacy(job_args: dict[str, Any]) -> ServerPrivacy | None:
    """The job's ``ServerPrivacy`` from app.yaml's privacy section (its budget and buffers span
    rounds: make it once per job); None without a privacy section."""
    settings = job_args.get("privacy")
    if settings is None:
        return None
    from atoll.fl.privacy.server_privacy import ServerPrivacy

    return ServerPrivacy(settings)


def private_round(
    ctx: RoundContext,
    privacy: ServerPrivacy,
    model: Model,
    *,
    round: int,
    total_rounds: int | None = None,
    targets: Sequence[str] | None = None,
    timeout: float | None = None,
    min_replies: int | None = None,
    in_place: bool = False,
) -> tuple[PrivateRound, Params]:
    """A train round the privacy settings aggregate (secure aggregation, or server-side DP):
    the round's replies and the new params (``in_place``: written over ``model.params``'
    arrays)."""
    from atoll.fl.privacy.server_privacy import apply_update

    if not isinstance(round, int) or isinstance(round, bool):
        raise WorkflowError(f"a private round needs an int round, not {round!r}")
    if not model.params:
        raise WorkflowError(
            "secure aggregation and server-side DP need the sites to send updates against "
            "a global model: send a model with params (set server.initial_model in app.yaml)")
    chosen = list(ctx.active if targets is None else targets)
    unknown = [t for t in chosen if t not in ctx.sites]
    if unknown:
        raise WorkflowError(f"round {round}: unknown site(s) {unknown}; sites: {ctx.sites}")
    wanted = ctx.min_clients if min_replies is None else min_replies
    meta = dict(model.meta)
    headers: dict[str, Any] = {"round": round}
    if total_rounds is not None:
        meta["total_rounds"] = headers["total_rounds"] = total_rounds
    outgoing = Model(params=model.params, num_examples=model.num_examples,
                     params_type=model.params_type, metrics=model.metrics, round=round,
                     meta=meta)
    # Not ctx.channel, which first waits for the last round's checkpoint: the key and share
    # steps go out while it is written (a 100 MiB model's: 0.1-0.2 s), train_round waits
    # before the first reply
    private = privacy.train_round(ctx._channel, chosen, outgoing, headers, timeout, wanted,
                                  model.params, settle=ctx.settle_checkpoint)
    del outgoing
    ctx.note_dropouts(private.outcome)
    update = private.mean_update(wanted, f"round {round}")
    aggregate = apply_update(model.params, update, in_place=in_place)
    if privacy.secure:
        privacy.recycle(update, aggregate)  # never handed out: its memory is the next sum's
    return private, aggregate

