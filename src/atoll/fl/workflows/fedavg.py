"""FedAvg (McMahan et al. 2017) and the loop FedProx and FedOpt share with it.

Each round: send the global model to the active sites as a ``train`` task; fold each result into
an example-weighted running mean as it arrives (``atoll.fl.aggregation``); require
``min_clients`` usable results; the mean (or, for FedOpt, the server optimizer's step from it)
becomes the new global model. Every ``evaluate_every`` rounds and after the last one, the sites
evaluate the new global model (a ``validate`` task); its example-weighted ``key_metric`` picks the
best model. At the end, cross-site evaluation, then the results.

Memory: the workflow takes the initial model's arrays over (the caller's ``initial.params`` is
emptied). Once a round's task is uploaded, the global model is needed again only for ``diff``
results, a server optimizer (FedOpt) or saving site models; without those it is handed to the
round's running sum, whose first full result overwrites it in place: one model in memory, not
two. A site that sends a diff in such a round is rejected for that round, and later rounds keep
the global model aside again. With ``accumulator: disk`` the global model is not in memory at
all: it lives in a file of the run folder (``atoll.fl.stored``), the round's sum in another, and
the mean is written from one to a third, so the server worker's memory does not grow with the
model.

Drop-outs: a site whose reply is an error (its worker is gone) is removed from later rounds; a
site that sends an unusable result or misses ``round_timeout`` only misses that round. A round
or evaluation with fewer than ``min_clients`` usable answers fails the workflow with a
``WorkflowError`` naming every failed site and why.

Results in ``ctx.results_dir``: ``global_model_final.safetensors``,
``global_model_best.safetensors``, ``metrics.jsonl``, ``metrics.csv``, ``training_curves.png``,
``cross_site_eval.json``, ``summary.json`` (and ``site_models/`` with ``cross_site_eval: all``),
``model_digests.jsonl`` (each round's global model's SHA-256, for the provenance record).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atoll.fl.aggregation import weighted_metrics
from atoll.fl.aggregators import CoordinateMedian, TrimmedMean, WeightedAverage
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.serde import ModelStream, save_file
from atoll.fl.stored import is_stored, store, trim
from atoll.fl.workflows.api import Aggregator, BuiltinArgs, Context, Workflow
from atoll.fl.workflows.evaluation import cross_site_table, evaluate, format_table, save_table
from atoll.fl.workflows.round_report import report_round
from atoll.fl.workflows.rounds import Outcome, WorkflowError, require

if TYPE_CHECKING:
    from atoll.fl.app_config import FedAvgArgs
    from atoll.fl.privacy.server_privacy import ServerPrivacy

log = logging.getLogger(__name__)

Params = dict[str, np.ndarray]
# (old global, example-weighted mean of the results, round) -> new global
ServerUpdate = Callable[[Params, Params, int], Params]

FINAL_MODEL = "global_model_final.safetensors"
BEST_MODEL = "global_model_best.safetensors"


def run_fedavg(
    channel: ServerChannel,
    args: FedAvgArgs,
    initial: Model | None,
    job_args: dict[str, Any],
    *,
    workflow: str = "fedavg",
    server_update: ServerUpdate | None = None,
    site_meta: dict[str, Any] | None = None,
) -> None:
    FedAvgRun(channel, args, initial, job_args, workflow, server_update, site_meta or {}).run()


def _privacy(ctx: Context, has_initial: bool) -> ServerPrivacy | None:
    """app.yaml's privacy section, as the runner passed it in the job's settings: the
    context's one ``ServerPrivacy``, which ``ctx.secure_round`` uses too."""
    settings = ctx.job_args.get("privacy")
    if settings is None:
        return None
    if settings.changes_updates and not has_initial:
        raise WorkflowError("privacy filters and secure aggregation need the sites to send "
                            "updates against a global model: set server.initial_model in "
                            "app.yaml")
    return ctx._server_privacy()


class FedAvgFamily(Workflow):
    """A workflow run by the loop below (FedAvg, FedProx, FedOpt): its checkpoint is the loop's."""

    _loop: FedAvgRun | None = None

    def make_loop(self) -> FedAvgRun:
        raise NotImplementedError

    def loop(self) -> FedAvgRun:
        if self._loop is None:
            self._loop = self.make_loop()
        return self._loop

    def state(self) -> dict[str, Any]:
        return self.loop().state()

    def restore(self, state: dict[str, Any]) -> None:
        self.loop().restore(state)

    def run(self) -> None:
        self.loop().run()


class FedAvg(FedAvgFamily):
    """``workflow: fedavg``: the loop below, on the public workflow API."""

    Args = BuiltinArgs("FedAvgArgs")

    def make_loop(self) -> FedAvgRun:
        return FedAvgRun.on(self.ctx, "fedavg")


class FedAvgRun:
    def __init__(
        self,
        channel: ServerChannel | Context,
        args: FedAvgArgs,
        initial: Model | None,
        job_args: dict[str, Any],
        workflow: str,
        server_update: ServerUpdate | None,
        site_meta: dict[str, Any],
    ):
        ctx = channel if isinstance(channel, Context) else Context(channel, args, initial, job_args)
        self.ctx = ctx
        self.args = args
        self.workflow = workflow
        self.server_update = server_update
        self.site_meta = site_meta
        self.results = ctx.results_dir
        self.min_clients = ctx.min_clients
        self.active = ctx.active  # the context's list: gather removes sites that drop out
        self.dropped = ctx.dropped
        self.global_params: Params = dict(initial.params) if initial else {}
        if initial is not None:
            initial.params.clear()  # ours now: one copy of the model, updated in place
        self.saw_diff = False  # a site sent a diff: keep the global model aside in every round
        self.last_validation: dict[str, float] = {}
        self.best: tuple[int, float] | None = None
        self.metrics = ctx.metrics
        self.privacy = _privacy(ctx, bool(self.global_params))
        self.stopped: str | None = None  # why training ended before num_rounds
        self.rounds_done = 0
        self._digested = 0  # the last round whose model digest was stated
        # the cross-site evaluation after the last round, as far as it went: model -> rows
        self.cross_site_done: dict[str, Any] = {"table": {}, "failures": {}}

    @classmethod
    def on(
        cls,
        ctx: Context,
        workflow: str,
        server_update: ServerUpdate | None = None,
        site_meta: dict[str, Any] | None = None,
    ) -> FedAvgRun:
        """The loop for a workflow that already has its context (built-ins, subclasses)."""
        return cls(ctx, ctx.args, ctx.initial_model, {}, workflow, server_update, site_meta or {})

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._keep_on_disk()
            # 1-based, as users see rounds; after a server restart, on from the checkpoint
            for round_ in range(self.ctx.start_round, self.args.num_rounds + 1):
                if self.privacy is not None and (reason := self.privacy.stop_reason()):
                    self._stop(round_, reason)
                    break
                self.train_round(round_)
                self.rounds_done = round_
                self._commit()
            final = save_file(self._global_model(self.rounds_done), self.results / FINAL_MODEL)
            if self.best is None:  # no usable validation: the final model is the best we know
                shutil.copyfile(final, self.results / BEST_MODEL)
            table = self.cross_site(final)
            self._write_summary(table)
        finally:
            self.ctx.close()

    # --- the checkpoint (server restarts) -----------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the loop needs to go on after ``rounds_done`` (the context adds its own)."""
        state: dict[str, Any] = {
            "global": self.global_params, "rounds_done": self.rounds_done,
            "saw_diff": self.saw_diff, "last_validation": self.last_validation,
            "best": list(self.best) if self.best is not None else None,
            "cross_site": self.cross_site_done,
        }
        optimizer_state = getattr(self.server_update, "state", None)
        if callable(optimizer_state):
            state["server_update"] = optimizer_state()
        return state

    def _commit(self) -> None:
        """Checkpoint after the last completed round (and each cross-site row after it),
        written while the next task goes out: the loop changes no array of the state before a
        result arrives, and gather waits for the write first. Not with the sum on disk, which
        lets the global model leave memory at once."""
        model, stated = self._round_model(self.rounds_done)
        self.ctx.checkpoint(self.rounds_done, self.state(),
                            background=self.args.accumulator != "disk",
                            model=model, model_digest=stated)

    def restore(self, state: dict[str, Any]) -> None:
        self.global_params = dict(state["global"])
        self.rounds_done = int(state["rounds_done"])
        self.saw_diff = bool(state["saw_diff"])
        self.last_validation = dict(state["last_validation"])
        self.best = tuple(state["best"]) if state.get("best") else None  # type: ignore[assignment]
        done = state.get("cross_site") or {}
        self.cross_site_done = {"table": dict(done.get("table") or {}),
                                "failures": dict(done.get("failures") or {})}
        if "server_update" in state:
            self.server_update.restore(state["server_update"])  # type: ignore[union-attr]
        self._cut_digests(self.rounds_done)
        self._digested = self.rounds_done

    def _cut_digests(self, round_: int) -> None:
        """Keep model_digests.jsonl's lines up to ``round_``: later ones are written again."""
        path = self.results / "model_digests.jsonl"
        if not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if int(json.loads(line)["round"]) <= round_:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
        path.write_text("".join(kept), encoding="utf-8")

    def _stop(self, round_: int, reason: str) -> None:
        """The job's privacy budget allows no further round: end with what we have."""
        if round_ == 1 and self.rounds_done == 0:
            raise WorkflowError(f"no round can run: {reason}; raise privacy.dp.max_epsilon or "
                                "privacy.dp.noise_multiplier in app.yaml")
        self.stopped = reason
        log.warning("training stops after round %d of %d: %s", round_ - 1, self.args.num_rounds,
                    reason)
        self.ctx.report({"event": "stopped", "round": round_ - 1, "reason": reason})

    def _keep_on_disk(self) -> None:
        """With ``accumulator: disk``, the global model goes to a file of the run folder (a mean
        made on disk is there already)."""
        if self.args.accumulator == "disk" and self.global_params:
            in_memory = not all(map(is_stored, self.global_params.values()))
            self.global_params = store(self.global_params, os.getcwd())
            if in_memory:  # its arrays are freed now (the caller gave them over)
                trim()

    def _global_model(self, round_: int) -> Model:
        return Model(
            params=self.global_params,
            round=round_,
            metrics=self.last_validation,
            meta={
                "total_rounds": self.args.num_rounds,
                "workflow": self.workflow,
                **self.site_meta,
            },
        )

    def _aggregator(self, reuse: bool) -> Aggregator:
        if self.args.aggregator == "median":
            return CoordinateMedian(self.global_params or None)
        if self.args.aggregator == "trimmed_mean":
            return TrimmedMean(self.args.trim_fraction, self.global_params or None)
        spill = os.getcwd() if self.args.accumulator == "disk" else None  # the run folder
        return WeightedAverage(self.global_params, reuse_reference=reuse, spill=spill)

    def train_round(self, round_: int) -> None:
        what = f"round {round_}"
        self.ctx.require_active(what)
        last = round_ == self.args.num_rounds
        keep_site_models = last and self.args.cross_site_eval == "all"
        outgoing = self._global_model(round_)
        if self.privacy is not None and (self.privacy.secure or self.privacy.central):
            headers = {"round": round_, "total_rounds": self.args.num_rounds}
            self._private_round(round_, outgoing, headers)
            return
        sent = self.ctx.send("train", outgoing, round=round_, total_rounds=self.args.num_rounds)
        del outgoing  # uploaded: the channel holds no view of our buffers any more
        reuse = (
            self.server_update is None
            and not keep_site_models
            and not self.saw_diff
            and self.args.aggregator == "weighted_mean"
            and self.privacy is None
        )
        aggregator = _NotingDiffs.around(self._aggregator(reuse), self)
        if reuse:
            self.global_params = {}  # the mean's now: its first full result overwrites it

        def keep_site_model(site: str, model: Model) -> None:
            self._save_site_model(site, model, round_)

        gathered = self.ctx.gather(
            sent,
            timeout=self.args.round_timeout,
            aggregator=aggregator,
            on_result=keep_site_model if keep_site_models else None,
            require_min=False,
        )
        outcome = gathered.outcome
        require(outcome, self.min_clients, what)
        train = {site: (m.metrics, m.num_examples) for site, m in gathered.results.items()}
        for site, model in gathered.results.items():  # fl.log_metrics values, sent with results
            self.metrics.record_logged(site, model.meta)
        averaged = gathered.aggregate or {}
        total = sum(n for _, n in train.values())
        self._finish_round(round_, averaged, train, outcome, total)

    def _private_round(self, round_: int, outgoing: Model, headers: dict[str, Any]) -> None:
        """A round whose aggregation the privacy settings own: secure aggregation (the server
        learns only the sum) or server-side DP (each update clipped, the sum noised). It runs
        on the job's link itself: masked replies cannot pass the context's result filters."""
        # the round ctx.secure_round runs too (the epsilon is recorded by _finish_round); a
        # server optimizer (FedOpt) needs the old global model beside the new one
        private, averaged = self.ctx._private_round(
            outgoing, round=round_, total_rounds=headers.get("total_rounds"),
            targets=self.active, timeout=self.args.round_timeout, min_replies=self.min_clients,
            in_place=self.server_update is None)
        del outgoing
        self._finish_round(round_, averaged, private.train, private.outcome, private.total_weight)

    def _finish_round(self, round_: int, averaged: Params,
                      train: dict[str, tuple[dict[str, float], int]], outcome: Outcome,
                      total_weight: float) -> None:
        if self.server_update is not None and self.global_params:
            self.global_params = self.server_update(self.global_params, averaged, round_)
        else:
            self.global_params = averaged
        self._keep_on_disk()
        for site, (metrics, n) in train.items():
            self.metrics.record(round_, "train", site, metrics, n)
        global_train = weighted_metrics(train.values())
        if global_train:
            self.metrics.record(round_, "train", "global", global_train, int(total_weight))
        spent = self.privacy.record_round() if self.privacy is not None else {}
        if spent:  # the job's privacy budget, through the metrics files like any metric
            self.metrics.record(round_, "privacy", "global", spent)
        validation = self.validate(round_) if self._evaluation_due(round_) else None
        report_round(self.ctx, round_, self.args, train, global_train, validation,
                     {**outcome.failed, **(validation["failed"] if validation else {})},
                     list(self.active), self.best, spent)

    def _round_model(self, round_: int) -> tuple[Model | None, Callable[[str], None] | None]:
        """Round ``round_``'s global model and what states its SHA-256 (the last round's is the
        final model's): the job's provenance record states each one (server/provenance.py,
        docs/provenance.md). The checkpoint stores the model first and gives its digest from
        the write's own pass, beside the next round's send, off the round's path. (None, None)
        when the round's is stated already (a cross-site row commits again)."""
        if round_ <= self._digested:
            return None, None
        self._digested = round_

        def stated(digest: str) -> None:
            stated = "sha256:" + digest
            with open(self.results / "model_digests.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"round": round_, "digest": stated}) + "\n")
            # the server states it in the job's provenance record as it arrives
            self.ctx.report({"event": "round_model", "round": round_, "model_digest": stated})

        # as it is now: its arrays stay until the checkpoint is settled
        return self._global_model(round_), stated

    def _evaluation_due(self, round_: int) -> bool:
        every = self.args.evaluate_every
        return every > 0 and (round_ % every == 0 or round_ == self.args.num_rounds)

    def validate(self, round_: int) -> dict[str, Any]:
        what = f"round {round_} validation"
        self.ctx.require_active(what)
        result = evaluate(
            self.ctx, self.active, self._global_model(round_), "global", self.args.round_timeout
        )
        require(result.outcome, self.min_clients, what)
        for site, metrics in result.metrics.items():
            self.metrics.record(round_, "validate", site, metrics, result.num_examples[site])
        overall = weighted_metrics(
            (result.metrics[s], result.num_examples[s]) for s in result.metrics
        )
        self.last_validation = overall
        if overall:
            self.metrics.record(
                round_, "validate", "global", overall, sum(result.num_examples.values())
            )
        self._track_best(round_, overall)
        return {"sites": result.metrics, "global": overall, "failed": result.outcome.failed}

    def _track_best(self, round_: int, overall: dict[str, float]) -> None:
        key = self.args.key_metric
        if key not in overall:
            if overall:
                log.warning(
                    "round %d: sites report %s but not key_metric %r; the best model cannot be "
                    "picked (set server.args.key_metric)",
                    round_,
                    sorted(overall),
                    key,
                )
            return
        value = overall[key]
        better = self.best is None or (
            value > self.best[1] if self.args.key_metric_mode == "max" else value < self.best[1]
        )
        if better:
            self.best = (round_, value)
            save_file(self._global_model(round_), self.results / BEST_MODEL)

    def _save_site_model(self, site: str, model: Model, round_: int) -> None:
        params = model.params
        if model.params_type == "diff" and self.global_params:
            params = {
                k: self.global_params[k] + v for k, v in params.items() if k in self.global_params
            }
        folder = self.results / "site_models"
        folder.mkdir(exist_ok=True)
        save_file(
            Model(params=params, round=round_, meta={"site": site}), folder / f"{site}.safetensors"
        )

    # --- the end ----------------------------------------------------------------------------

    def cross_site(self, final: Path) -> dict[str, Any]:
        mode = self.args.cross_site_eval
        if mode == "none" or not self.active:
            return {}
        models = [("global_final", final)]
        if self.best is not None and self.best[0] != self.args.num_rounds:
            models.append(("global_best", self.results / BEST_MODEL))
        if mode == "all":
            folder = self.results / "site_models"
            models += [
                (site, folder / f"{site}.safetensors")
                for site in sorted(self.ctx.sites)
                if (folder / f"{site}.safetensors").exists()
            ]
        def evaluated(label: str) -> None:  # a restart from here evaluates only the rest
            self._commit()

        table, failures = cross_site_table(
            self.ctx, self.active, models, self.args.round_timeout,
            done=self.cross_site_done, after=evaluated,
        )
        for label, row in table.items():
            for site, metrics in row.items():
                self.metrics.record(None, "cross_site", site, metrics, model=label)
        save_table(self.results / "cross_site_eval.json", table, failures, self.args.key_metric)
        text = format_table(table, self.args.key_metric)
        log.info("cross-site evaluation (%s):\n%s", self.args.key_metric, text)
        self.ctx.report(
            {
                "event": "cross_site_eval",
                "key_metric": self.args.key_metric,
                "table": table,
                "failures": failures,
                "text": text,
            }
        )
        return {"table": table, "failures": failures}

    def _write_summary(self, cross_site: dict[str, Any]) -> None:
        summary = {
            "workflow": self.workflow,
            "num_rounds": self.args.num_rounds,
            "key_metric": self.args.key_metric,
            "best_round": self.best[0] if self.best else None,
            "best_value": self.best[1] if self.best else None,
            "final_validation": self.last_validation,
            "sites": list(self.ctx.sites),
            "dropped": self.dropped,
            "cross_site_eval": cross_site.get("table", {}),
        }
        if self.privacy is not None:
            summary["privacy"] = self.privacy.summary()
        if self.stopped:
            summary["stopped"] = self.stopped
        (self.results / "summary.json").write_text(json.dumps(summary, indent=2))
        self.ctx.report({"event": "finished", **summary})


class _NotingDiffs:
    """Passes results on to the aggregator, noting a diff first (even one it then rejects):
    from then on every round keeps the global model aside."""

    def __init__(self, aggregator: Aggregator, run: FedAvgRun):
        self.aggregator, self.run = aggregator, run
        if hasattr(aggregator, "check"):
            self.check = aggregator.check  # type: ignore[attr-defined]

    @staticmethod
    def around(aggregator: Aggregator, run: FedAvgRun) -> _NotingDiffs:
        """The wrapper that streams where ``aggregator`` does. A class, not an attribute set on
        the instance: a bound method of its own would make a cycle, and keep the round's
        global model (its file, on disk) until a collection found it."""
        streams = hasattr(aggregator, "add_stream")
        return (_NotingStreamedDiffs if streams else _NotingDiffs)(aggregator, run)

    def _note(self, model: Model) -> None:
        if model.params_type == "diff":
            self.run.saw_diff = True

    def add(self, site: str, model: Model) -> None:
        self._note(model)
        self.aggregator.add(site, model)

    def result(self) -> Params:
        return self.aggregator.result()


class _NotingStreamedDiffs(_NotingDiffs):
    def add_stream(self, site: str, stream: ModelStream) -> Model:
        self._note(stream.model)
        return self.aggregator.add_stream(site, stream)  # type: ignore[attr-defined]
