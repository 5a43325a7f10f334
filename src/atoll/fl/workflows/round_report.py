"""What FedAvg (and FedProx, FedOpt) tell the job's watchers at the end of each round.

One ``round`` event through ``ctx.report``, for live progress (``--wait``, ``job status``) and
the job's log: each site's train and validation metrics, the global ones, the sites that failed
and why, the best round so far, with differential privacy the budget spent, and the round's
global model digest (the server's ``round.model`` provenance entry); plus one log line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from atoll.fl.workflows.api import Context
from atoll.fl.workflows.rounds import describe

if TYPE_CHECKING:
    from atoll.fl.app_config import FedAvgArgs

log = logging.getLogger("atoll.fl.workflows.fedavg")  # the workflow's own log, as before


def headline(key_metric: str, global_train: dict[str, float],
             validation: dict[str, Any] | None) -> dict[str, float]:
    """A flat view for one-line progress: global validation and each site's key metric."""
    if not validation:
        return {f"train_{k}": v for k, v in global_train.items()}
    flat = dict(validation["global"])
    flat.update({f"{s}/{key_metric}": m[key_metric]
                 for s, m in sorted(validation["sites"].items()) if key_metric in m})
    return flat


def report_round(
    ctx: Context,
    round_: int,
    args: FedAvgArgs,
    train: dict[str, tuple[dict[str, float], int]],
    global_train: dict[str, float],
    validation: dict[str, Any] | None,
    failed: dict[str, str],
    active: list[str],
    best: tuple[int, float] | None,
    privacy: dict[str, float] | None = None,
    model_digest: str | None = None,
) -> None:
    sites: dict[str, Any] = {
        site: {"train": metrics, "num_examples": n} for site, (metrics, n) in train.items()
    }
    if validation:
        for site, metrics in validation["sites"].items():
            sites.setdefault(site, {})["validate"] = metrics
    event: dict[str, Any] = {
        "event": "round",
        "round": round_,
        "total_rounds": args.num_rounds,
        "num_rounds": args.num_rounds,
        "metrics": headline(args.key_metric, global_train, validation),
        "sites": sites,
        "global": {"train": global_train, "validate": validation["global"] if validation else {}},
        "failed": failed,
        "active": active,
    }
    if best is not None:
        event["best"] = {"round": best[0], args.key_metric: best[1]}
    if privacy:
        event["privacy"] = privacy
    if model_digest:  # the server states it in the job's provenance record as it arrives
        event["model_digest"] = model_digest
    log.info(
        "round %d of %d: %d result(s)%s%s%s",
        round_,
        args.num_rounds,
        len(train),
        f", validation {validation['global']}" if validation else "",
        f", failed: {describe(failed)}" if failed else "",
        f", epsilon {privacy['epsilon']:.3f} at delta {privacy['delta']:g}" if privacy else "",
    )
    ctx.report(event)
