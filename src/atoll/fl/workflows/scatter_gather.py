"""The smallest workflow: send one payload to every site, gather what they send back.

Each round the server sends a model holding one uint8 array ``payload`` of ``payload_bytes``
bytes (deterministic content, so a site or a test can check it) with topic ``topic``; each site
answers with any model. The result, ``scatter_gather.json``, lists per round and site the reply's
parameter names, sizes and SHA-256 digests, and whether the reply echoed the payload. Meant to
prove the federation's path (and measure it), not to train anything.

It resumes after a server restart (api.py, checkpoints): after each round it commits the payload
and the rounds recorded so far, and a resumed run goes on with the next round.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.workflows.api import BuiltinArgs, Context, Workflow
from atoll.fl.workflows.rounds import require

if TYPE_CHECKING:  # the model loads on first use (api.BuiltinArgs)
    from atoll.fl.app_config import ScatterGatherArgs


def make_payload(size: int) -> np.ndarray:
    """Deterministic bytes, different at every position modulo 251 (a prime: no short period)."""
    return (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()


def run_scatter_gather(
    channel: ServerChannel, args: ScatterGatherArgs, initial: Model | None, job_args: dict[str, Any]
) -> None:
    ScatterGather(Context(channel, args, initial, job_args)).run()


class ScatterGather(Workflow):
    """``workflow: scatter_gather``."""

    Args = BuiltinArgs("ScatterGatherArgs")

    params: dict[str, np.ndarray]
    rounds: list[dict[str, Any]]

    # What survives a server restart: the payload (an initial model made again could differ)
    # and what scatter_gather.json holds so far.
    def state(self) -> dict[str, Any]:
        return {"params": self.params, "rounds": self.rounds}

    def restore(self, state: dict[str, Any]) -> None:
        self.params, self.rounds = dict(state["params"]), list(state["rounds"])

    def run(self) -> None:
        ctx, args = self.ctx, self.args
        if not hasattr(self, "params"):  # a fresh start, not restored from a checkpoint
            initial = ctx.initial_model
            self.params = (dict(initial.params) if initial
                           else {"payload": make_payload(args.payload_bytes)})
            self.rounds = []
        params, rounds = self.params, self.rounds
        sent_digests = {name: digest(a) for name, a in params.items()}
        # 1-based, as users see rounds; after a server restart, on from the checkpoint
        for round_ in range(ctx.start_round, args.num_rounds + 1):
            started = time.monotonic()
            model = Model(params=params, round=round_, meta={"total_rounds": args.num_rounds})
            sent = ctx.send(args.topic, model, targets=ctx.sites, round=round_,
                            total_rounds=args.num_rounds)
            gathered = ctx.gather(sent, timeout=args.round_timeout, require_min=False)
            replies = {s: _describe(m, sent_digests) for s, m in gathered.results.items()}
            entry = {
                "round": round_,
                "seconds": round(time.monotonic() - started, 6),
                "replies": replies,
                "failed": gathered.failed,
            }
            rounds.append(entry)
            _write(ctx.results_dir, sent_digests, rounds)
            ctx.report(
                {
                    "event": "round",
                    "round": round_,
                    "total_rounds": args.num_rounds,
                    "sites": {s: {"echoed": r["echoed"]} for s, r in replies.items()},
                    "failed": gathered.failed,
                }
            )
            require(gathered.outcome, ctx.min_clients, f"round {round_}")
            self.checkpoint(round_)


def _describe(reply: Model, sent: dict[str, str]) -> dict[str, Any]:
    digests = {name: digest(a) for name, a in reply.params.items()}
    return {
        "params": {name: int(a.nbytes) for name, a in reply.params.items()},
        "sha256": digests,
        "echoed": digests == sent,
        "metrics": reply.metrics,
        "meta": reply.meta,
    }


def _write(results: Path, sent: dict[str, str], rounds: list[dict[str, Any]]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "scatter_gather.json").write_text(
        json.dumps({"sent": sent, "rounds": rounds}, indent=2)
    )
