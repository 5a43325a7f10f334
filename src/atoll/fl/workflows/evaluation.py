"""Federated evaluation: sites evaluate a model on their own data and send back metrics only.

The server sends a ``validate`` task carrying the model; the site script evaluates it and
answers ``fl.send(fl.Model(metrics={...}, num_examples=n))`` (or the evaluate function given to
``fl.init(evaluate=...)`` does it for the script). Used after every ``evaluate_every`` rounds on
the new global model, and at the end for cross-site evaluation: every site evaluates the final
global model (the best one too, when it differs) and, with ``cross_site_eval: all``, every
site's last local model. Results form a table model x site, saved as ``cross_site_eval.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.fl.model import Model
from atoll.fl.workflows.rounds import Outcome

if TYPE_CHECKING:  # the workflow API imports this package; at run time the context is passed in
    from atoll.fl.workflows.api import Context, Gathered

VALIDATE = "validate"


@dataclass
class Evaluation:
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> metrics
    num_examples: dict[str, int] = field(default_factory=dict)
    outcome: Outcome = field(default_factory=Outcome)


def _evaluation(gathered: Gathered) -> Evaluation:
    evaluation = Evaluation(outcome=gathered.outcome)
    for site, model in gathered.results.items():
        evaluation.metrics[site] = model.metrics
        evaluation.num_examples[site] = model.num_examples
    return evaluation


def evaluate(
    ctx: Context,
    targets: Sequence[str],
    model: Model,
    label: str,
    timeout: float | None,
) -> Evaluation:
    """Every target evaluates ``model`` (``label`` tells them which model it is)."""
    sent = ctx.send(VALIDATE, model, targets=targets, args={"model": label})
    return _evaluation(ctx.gather(sent, timeout=timeout, min_replies=0))


def evaluate_file(
    ctx: Context,
    targets: Sequence[str],
    path: Path,
    label: str,
    timeout: float | None,
) -> Evaluation:
    """Like ``evaluate`` for a saved model, streamed from its file without loading it."""
    sent = ctx.send_file(VALIDATE, path, targets, {"round": None, "model": label})
    return _evaluation(ctx.gather(sent, timeout=timeout, min_replies=0))


def cross_site_table(
    ctx: Context,
    targets: Sequence[str],
    models: Iterable[tuple[str, Path]],
    timeout: float | None,
    done: dict[str, Any] | None = None,
    after: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, str]]]:
    """Evaluate each saved model on every target: (model -> site -> metrics, model -> failures).

    ``done`` (``{"table": ..., "failures": ...}``, filled in as each model is evaluated): the
    models it already holds are not evaluated again (a run resumed after a server restart);
    ``after(label)`` is called once each new row is in it (the workflow's checkpoint)."""
    done = done if done is not None else {"table": {}, "failures": {}}
    table, failures = done["table"], done["failures"]
    for label, path in models:
        if label in table:
            continue
        result = evaluate_file(ctx, targets, path, label, timeout)
        table[label] = result.metrics
        if result.outcome.failed:
            failures[label] = result.outcome.failed
        if after is not None:
            after(label)
    return table, failures


def format_table(table: dict[str, dict[str, dict[str, float]]], metric: str) -> str:
    """A plain-text table of one metric: a row per model, a column per site."""
    sites = sorted({site for row in table.values() for site in row})
    width = max([len("model")] + [len(label) for label in table])
    lines = [f"{'model':<{width}}  " + "  ".join(f"{s:>12}" for s in sites)]
    for label, row in table.items():
        cells = []
        for site in sites:
            value = row.get(site, {}).get(metric)
            cells.append(f"{value:>12.4f}" if value is not None else f"{'-':>12}")
        lines.append(f"{label:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def save_table(path: Path, table: dict, failures: dict, metric: str) -> None:
    path.write_text(
        json.dumps({"key_metric": metric, "table": table, "failures": failures}, indent=2)
    )
