"""NVIDIA FLARE's Hugging Face Client API on atoll: ``import atoll.compat.flare_hf as flare``.

The import line ``import nvflare.client.hf as flare`` is the one change a FLARE Hugging Face
script needs (``atoll job import-flare`` makes it)::

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=valid)
    flare.patch(trainer)
    while flare.is_running():
        trainer.evaluate()   # the global model's metrics: a validate task's answer, or they
                             # ride with this round's training result
        trainer.train()      # global model in, trained weights out

``patch`` wraps the trainer's ``train`` and ``evaluate`` and adds atoll's
``FederatedTrainerCallback`` (``atoll.fl.hf_trainer``), with FLARE's arguments:

- ``params_scope``: ``"auto"`` exchanges a PEFT model's adapters and any other model whole,
  ``"model"`` the whole model, ``"adapter"`` the adapters;
- ``load_state_dict_strict`` is the ``strict`` of loading the global model;
- ``server_key_prefix`` is taken off the global model's names and put on the sent ones;
- ``local_steps`` / ``local_epochs``: each round's budget (else the trainer's own
  ``max_steps`` or ``num_train_epochs``);
- ``stream_metrics=True`` records the trainer's logged numbers as the site's metrics.

As in FLARE, a result's weight in FedAvg is ``NUM_STEPS_CURRENT_ROUND``: the round's optimizer
steps times the batch size, the gradient accumulation and the site's processes (or the
model's ``__fl_meta__``, which also rides with the weights as JSON); the result's metrics are
those of the ``evaluate()`` before ``train()``. The rest of the module is
``atoll.compat.flare_client``.

What differs from FLARE: ``restore_state`` is accepted, but each round's ``train()`` starts
its optimizer and learning-rate schedule afresh (FLARE resumes them from its own checkpoint
in ``output_dir``). One trainer is patched per process, as in FLARE.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import Trainer, TrainerCallback

import atoll.client as fl
from atoll.compat import flare_client as _flare
from atoll.compat.flare_client import (  # FLARE's module re-exports them
    NUM_STEPS_CURRENT_ROUND,
    AnalyticsDataType,
    FLModel,
    ParamsType,
    _json_safe,
    evaluate,
    get_config,
    get_job_id,
    get_site_name,
    get_task_name,
    init,
    is_evaluate,
    is_submit_model,
    is_train,
    log,
    receive,
    send,
    shutdown,
    system_info,
    train,
)
from atoll.fl.hf_trainer import FederatedTrainerCallback, _numbers

FL_META_KEY = "__fl_meta__"
SCOPES = {"auto": None, "model": False, "adapter": True}  # -> adapters_only

log_ = logging.getLogger(__name__)

__all__ = [
    "AnalyticsDataType", "FLModel", "ParamsType", "evaluate", "get_config", "get_job_id",
    "get_site_name", "get_task_name", "init", "is_evaluate", "is_running", "is_submit_model",
    "is_train", "log", "patch", "receive", "send", "shutdown", "system_info", "train",
]


class FlareTrainerCallback(FederatedTrainerCallback):
    """FLARE's names, weight and metrics for the callback's exchange."""

    def __init__(self, adapters_only: bool | None, strict: bool, key_prefix: str | None):
        super().__init__(adapters_only=adapters_only, strict=strict)
        self.key_prefix = key_prefix or ""
        self.pre_train_metrics: dict[str, float] | None = None

    def global_params(self) -> dict[str, Any]:
        params = super().global_params()
        if not self.key_prefix:
            return params
        return {k.removeprefix(self.key_prefix): v for k, v in params.items()}

    def params_of(self, model: Any) -> dict[str, Any]:
        return {f"{self.key_prefix}{k}": v for k, v in super().params_of(model).items()}

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None,
                     **kwargs: Any) -> None:
        self._training = False
        if not _flare.is_train():
            return
        meta = getattr(_unwrap(model), FL_META_KEY, None) or {}
        if not isinstance(meta, dict):
            raise TypeError(f"{FL_META_KEY} must be a dict, not {type(meta).__name__}")
        meta = dict(meta)
        # FLARE's weight: the examples this round's steps saw, over every process of the site
        meta.setdefault(NUM_STEPS_CURRENT_ROUND, int(state.global_step)
                        * int(args.per_device_train_batch_size or 1)
                        * int(args.gradient_accumulation_steps or 1) * fl.world_size())
        _flare.send(FLModel(params=self.params_of(model), metrics=self.pre_train_metrics,
                            meta=_json_safe(meta)))

    def on_evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The wrapped ``evaluate()`` answers: evaluations inside ``train()`` answer nothing."""


class _MetricsStream(TrainerCallback):
    """``stream_metrics=True``: the trainer's logged numbers, as the site's metrics."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        numbers = _numbers(logs or {})
        if numbers:
            _flare.log("", numbers, AnalyticsDataType.METRICS, global_step=state.global_step)


class _Patched:
    """The patched trainer's task: which task it holds, and whether it has been answered."""

    def __init__(self, trainer: Any, callback: FlareTrainerCallback, local_steps: int | None,
                 local_epochs: float | None):
        self.trainer = trainer
        self.callback = callback
        self.local_steps = local_steps
        self.local_epochs = local_epochs
        self.original_train = trainer.train
        self.original_evaluate = trainer.evaluate
        self.open = False  # a task received and not yet answered
        self.answered = False  # this loop turn's task is answered: further calls do nothing

    def _task(self, call: str) -> str | None:
        if self.answered:
            log_.info("trainer.%s(): this round's task is already answered", call)
            return None
        if _flare.receive() is None:  # the job is over
            return None
        self.open = True
        return _flare.get_task_name()

    def _done(self) -> None:
        self.open, self.answered = False, True

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        if self.callback._training:  # evaluation during train(): the trainer's own
            return self.original_evaluate(*args, **kwargs)
        task = self._task("evaluate")
        if task is None:
            return None
        if task == _flare.SUBMIT_MODEL:
            return self._submit()
        self.callback.load(self.trainer.model)
        result = self.original_evaluate(*args, **kwargs)
        metrics = _numbers(result or {})
        if task == "train":
            self.callback.pre_train_metrics = metrics
        else:  # a validate task: its answer
            _flare.send(FLModel(metrics=metrics))
            self._done()
        return result

    def train(self, *args: Any, **kwargs: Any) -> Any:
        task = self._task("train")
        if task is None:
            return None
        if task == _flare.SUBMIT_MODEL:
            return self._submit()
        if task != "train":
            log_.info("trainer.train(): a %s task; trainer.evaluate() answers it", task)
            return None
        if self.local_steps is not None:
            self.trainer.args.max_steps = int(self.local_steps)
        elif self.local_epochs is not None:
            self.trainer.args.max_steps = -1
            self.trainer.args.num_train_epochs = float(self.local_epochs)
        try:
            result = self.original_train(*args, **kwargs)  # the callback sends at train end
        finally:
            self.callback.pre_train_metrics = None
        self._done()
        return result

    def _submit(self) -> None:
        _flare.send(FLModel(params=self.callback.params_of(self.trainer.model),
                            meta={NUM_STEPS_CURRENT_ROUND: 0}))
        self._done()


# the patched trainer of each site: `job simulate` runs every site in one process
_patched: dict[str, _Patched] = {}


def patch(trainer: Any, restore_state: bool = True, load_state_dict_strict: bool = True,
          params_scope: str = "auto", server_key_prefix: str | None = None,
          local_epochs: float | None = None, local_steps: int | None = None,
          stream_metrics: bool = False) -> Any:
    """FLARE's ``flare.patch(trainer)``: federate this Hugging Face Trainer; returns it."""
    if not isinstance(trainer, Trainer):
        raise TypeError(f"flare.patch() takes a transformers.Trainer, not {type(trainer).__name__}")
    _flare.init()
    site = get_site_name()
    if site in _patched:
        if _patched[site].trainer is trainer:
            return trainer
        raise RuntimeError("flare.patch(): one patched Hugging Face Trainer per process")
    if params_scope not in SCOPES:
        raise ValueError(f"flare.patch(): params_scope must be one of {', '.join(SCOPES)}, "
                         f"not {params_scope!r}")
    if local_epochs is not None and local_steps is not None:
        raise ValueError("flare.patch(): give local_epochs or local_steps, not both")
    if getattr(trainer.args, "load_best_model_at_end", False):
        raise ValueError("flare.patch(): load_best_model_at_end=True would replace this round's "
                         "trained weights; turn it off for federated training")
    callback = FlareTrainerCallback(SCOPES[params_scope], load_state_dict_strict,
                                    server_key_prefix)
    trainer.add_callback(callback)
    if stream_metrics:
        trainer.add_callback(_MetricsStream())
    patched = _patched[site] = _Patched(trainer, callback, local_steps, local_epochs)
    trainer.train, trainer.evaluate = patched.train, patched.evaluate
    return trainer


def is_running() -> bool:
    """FLARE's HF ``is_running()``: the next task, once the patched trainer answered the last."""
    patched = _patched.get(get_site_name())
    if patched is not None:
        if patched.open:
            raise RuntimeError("flare.is_running(): the current task is not answered yet; call "
                               "trainer.train() (a train task) or trainer.evaluate() before the "
                               "next flare.is_running()")
        patched.answered = False
    return _flare.is_running()


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)  # DDP wraps the model
