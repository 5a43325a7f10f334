"""A Hugging Face ``Trainer`` in a federated job: ``FederatedTrainerCallback`` does the exchange.

```python
from transformers import Trainer
import atoll.client as fl
from atoll.fl.hf_trainer import FederatedTrainerCallback

federated = FederatedTrainerCallback()
trainer = Trainer(model, args, train_dataset=train, eval_dataset=val, callbacks=[federated])
fl.init()
while fl.is_running():
    fl.receive()
    if fl.is_evaluate():
        federated.load(trainer.model)   # the global model; evaluate() sends its metrics
        trainer.evaluate()
    else:
        trainer.train()                 # global model in, trained weights out
```

- ``trainer.train()`` in a ``train`` task: at train begin the task's global model is loaded into
  the model (nothing in the first round of a job without an initial model); at train end its
  weights go back with the last logged ``loss`` and the metrics of the last evaluation, and the
  number of training examples (the train dataset's length, or ``num_examples=``). Each
  ``train()`` starts a fresh optimizer and schedule: ``num_train_epochs`` counts per round.
- ``trainer.evaluate()`` in a ``validate`` task answers it with the metrics (``eval_loss``...)
  and the evaluation set's size. Evaluation during training answers nothing.
- A PEFT model (LoRA...) exchanges its adapter weights only
  (``peft.get_peft_model_state_dict``): the frozen base model never leaves the site, and every
  site must build the same base (the same pretrained checkpoint). ``adapters_only=False``
  sends the whole model.

With several processes per site every rank runs the hooks; ``fl.send()`` answers from rank 0.
Site workers only import this module.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

import atoll.client as fl
from atoll.fl.torch_bridge import to_params, to_state_dict


class FederatedTrainerCallback(TrainerCallback):
    """Receive the global model before ``train()``, send the result after."""

    def __init__(self, num_examples: int | None = None, adapters_only: bool | None = None,
                 strict: bool = True):
        self.num_examples = num_examples
        self.adapters_only = adapters_only  # None: True for a PEFT model
        self.strict = strict  # of load_state_dict, for a whole model
        self._training = False
        self._eval_metrics: dict[str, float] = {}

    # --- the model's weights <-> the exchanged params --------------------------------------
    def _adapters(self, model: Any) -> bool:
        if self.adapters_only is not None:
            return self.adapters_only
        return _is_peft(model)

    def params_of(self, model: Any) -> dict[str, Any]:
        """What this site sends: the adapters of a PEFT model, else the whole state_dict."""
        if self._adapters(model):
            from peft import get_peft_model_state_dict

            return to_params(get_peft_model_state_dict(model))
        return to_params(model.state_dict())

    def global_params(self) -> dict[str, Any]:
        """The current task's global model as exchanged (empty without one)."""
        received = fl.receive()
        return dict(received.params) if received is not None else {}

    def load(self, model: Any) -> None:
        """Load the current task's global model into ``model`` (no-op without params)."""
        params = self.global_params()
        if not params:
            return
        state = to_state_dict(params)
        if self._adapters(model):
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(model, state)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            if unexpected:
                raise fl.ClientError(f"the global model has weights this model lacks: "
                                     f"{', '.join(sorted(unexpected)[:5])}")
        else:
            model.load_state_dict(state, strict=self.strict)

    # --- TrainerCallback hooks -------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self._training = True
        self._eval_metrics = {}
        self.load(model)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None,
                     train_dataloader: Any = None, **kwargs: Any) -> None:
        self._training = False
        if not fl.is_train():
            return
        metrics = dict(self._eval_metrics)
        for entry in state.log_history:  # the last training loss logged
            if "loss" in entry:
                metrics["loss"] = float(entry["loss"])
        count = self.num_examples if self.num_examples is not None else _size(
            train_dataloader, fallback=max(state.global_step, 1))
        fl.send(fl.Model(params=self.params_of(model), num_examples=count, metrics=metrics))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    eval_dataloader: Any = None, **kwargs: Any) -> None:
        numbers_ = _numbers(metrics or {})
        if self._training:
            self._eval_metrics = numbers_
            return
        if fl.is_evaluate():
            count = self.num_examples if self.num_examples is not None else _size(
                eval_dataloader, fallback=1)
            fl.send(fl.Model(metrics=numbers_, num_examples=count))


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ModuleNotFoundError:  # peft not installed: no model can be a PEFT one
        return False
    return isinstance(model, PeftModel)


# Trainer's timings and its epoch counter: about the run, not the model
_NOT_METRICS = ("_runtime", "_per_second", "epoch")


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in metrics.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool)
            and not str(k).endswith(_NOT_METRICS)}


def _size(loader: Any, fallback: int) -> int:
    try:
        return len(loader.dataset) or fallback
    except (AttributeError, TypeError):
        return fallback
