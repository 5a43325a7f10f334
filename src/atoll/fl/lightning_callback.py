"""A Lightning ``Trainer`` in a federated job: ``FederatedCallback`` does the exchange.

```python
import lightning.pytorch as L
import atoll.client as fl
from atoll.fl.lightning_callback import FederatedCallback

trainer = L.Trainer(max_epochs=2, callbacks=[FederatedCallback()])
fl.init()
while fl.is_running():
    fl.receive()
    if fl.is_evaluate():
        trainer.validate(module, val_loader)        # the global model's metrics go back
    else:
        trainer.fit(module, train_loader, val_loader)  # global model in, trained weights out
```

What the callback does, by hook:

- ``trainer.fit``: at train start the task's global model is loaded into the LightningModule
  (nothing in the first round of a job without an initial model); at train end the module's
  weights go back with the trainer's ``callback_metrics`` (numbers only) and the number of
  training examples (the length of the train dataloader's dataset, or ``num_examples=``).
  Then the trainer is set up for the next round: ``max_epochs`` (and ``max_steps``) count per
  round, as in one ``fit`` of a local run, and the sanity check runs only in the first round.
- ``trainer.validate`` in a ``validate`` task: the global model is loaded at validation start
  and the metrics answer the task at validation end, with the validation set's size. In a
  ``train`` task, ``validate`` evaluates the global model and answers nothing: its metrics
  ride with the trained weights (under their names, where fit's own do not override them).
  Validation inside ``fit`` (the val loop, the sanity check) never answers a task.

**Several processes per site.** When the job asks for ranks (``launcher_spec``
``processes_per_node``, docs/distributed.md), the launcher starts them all and every one runs
the script. ``L.Trainer(**trainer_args(), ...)`` makes Lightning train on them with DDP: it
neither starts processes of its own nor creates the process group (atoll's rendezvous does, on
the job's own address), and it shards the data by atoll's ranks. Every rank runs the same
hooks: ``fl.receive()`` gives every rank the model, ``fl.send()`` answers from rank 0 only. In
one process ``trainer_args()`` is ``{"devices": 1}``: a process that sees several GPUs still
trains as one, as a script not written for ranks expects.

The hooks live in a plain mixin: ``FederatedCallback`` is a ``lightning.pytorch`` callback,
and ``callback_for(trainer)`` gives one of the trainer's own package (``pytorch_lightning``,
which FLARE's examples import, is a separate class tree). Site workers only import this.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy

import atoll.client as fl
from atoll.fl.client_runtime import current
from atoll.fl.distributed import Ranks
from atoll.fl.torch_bridge import device, load_params, to_params


def trainer_args() -> dict[str, Any]:
    """``Trainer`` arguments that train on this site's processes: ``{"devices": 1}`` in one
    process; with several, DDP over the ranks the launcher started, ``num_nodes`` theirs, each
    process on its own device (its one GPU, or the CPU). Lightning finds the process group that
    ``fl.init()`` joined on atoll's rendezvous and creates none of its own."""
    ranks = current().ranks
    if not ranks.distributed:
        return {"devices": 1}
    # Each rank sees only its own GPU (as cuda:0), so every local rank's device is this one.
    strategy = DDPStrategy(cluster_environment=SiteRanks(ranks),
                           parallel_devices=[device()] * ranks.local_world_size)
    return {"strategy": strategy, "num_nodes": ranks.world_size // ranks.local_world_size}


class SiteRanks(ClusterEnvironment):
    """The site's ranks as its launcher numbered them, for Lightning: the processes exist
    already and Lightning's own arithmetic of ranks is not used."""

    def __init__(self, ranks: Ranks) -> None:
        self._ranks = ranks

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return False  # only where trainer_args() passes it

    def world_size(self) -> int:
        return self._ranks.world_size

    def set_world_size(self, size: int) -> None:
        pass  # the launcher's count stands

    def global_rank(self) -> int:
        return self._ranks.rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self._ranks.local_rank

    def node_rank(self) -> int:
        return self._ranks.rank // self._ranks.local_world_size


class FederatedHooks:
    """The federated exchange as Lightning hooks; mixed into a Callback class of either package."""

    def __init__(self, num_examples: int | None = None, strict: bool = True,
                 keep_optimizer_state: bool = False) -> None:
        super().__init__()
        self.num_examples = num_examples
        self.strict = strict
        # Lightning makes new optimizers at every fit(); keep their state across rounds?
        self.keep_optimizer_state = keep_optimizer_state
        self._optimizer_states: list[dict] = []
        self._scheduler_states: list[dict] = []
        self._epochs_per_round: int | None = None
        self._steps_per_round: int | None = None
        self._global_metrics: dict[str, float] = {}
        self.start_step = 0  # the trainer's global step when this round's fit began

    # --- fit ------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._epochs_per_round is None and self._steps_per_round is None:
            self._epochs_per_round = _positive(trainer.max_epochs)
            self._steps_per_round = _positive(trainer.max_steps)
        self.start_step = trainer.global_step
        self._load(pl_module)
        if self.keep_optimizer_state:
            for optimizer, state in zip(trainer.optimizers, self._optimizer_states, strict=False):
                optimizer.load_state_dict(state)
            configs = trainer.lr_scheduler_configs
            for config, state in zip(configs, self._scheduler_states, strict=False):
                config.scheduler.load_state_dict(state)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if fl.is_train():
            metrics = {**self._global_metrics, **_numbers(trainer.callback_metrics)}
            count, meta = self.result_weight(trainer, pl_module)
            fl.send(fl.Model(params=to_params(pl_module), num_examples=count, metrics=metrics,
                             meta=meta))
        if self.keep_optimizer_state:
            self._optimizer_states = [o.state_dict() for o in trainer.optimizers]
            self._scheduler_states = [c.scheduler.state_dict()
                                      for c in trainer.lr_scheduler_configs]
        self._global_metrics = {}
        self._next_round(trainer)

    def result_weight(self, trainer: Any, pl_module: Any) -> tuple[int, dict[str, Any]]:
        """The result's weight in FedAvg and its meta: the training examples, no meta."""
        if self.num_examples is not None:
            return self.num_examples, {}
        return _dataset_size(trainer.train_dataloader, fallback=trainer.global_step), {}

    def _next_round(self, trainer: Any) -> None:
        """Let the next ``fit`` train as much as this one did (Lightning counts epochs and steps
        over the trainer's life, so a second ``fit`` would stop at once)."""
        trainer.num_sanity_val_steps = 0
        if self._epochs_per_round is not None:
            trainer.fit_loop.max_epochs = trainer.current_epoch + self._epochs_per_round
        if self._steps_per_round is not None:
            trainer.fit_loop.epoch_loop.max_steps = trainer.global_step + self._steps_per_round

    # --- validate -------------------------------------------------------------------------
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if _validating(trainer):
            self._load(pl_module)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not _validating(trainer):
            return
        metrics = _numbers(trainer.callback_metrics)
        if fl.is_evaluate():
            count = self.num_examples if self.num_examples is not None else _dataset_size(
                trainer.val_dataloaders, fallback=1)
            fl.send(fl.Model(metrics=metrics, num_examples=count))
        elif fl.is_train():
            self._global_metrics = metrics  # the global model's: they ride with the result

    def _load(self, pl_module: Any) -> None:
        model = fl.receive()  # the current task's (the same one until it is answered)
        if model is not None and model.params:
            load_params(pl_module, model.params, strict=self.strict)


class FederatedCallback(FederatedHooks, pl.Callback):
    """Receive the global model before ``fit``/``validate``, send the result after."""


def callback_for(trainer: Any, hooks: type[FederatedHooks] = FederatedHooks,
                 **options: Any) -> FederatedHooks:
    """A federated callback (``hooks``) of the package ``trainer`` comes from
    (``lightning.pytorch`` or ``pytorch_lightning``)."""
    if type(trainer).__module__.split(".")[0] == "pytorch_lightning":
        import pytorch_lightning

        base: type = pytorch_lightning.Callback
    else:
        base = pl.Callback
    if hooks is FederatedHooks and base is pl.Callback:
        return FederatedCallback(**options)
    return type("FederatedCallback", (hooks, base), {})(**options)


def add_to(trainer: Any, hooks: type[FederatedHooks] = FederatedHooks,
           **options: Any) -> FederatedHooks:
    """Give ``trainer`` a federated callback unless it has one; return it."""
    callbacks = trainer.callbacks if isinstance(trainer.callbacks, list) else []
    for callback in callbacks:
        if isinstance(callback, FederatedHooks):
            return callback
    callback = callback_for(trainer, hooks, **options)
    callbacks.append(callback)
    trainer.callbacks = callbacks
    return callback


def _validating(trainer: Any) -> bool:
    """True in ``trainer.validate()``: not in fit's val loop nor its sanity check."""
    return not trainer.sanity_checking and str(getattr(trainer.state.fn, "value", "")) == "validate"


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalar metrics as floats (Lightning keeps them as 0-d tensors)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if hasattr(value, "numel") and value.numel() == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out


def _dataset_size(loaders: Any, fallback: int) -> int:
    """How many examples the loader(s) hold, where their datasets say so."""
    if loaders is None:
        return max(int(fallback), 1)
    items = loaders if isinstance(loaders, list | tuple) else [loaders]
    total = 0
    for loader in items:
        dataset = getattr(loader, "dataset", None)
        try:
            total += len(dataset)  # type: ignore[arg-type]
        except TypeError:
            return max(int(fallback), 1)
    return total or max(int(fallback), 1)
