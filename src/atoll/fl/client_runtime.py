"""The state behind ``atoll.client``: one site's channel, its current task, its datasets.

A site worker binds one ``ClientSession`` for the whole process before it runs the training
script (``atoll.fl.runner.run_site_app``); the simulator binds one per thread, so several
simulated sites can share a process. ``atoll.client`` finds the session bound to the calling
thread first, then the process-wide one.

A site that trains with several processes has one session per process; only rank 0's channel
reaches the parent, and each task reaches the other ranks through ``fl/distributed.py``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.fl.channels import SiteChannel, Task
from atoll.fl.distributed import Ranks, TaskBroadcast
from atoll.fl.metrics_log import LOGGED_KEY, MAX_LOGGED
from atoll.fl.model import Model
from atoll.fl.serde import ModelStream, encode
from atoll.fl.tracking import LOGGED, Record, Streamer
from atoll.spec import worker_env
from atoll.spec.errors import AtollError

if TYPE_CHECKING:  # made by the runner only when app.yaml has a privacy section
    from atoll.fl.privacy.site_privacy import SitePrivacy

TRAIN, VALIDATE = "train", "validate"
Evaluator = Callable[[Model], "dict[str, float] | Model"]


class ClientError(AtollError, RuntimeError):
    """The script used the client API out of order; the message says what to call instead."""


class ClientSession:
    def __init__(
        self,
        channel: SiteChannel,
        site: str,
        datasets: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        statistics_rules: dict[str, Any] | None = None,
        ranks: Ranks | None = None,
        tracking: Streamer | None = None,
        privacy: SitePrivacy | None = None,
    ):
        self.channel = channel
        # The site's rules for federated statistics (its local/study_runtime.yaml), or None:
        # atoll.fl.statistics applies them, with its defaults when the site set none.
        self.statistics_rules = dict(statistics_rules) if statistics_rules else None
        self.statistics_guard: Any = None  # the job's StatisticsGuard, made by its first serve()
        self.ranks = ranks or Ranks()
        self.broadcast = TaskBroadcast(self.ranks) if self.ranks.distributed else None
        self.tracking = tracking  # the site's own tracker (its MLFLOW_TRACKING_URI), if any
        # fl.log_metrics values not sent yet: they ride with the next training result, for the
        # job's metrics files and plot (the server worker writes those)
        self.logged: list[dict[str, Any]] = []
        # app.yaml's privacy section with the site's policy: filters, DP, secure aggregation
        self.privacy = privacy if privacy is not None and privacy.active else None
        if self.privacy is not None:  # its releases are accounted in the study's ledger
            self.privacy.spend = self.spend_budget
        self.site = site
        self.datasets = dict(datasets or {})
        self.config = dict(config or {})
        self.evaluator: Evaluator | None = None
        self.initialized = False
        self.finished = False
        self._task: Task | None = None  # received, not answered yet
        self._model: Model | None = None  # its decoded model
        # The arrays of the model last sent: the next model is decoded into them if the
        # script let go of them (fresh memory for a 1 GiB model costs seconds per round).
        self._spare: dict[str, Any] = {}

    # --- tasks --------------------------------------------------------------------------------

    def _fetch(self, timeout: float | None) -> bool:
        """Make sure a task is pending; False once the job is over."""
        while self._task is None:
            if self.finished:
                return False
            task = self._next_task(timeout)
            if task is None:
                self.finished = True
                return False
            spare = self._spare
            model = ModelStream(task.chunks).read(spare=spare)
            self._spare = {}
            round_ = task.headers.get("round")
            if self.privacy is not None and self.privacy.handles(task.topic):
                self._spare = spare  # the protocol's steps carry no arrays: kept for the task
                answer = self.privacy.answer(task.topic, round_ if isinstance(round_, int) else -1,
                                             model)
                self.channel.reply(task.task_id, {"topic": task.topic, "round": round_},
                                   encode(answer))
                continue
            if self.privacy is not None:
                model = self.privacy.on_task(
                    task.topic, round_ if isinstance(round_, int) else None, model)
            model.meta = {**model.meta, "task": task.topic}
            if model.round is None and isinstance(task.headers.get("round"), int):
                model.round = task.headers["round"]
            if "total_rounds" not in model.meta and isinstance(
                task.headers.get("total_rounds"), int
            ):
                model.meta["total_rounds"] = task.headers["total_rounds"]
            self._task, self._model = task, model
            if task.topic == VALIDATE and self.evaluator is not None:
                self.send(_as_result(self.evaluator(model)))
        return True

    def _next_task(self, timeout: float | None) -> Task | None:
        """Rank 0 asks the parent; with several ranks, every rank gets rank 0's answer."""
        task = self.channel.receive(timeout=timeout) if self.ranks.leader else None
        return self.broadcast.share(task) if self.broadcast is not None else task

    def is_running(self) -> bool:
        return self._fetch(timeout=None)

    def receive(self, timeout: float | None = None) -> Model | None:
        if not self._fetch(timeout):
            return None
        return self._model

    def send(self, model: Model) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"fl.send() takes an fl.Model, got {type(model).__name__}")
        if self._task is None:
            raise ClientError("fl.send() without a task to answer: call fl.receive() first")
        task = self._task
        if task.topic == TRAIN and not model.params:
            raise ClientError(
                "fl.send(): a train task needs the trained weights: "
                "fl.Model(params=..., num_examples=n, metrics={...})"
            )
        if task.topic == VALIDATE and model.params:
            # the server only reads metrics from an evaluation: do not ship the weights back
            model = Model(
                metrics=model.metrics,
                num_examples=model.num_examples,
                round=model.round,
                meta=model.meta,
            )
        if model.round is None and self._model is not None:
            model.round = self._model.round
        if task.topic == TRAIN and self.logged:
            model.meta = {**model.meta, LOGGED_KEY: self.logged[-MAX_LOGGED:]}
            self.logged = []
        if self.tracking is not None and model.metrics:
            self.tracking.log(Record(model.round, task.topic, self.site, dict(model.metrics)))
        headers = {"topic": task.topic, "round": task.headers.get("round")}
        self._task, self._model = None, None
        if self.ranks.leader:  # the other ranks only close the task: rank 0 answers for all
            outgoing = self.privacy.on_reply(task.topic, model) if self.privacy else model
            quantize = self.privacy.reply_quantization if self.privacy else None
            self.channel.reply(task.task_id, headers, encode(outgoing, quantize=quantize))
        self._spare = dict(model.params)

    @property
    def topic(self) -> str | None:
        if self._task is None and not self.finished:
            self._fetch(timeout=None)
        return self._task.topic if self._task is not None else None

    def spend_budget(self, kind: str, epsilon: float, delta: float) -> float:
        """Before releasing something a privacy budget covers: ask the study's ledger at the
        site parent to record the job's cumulative ``epsilon`` for ``kind`` (e.g. "dp") at
        ``delta``. Returns the study's total epsilon for ``kind`` at this site; raises
        ``atoll.fl.privacy.accounting.BudgetExhausted`` naming the ledger (site, study, kind,
        spent, budget) when the site's budget would be passed: then send nothing."""
        spend = getattr(self.channel, "spend_budget", None)
        if spend is None:
            from atoll.fl.privacy.accounting import BudgetExhausted

            raise BudgetExhausted(f"site {self.site}: this worker's channel keeps no privacy "
                                  "ledger; nothing a budget covers is released")
        return float(spend(kind, float(epsilon), float(delta)))

    # --- the site's resources -------------------------------------------------------------------

    def dataset_path(self, name: str) -> Path:
        mapped = dict(self.datasets)
        if not mapped and os.environ.get(worker_env.DATASETS):
            try:
                mapped = json.loads(os.environ[worker_env.DATASETS])
            except json.JSONDecodeError:
                raise ClientError(
                    "ATOLL_DATASETS is not valid JSON (set by the site's launcher)"
                ) from None
        if name in mapped:
            return Path(mapped[name])
        root = os.environ.get(worker_env.DATA_ROOT)
        if root and (Path(root) / name).exists():
            return Path(root) / name
        known = sorted(mapped) or (
            sorted(p.name for p in Path(root).iterdir()) if root and Path(root).is_dir() else []
        )
        raise ClientError(
            f"dataset {name!r} is not mapped for this job's study at site {self.site}; "
            f"mapped: {', '.join(known) or 'none'} (the site operator maps datasets in "
            "local/study_runtime.yaml under studies.<study>.datasets)"
        )

    def report(self, event: dict[str, Any]) -> None:
        if self.ranks.leader:
            self.channel.report({"site": self.site, **event})

    def log_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        """Live in the job's status and logs, in the site's tracker at once, and in the job's
        metrics files with the next training result."""
        round_ = self._model.round if self._model is not None else None
        self.report({"event": "site_metrics", "round": round_, "step": step, "metrics": metrics})
        self.logged.append({"round": round_, "step": step, "metrics": metrics})
        if self.tracking is not None:
            self.tracking.log(Record(round_, LOGGED, self.site, metrics, step=step))


def _as_result(value: Any) -> Model:
    if isinstance(value, Model):
        return value
    if isinstance(value, dict):
        return Model(metrics=value)
    raise TypeError(
        f"the evaluate function given to fl.init() must return a dict of metrics or an fl.Model, "
        f"got {type(value).__name__}"
    )


# --- binding ------------------------------------------------------------------------------------

_process_session: ClientSession | None = None
_thread = threading.local()


def bind(session: ClientSession, *, thread_only: bool = False) -> None:
    global _process_session
    if thread_only:
        _thread.session = session
    else:
        _process_session = session


def unbind(*, thread_only: bool = False) -> None:
    global _process_session
    if thread_only:
        _thread.session = None
    else:
        _process_session = None


def current() -> ClientSession:
    session = getattr(_thread, "session", None) or _process_session
    if session is None:
        raise ClientError(
            "atoll.client is not connected to a job: run this script as a job's site script "
            "(atoll job submit) or with atoll.fl.simulator.simulate()"
        )
    return session
