"""The server-side workflow API: what a workflow (built-in or shipped in a job's app) works with.

A workflow is a class with a ``run()`` method; app.yaml names it (``workflow: fedavg`` for a
built-in, ``workflow: my_workflow.py:MyWorkflow`` for a file of the app folder). The server
worker makes one ``Context`` (the job's link to its sites and its results folder, nothing else)
and calls ``MyWorkflow(ctx).run()``; returning ends the job, raising fails it.

```python
from atoll.workflow import Context, Model, WeightedAverage, Workflow

class MyFedAvg(Workflow):
    def run(self) -> None:
        model = self.model = getattr(self, "model", None) or self.ctx.initial_model or Model()
        for round_ in range(self.ctx.start_round, self.ctx.args["num_rounds"] + 1):
            sent = self.ctx.send("train", model, round=round_)        # to every active site
            replies = self.ctx.gather(sent, timeout=60, aggregator=WeightedAverage())
            model = self.model = Model(params=replies.aggregate, round=round_)
            self.ctx.log_metrics(replies.mean_metrics(), round=round_)
            self.checkpoint(round_)                    # what survives a server restart
        self.ctx.save_model("final", model)

    def state(self):                                   # arrays and JSON-safe values
        return {"params": self.model.params}

    def restore(self, state):
        self.model = Model(params=state["params"])
```

Server restarts: a workflow that defines ``state()`` and ``restore(state)`` and calls
``self.checkpoint(round_)`` after each completed round resumes after a restart of the server:
the runner restores its last checkpoint before ``run()``, and ``ctx.start_round`` is the round
to go on from (1 on a fresh start). The context keeps its own part (active sites, the job's DP
accounting, the random state) in the same checkpoint (``atoll.fl.checkpoint``).

Seams for filters (privacy, compression): ``ctx.task_filters`` change each outgoing model,
``ctx.result_filters`` each incoming result before any aggregator sees it; aggregators follow
the ``Aggregator`` protocol (``atoll.fl.aggregators``). Errors: ``WorkflowError`` ends the job
with its message; an aggregator or filter raises ``ResultRejected`` to refuse one site's result.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from atoll.fl.aggregation import weighted_metrics
from atoll.fl.channels import ServerChannel
from atoll.fl.metrics_log import MetricsLog
from atoll.fl.model import Model
from atoll.fl.progress_bound import bounded
from atoll.fl.serde import ModelStream, encode, save_file
from atoll.fl.workflows.rounds import (
    Outcome,
    WorkflowError,
    describe,
    gather,
    require,
    resolve_min_clients,
)
from atoll.fl.workflows.secure import SecureResult, private_round, server_privacy

if TYPE_CHECKING:
    from pydantic import BaseModel

    from atoll.fl.privacy.server_privacy import PrivateRound, ServerPrivacy

log = logging.getLogger(__name__)

Params = dict[str, np.ndarray]
# (site, model) -> model: a task filter sees each outgoing model (site "*": one for all targets),
# a result filter each incoming result; raise ResultRejected to refuse it.
Filter = Callable[[str, Model], Model]


@runtime_checkable
class Aggregator(Protocol):
    """Folds the results of one task into new params. One instance per task."""

    def add(self, site: str, model: Model) -> None:
        """Take one site's result (raise ``ResultRejected`` to refuse it)."""
        ...

    def result(self) -> Params:
        """The aggregate of everything added."""
        ...


@runtime_checkable
class StreamingAggregator(Aggregator, Protocol):
    """An aggregator that folds a result in while it arrives, never holding it whole."""

    def add_stream(self, site: str, stream: ModelStream) -> Model:
        """Fold the stream in; return its header (metrics, num_examples, params empty)."""
        ...


@dataclass(frozen=True)
class Sent:
    """A task on its way: what ``send`` returns and ``gather`` takes."""

    task_id: str
    task: str
    targets: tuple[str, ...]
    round: int | None
    # Sends the same task to one site again (its part restarted mid-round): gather calls it.
    resend: Callable[[str], str] | None = field(default=None, repr=False, compare=False)


@dataclass
class Gathered:
    """The answers to one task."""

    task: str
    round: int | None
    results: dict[str, Model] = field(default_factory=dict)  # params empty if aggregated
    outcome: Outcome = field(default_factory=Outcome)
    aggregate: Params | None = None  # the aggregator's result, when one was given

    @property
    def ok(self) -> list[str]:
        return list(self.outcome.ok)

    @property
    def failed(self) -> dict[str, str]:
        """Sites that dropped out, sent something unusable or were late, with why."""
        return self.outcome.failed

    def mean_metrics(self) -> dict[str, float]:
        """Each metric's mean over the sites that reported it, weighted by num_examples."""
        return weighted_metrics((m.metrics, m.num_examples) for m in self.results.values())


class Context:
    """One job as a workflow sees it: its sites, arguments, results folder and link to sites."""

    def __init__(
        self,
        channel: ServerChannel,
        args: Any,
        initial_model: Model | None = None,
        job_args: dict[str, Any] | None = None,
    ):
        self._channel = channel
        self.args = args  # the validated server.args (a pydantic model, or a dict)
        self.initial_model = initial_model
        self.job_id: str = channel.job_id
        self.sites: list[str] = list(channel.sites)
        self.results_dir = Path(channel.results_dir)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        requested = (
            args.get("min_clients") if isinstance(args, dict) else getattr(args, "min_clients", None)
        )
        # The runner's settings of the job: job_id, name, tracking (for the metrics log) and
        # app.yaml's privacy section (the FedAvg family reads it).
        self.job_args = dict(job_args or {})
        self.min_clients = resolve_min_clients(requested, self.job_args, self.sites)
        self.active: list[str] = list(self.sites)  # sites that have not dropped out
        self.dropped: dict[str, str] = {}
        privacy = self.job_args.get("privacy")  # app.yaml's {type: quantize} in filters.task:
        self.task_quantization = (  # every model sent to the sites travels 8-bit
            privacy.task_quantization if privacy is not None else None)
        self.task_filters: list[Filter] = []
        self.result_filters: list[Filter] = []
        self._metrics: MetricsLog | None = None
        self._privacy: ServerPrivacy | None = None
        # where checkpoints go (the server worker's run folder; None: this run keeps none)
        self._checkpoints: Path | None = getattr(channel, "checkpoint_dir", None)
        self.resumed_round: int | None = None  # the checkpoint's round after a restart
        # a checkpoint being written while the next round starts, and what stopped it
        self._committing: tuple[threading.Thread, list[BaseException]] | None = None

    @property
    def channel(self) -> ServerChannel:
        """The job's link to its sites, for a protocol that runs a whole round itself (secure
        aggregation: masked replies must not pass ``result_filters``); workflows use
        ``send``/``gather``."""
        self.settle_checkpoint()  # the protocol may change the state from here on
        return self._channel

    # --- tasks ------------------------------------------------------------------------------

    def send(
        self,
        task: str,
        model: Model | None = None,
        *,
        targets: Sequence[str] | None = None,
        args: dict[str, Any] | None = None,
        round: int | None = None,
        total_rounds: int | None = None,
    ) -> Sent:
        """Send ``model`` as task ``task`` to ``targets`` (default: every active site).

        ``args`` (JSON-safe) reach the site script in ``model.meta``; ``round`` in
        ``model.current_round``. The model is uploaded once, whatever the number of targets.
        """
        chosen = list(self.active if targets is None else targets)
        unknown = [t for t in chosen if t not in self.sites]
        if unknown:
            raise WorkflowError(f"task {task}: unknown site(s) {unknown}; sites: {self.sites}")
        model = model if model is not None else Model()
        meta = dict(model.meta)
        meta.update(args or {})
        if total_rounds is not None:
            meta["total_rounds"] = total_rounds
        outgoing = Model(
            params=model.params,
            num_examples=model.num_examples,
            params_type=model.params_type,
            metrics=model.metrics,
            round=round if round is not None else model.round,
            meta=meta,
        )
        for task_filter in self.task_filters:
            outgoing = task_filter("*", outgoing)
        headers: dict[str, Any] = {"round": outgoing.round}
        if "total_rounds" in meta:
            headers["total_rounds"] = meta["total_rounds"]
        quantize = self.task_quantization
        task_id = self._channel.send(chosen, task, headers, encode(outgoing, quantize=quantize))
        return Sent(task_id, task, tuple(chosen), outgoing.round,
                    lambda site: self._channel.send([site], task, headers,
                                                    encode(outgoing, quantize=quantize)))

    def send_file(self, task: str, path: Path, targets: Sequence[str], headers: dict) -> Sent:
        """Send a saved model file as it is, streamed (cross-site evaluation of saved models)."""
        from atoll.fl.serde import iter_file

        task_id = self._channel.send(list(targets), task, headers, iter_file(path))
        return Sent(task_id, task, tuple(targets), headers.get("round"),
                    lambda site: self._channel.send([site], task, headers, iter_file(path)))

    def gather(
        self,
        sent: Sent,
        *,
        timeout: float | None = None,
        min_replies: int | None = None,
        aggregator: Aggregator | None = None,
        on_result: Callable[[str, Model], None] | None = None,
        require_min: bool = True,
        what: str | None = None,
    ) -> Gathered:
        """Take the replies to ``sent`` as they arrive, until all answered or ``timeout``.

        Each usable result goes through ``result_filters``, then ``on_result(site, model)``,
        then ``aggregator.add``; a streaming aggregator without filters or ``on_result`` folds
        the result in block by block instead. A site whose reply is an error has dropped out:
        it leaves ``ctx.active``. Once ``min_replies`` (default ``ctx.min_clients``) usable
        results are out of reach it stops waiting; with fewer it raises ``WorkflowError`` naming
        every failed site, unless ``require_min`` is False (``what`` starts that message; default: the task and round).
        """
        wanted = self.min_clients if min_replies is None else min_replies
        gathered = Gathered(sent.task, sent.round)
        stream_in = (
            isinstance(aggregator, StreamingAggregator)
            and not self.result_filters
            and on_result is None
        )

        def take(site: str, stream: ModelStream) -> None:
            self.settle_checkpoint()  # before a result can change the checkpoint's arrays
            if stream_in:
                assert isinstance(aggregator, StreamingAggregator)
                gathered.results[site] = aggregator.add_stream(site, stream)
                return
            model = stream.read()
            for result_filter in self.result_filters:
                model = result_filter(site, model)
            check = getattr(aggregator, "check", None)
            if check is not None:  # refuse before on_result keeps anything of it
                check(model)
            if on_result is not None:
                on_result(site, model)
            if aggregator is not None:
                aggregator.add(site, model)
            gathered.results[site] = model

        gathered.outcome = gather(
            self._channel, sent.task_id, sent.targets, timeout, take, wanted, sent.resend
        )
        self.settle_checkpoint()  # no result came: the workflow goes on from here
        self.note_dropouts(gathered.outcome)
        if what is None:
            what = sent.task + (f" in round {sent.round}" if sent.round is not None else "")
        if require_min:
            require(gathered.outcome, wanted, what)
        if aggregator is not None and gathered.outcome.ok:
            gathered.aggregate = aggregator.result()
        return gathered

    def ask(
        self,
        task: str,
        model: Model | None = None,
        *,
        targets: Sequence[str] | None = None,
        args: dict[str, Any] | None = None,
        round: int | None = None,
        timeout: float | None = None,
        min_replies: int | None = None,
        aggregator: Aggregator | None = None,
    ) -> Gathered:
        """``send`` then ``gather``: one round trip."""
        sent = self.send(task, model, targets=targets, args=args, round=round)
        return self.gather(sent, timeout=timeout, min_replies=min_replies, aggregator=aggregator)

    def secure_round(
        self,
        model: Model,
        *,
        round: int,
        total_rounds: int | None = None,
        targets: Sequence[str] | None = None,
        timeout: float | None = None,
        min_replies: int | None = None,
    ) -> SecureResult:
        """One ``train`` round under secure aggregation: the server learns only the sum.

        Sends ``model`` as a ``train`` task to ``targets`` (default: every active site) after
        the protocol's key and share steps; each site's runtime masks its update (its weights
        minus ``model.params``, after app.yaml's reply filters and client-mode DP) and the
        server folds the masked replies into one sum, then unmasks the sum alone. Sites that
        drop out after masking are recovered from the others' shares; drop-outs leave
        ``ctx.active`` as with ``gather``. Fewer than ``min_replies`` (default
        ``ctx.min_clients``) masked updates raise ``WorkflowError``. ``round`` must be an int
        (the round's keys are bound to it). Neither ``task_filters`` nor ``result_filters``
        apply: the sites' own privacy filters do. Needs app.yaml's
        ``privacy.secure_aggregation``; with ``privacy.dp`` it records the round's epsilon and
        refuses a round past ``privacy.dp.max_epsilon``.
        """
        privacy = self._server_privacy()
        if privacy is None or not privacy.secure:
            raise WorkflowError(
                "secure_round needs secure aggregation: set privacy.secure_aggregation in the "
                "job's app.yaml (for example `privacy: {secure_aggregation: {}}`); the sites' "
                "runtimes mask their updates only then")
        reason = privacy.stop_reason()
        if reason is not None:
            raise WorkflowError(f"round {round}: {reason}")
        private, aggregate = self._private_round(
            model, round=round, total_rounds=total_rounds, targets=targets, timeout=timeout,
            min_replies=min_replies)
        return SecureResult(
            round=round,
            aggregate=aggregate,
            metrics={site: dict(metrics) for site, (metrics, _) in private.train.items()},
            outcome=private.outcome,
            total_weight=private.total_weight,
            privacy=privacy.record_round(),
        )

    def _server_privacy(self) -> ServerPrivacy | None:
        """The job's one ``ServerPrivacy`` (workflows/secure.py), made on first use."""
        if self._privacy is None:
            self._privacy = server_privacy(self.job_args)
        return self._privacy

    def _private_round(self, model: Model, **how: Any) -> tuple[PrivateRound, Params]:
        """A train round the privacy settings aggregate (workflows/secure.py); ``secure_round``
        and the FedAvg family run on it."""
        privacy = self._server_privacy()
        assert privacy is not None
        return private_round(self, privacy, model, **how)

    def require_active(self, what: str, needed: int | None = None) -> None:
        """Fail when fewer active sites are left than ``needed`` (default ``min_clients``)."""
        needed = self.min_clients if needed is None else needed
        if len(self.active) < needed:
            raise WorkflowError(
                f"{what}: only {len(self.active)} site(s) left "
                f"({', '.join(self.active) or 'none'}), min_clients is {needed}. "
                f"Dropped: {describe(self.dropped)}"
            )

    def note_dropouts(self, outcome: Outcome) -> None:
        """Sites whose reply was an error leave ``active`` (``gather`` calls it; a protocol that
        runs its own round on ``channel`` calls it too)."""
        for site, reason in outcome.dropped.items():
            self.dropped[site] = reason
            if site in self.active:
                self.active.remove(site)
            log.warning("%s dropped out: %s", site, reason)

    # --- results ----------------------------------------------------------------------------

    def save_model(self, name: str, model: Model | Params) -> Path:
        """Save ``model`` as ``<results>/<name>.safetensors`` (part of the job's download)."""
        if not isinstance(model, Model):
            model = Model(params=dict(model))
        return save_file(model, self._result_path(name, ".safetensors"))

    def save_json(self, name: str, data: Any) -> Path:
        """Save JSON-safe ``data`` as ``<results>/<name>.json``."""
        path = self._result_path(name, ".json")
        path.write_text(json.dumps(data, indent=2, sort_keys=True))
        return path

    def result_path(self, filename: str) -> Path:
        """A path inside the results folder, for other files (a PNG, a CSV)."""
        return self._result_path(filename, "")

    def _result_path(self, name: str, suffix: str) -> Path:
        path = (self.results_dir / f"{name.removesuffix(suffix)}{suffix}").resolve()
        if not path.is_relative_to(self.results_dir.resolve()) or path == self.results_dir:
            raise WorkflowError(f"result name {name!r} must stay inside the results folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def metrics(self) -> MetricsLog:
        """metrics.jsonl / metrics.csv / training_curves.png, opened on first use."""
        if self._metrics is None:
            self._metrics = MetricsLog(self.results_dir, self.job_args)
        return self._metrics

    def log_metrics(
        self,
        metrics: dict[str, float],
        *,
        round: int | None,
        site: str = "global",
        phase: str = "train",
        num_examples: int = 0,
    ) -> None:
        """Record metrics of one round (site ``global`` for the federation's value)."""
        self.metrics.record(round, phase, site, metrics, num_examples)

    def report(self, event: dict[str, Any]) -> None:
        """Live progress for ``atoll job status|logs`` (JSON-safe; ``event`` names its kind).
        Per-site entries beyond what one report may carry are left out, and counted."""
        self._channel.report(bounded(event))

    # --- checkpoints (server restarts) -------------------------------------------------------

    @property
    def start_round(self) -> int:
        """The first round to run: 1, or the one after the restored checkpoint's."""
        return (self.resumed_round or 0) + 1

    def checkpoint(self, round: int, state: dict[str, Any], *, background: bool = False,
                   model: Model | None = None,
                   model_digest: Callable[[str], None] | None = None) -> None:
        """Commit ``state`` (the workflow's) as what the job resumes from after round ``round``,
        with the context's own part; ``Workflow.checkpoint`` calls it.

        ``background``: write it while the next round starts (a large model's write and fsync
        then cost the round nothing). The caller promises not to change ``state``'s arrays (nor
        ``model``'s) until the next result arrives: ``gather`` (and ``channel``, for a protocol of its own)
        wait for the write first, as do the next checkpoint and ``close``.

        ``model``: the round's model, whose arrays ``state`` may hold too: stored once, first
        in the checkpoint, and ``model_digest`` is given its SHA-256 (as its own .safetensors
        file would have it) from the write's own pass, before the checkpoint is reported;
        where no checkpoint is kept, from a pass of its own (FedAvg's round digest)."""
        if self._checkpoints is None and model_digest is None:
            return
        from atoll.fl import checkpoint

        self.settle_checkpoint()
        own = {"active": list(self.active), "dropped": dict(self.dropped),
               "random": _random_state()}
        if self._privacy is not None and self._privacy.ledger is not None:
            own["dp"] = {"steps": self._privacy.ledger.steps,
                         "spent": list(self._privacy.ledger.spent)}
        folder, saved = self._checkpoints, {"workflow": state, "context": own}

        def commit() -> None:
            if folder is None:  # no checkpoint kept: the digest alone
                if model is not None and model_digest is not None:
                    model_digest(checkpoint.model_sha256(model))
                return
            written = checkpoint.save(folder, round, saved, model)
            if model_digest is not None and written.model_sha256 is not None:
                model_digest(written.model_sha256)
            # reported at once: the server resumes from the last round told of
            self._committed(round, written.bytes)

        if not background:
            commit()
            return
        outcome: list[BaseException] = []  # what stopped it, raised in the workflow's thread

        def write() -> None:
            try:
                commit()
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=write, name=f"checkpoint-{round}", daemon=True)
        thread.start()
        self._committing = (thread, outcome)

    def settle_checkpoint(self) -> None:
        """Wait for a checkpoint being written in the background; its error, if it failed."""
        if self._committing is None:
            return
        thread, outcome = self._committing
        self._committing = None
        thread.join()
        if outcome:
            raise outcome[0]

    def _committed(self, round_: int, size: int) -> None:
        committed = getattr(self._channel, "checkpoint_committed", None)
        if committed is not None:  # a run folder that goes with its worker: sent home first
            committed(round_)
        # the server counts a round as resumable from this report on (lifecycle.py)
        self.report({"event": "checkpoint", "round": round_, "bytes": size})

    def resume(self, expected: int | None = None) -> dict[str, Any] | None:
        """After a server restart: the workflow's state of the last checkpoint (the context's
        own part restored, the metrics files cut back to its round), or None when no round
        had completed. ``expected``: the round the server saw committed last; a checkpoint
        missing or older than that, or damaged, raises ``WorkflowError``."""
        from atoll.fl import checkpoint
        from atoll.fl.metrics_log import truncate_after

        found = None
        if self._checkpoints is not None:
            try:
                found = checkpoint.load(self._checkpoints)
            except checkpoint.CheckpointDamaged as exc:
                raise WorkflowError(f"cannot resume after the server restart: {exc}") from None
        have = found[0] if found else 0
        if expected and have < expected:
            raise WorkflowError(
                f"cannot resume after the server restart: the checkpoint of round {expected} "
                f"is missing (found {'round ' + str(have) if have else 'none'})")
        truncate_after(self.results_dir, have)
        if found is None:
            self.report({"event": "restored", "round": 0})
            return None
        round_, saved = found
        own = saved.get("context") or {}
        self.active[:] = [s for s in own.get("active", self.sites) if s in self.sites]
        self.dropped.update(own.get("dropped") or {})
        _set_random_state(own.get("random"))
        dp = own.get("dp")
        if dp is not None:
            privacy = self._server_privacy()
            if privacy is None or privacy.ledger is None:
                raise WorkflowError("cannot resume after the server restart: the checkpoint "
                                    "holds DP accounting but the job's privacy settings keep "
                                    "none")
            privacy.ledger.steps = int(dp["steps"])
            privacy.ledger.spent = [float(e) for e in dp["spent"]]
        self.resumed_round = round_
        self.report({"event": "restored", "round": round_})
        log.info("resumed from the checkpoint of round %d", round_)
        return saved.get("workflow") or {}

    def close(self) -> None:
        """Flush the metrics files and draw the curves (the runner calls it at the end)."""
        self.settle_checkpoint()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


class BuiltinArgs:
    """A built-in workflow's ``Args`` (its model in fl/app_config.py), loaded on first use: the
    server worker runs a built-in workflow of a plain app.yaml without pydantic (its arguments
    as fl/app_config_plain.py's PlainArgs), while ``FedAvg.Args`` (a job's own
    ``class Args(FedAvg.Args)``, the docs, the tests) is still the model."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> type[BaseModel]:
        from atoll.fl import app_config

        return getattr(app_config, self.name)


class Workflow:
    """Base of every server-side workflow: subclass it and write ``run()``.

    ``Args``: an optional pydantic model; app.yaml's ``server.args`` are validated with it
    before ``run`` (each error naming ``server.args.<field>``) and ``self.args`` is the result.
    Without it ``self.args`` is the plain dict.
    """

    Args: ClassVar[type[BaseModel] | None] = None

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.args = ctx.args

    def run(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define run(self)")

    def state(self) -> dict[str, Any] | None:
        """What ``run`` needs to go on after the last completed round: a dict of numpy arrays
        and JSON-safe values. None (the default): this workflow keeps no checkpoint, and a job
        running it fails when the server restarts."""
        return None

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state()`` returned; ``run`` then starts at ``ctx.start_round``."""
        raise WorkflowError(f"{type(self).__name__} defines no restore(state): it cannot resume "
                            "after a server restart")

    def checkpoint(self, round: int) -> None:
        """Call after each completed round: ``state()`` is committed, atomically, as what the
        job resumes from if the server restarts."""
        state = self.state()
        if state is not None:
            self.ctx.checkpoint(round, state)

    @classmethod
    def resumable(cls) -> bool:
        """Whether the class keeps checkpoints (defines its own ``state``)."""
        return cls.state is not Workflow.state


def _random_state() -> dict[str, Any]:
    """Python's and numpy's global random state, for a workflow that draws from them."""
    import random

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, keys, int(pos), int(has_gauss), float(cached)]}


def _set_random_state(saved: dict[str, Any] | None) -> None:
    import random

    if not saved:
        return
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
