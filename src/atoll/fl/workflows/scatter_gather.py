"""The smallest workflow: send one payload to every site, gather what they send back.

Each round the server sends a model holding one uint8 array ``payload`` of ``payload_bytes``
bytes (deterministic content, so a site or a test can check it) with topic ``topic``; each site
answers with any model. The result, ``scatter_gather.json``, lists per round and site the reply's
parameter names, sizes and SHA-256 digests, and whether the reply echoed the payload. Meant to
prove the federation's path (and measure it), not to train anything.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.app_config import ScatterGatherArgs
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.workflows.api import Context, Workflow
from atoll.fl.workflows.rounds import require


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

    Args = ScatterGatherArgs

    def run(self) -> None:
        ctx, args = self.ctx, self.args
        initial = ctx.initial_model
        params = dict(initial.params) if initial else {"payload": make_payload(args.payload_bytes)}
        sent_digests = {name: digest(a) for name, a in params.items()}
        rounds: list[dict[str, Any]] = []
        for round_ in range(1, args.num_rounds + 1):  # 1-based, as users see rounds
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
            ctx.report(
                {
                    "event": "round",
                    "round": round_,
                    "total_rounds": args.num_rounds,
                    "sites": {s: {"echoed": r["echoed"]} for s, r in replies.items()},
                    "failed": gathered.failed,
                }
            )
            _write(ctx.results_dir, sent_digests, rounds)
            require(gathered.outcome, ctx.min_clients, f"round {round_}")


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
