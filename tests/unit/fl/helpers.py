"""Scripted sites for workflow tests: plain functions answering tasks through the simulator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.model import Model
from atoll.fl.serde import decode, encode
from atoll.fl.simulator import Federation

# handler(topic, received model) -> the answer (a Model, or raw bytes), or None: never answer
Handler = Callable[[str, Model], Model | bytes | None]


class SiteGone(Exception):
    """Raised by a handler: the site drops out (as when its worker dies)."""


def run_workflow(
    workflow: Callable[..., None],
    args: Any,
    handlers: dict[str, Handler],
    results_dir: Path,
    initial: Model | None = None,
    job_args: dict[str, Any] | None = None,
) -> Federation:
    federation = Federation(list(handlers), results_dir)

    def loop(site: str, handler: Handler) -> None:
        channel = federation.site_channel(site)
        while (task := channel.receive()) is not None:
            model = decode(task.chunks)
            model.meta["task"] = task.topic
            try:
                answer = handler(task.topic, model)
            except SiteGone as exc:
                federation.drop(site, f"{site} dropped out: {exc}")
                return
            if isinstance(answer, bytes):  # raw bytes: for broken or truncated payloads
                channel.reply(task.task_id, {}, [answer])
            elif answer is not None:
                channel.reply(task.task_id, {}, encode(answer))

    threads = [threading.Thread(target=loop, args=item, daemon=True) for item in handlers.items()]
    for thread in threads:
        thread.start()
    try:
        workflow(federation.server_channel(), args, initial, job_args or {})
    finally:
        federation.close()
        for thread in threads:
            thread.join(timeout=30)
    return federation


def metrics_only(accuracy: float = 0.5, n: int = 10) -> Model:
    return Model(metrics={"accuracy": accuracy}, num_examples=n)


def fixed_result(params: dict[str, np.ndarray], n: int, accuracy: float = 0.5) -> Handler:
    """A site that always trains to ``params`` and evaluates to ``accuracy``."""

    def handler(topic: str, model: Model) -> Model:
        if topic == "validate":
            return metrics_only(accuracy)
        return Model(
            params={k: v.copy() for k, v in params.items()}, num_examples=n, metrics={"loss": 1.0}
        )

    return handler
