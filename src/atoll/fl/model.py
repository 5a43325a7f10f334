"""The model that travels between the server workflow and the sites: named arrays plus metadata.

A ``Model`` is what a training script receives (``fl.receive()``) and sends back (``fl.send()``),
and what a workflow aggregates. On the wire it is a safetensors document (``atoll.fl.serde``):
raw array buffers plus a JSON header, never pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

ParamsType = Literal["full", "diff"]
PARAMS_TYPES: tuple[str, ...] = ("full", "diff")


@dataclass
class Model:
    """Named numpy arrays and what a workflow needs to know about them.

    ``params_type`` says whether ``params`` are the weights themselves ("full") or the change a
    site made to the global weights it received ("diff"). ``num_examples`` weighs a site's result
    in FedAvg. ``metrics`` are plain floats (loss, accuracy...). ``round`` is the round this model
    belongs to. ``meta`` is free JSON-safe metadata; the runtime puts ``task`` ("train",
    "validate"...) and ``total_rounds`` there on models it hands to a training script.
    """

    params: dict[str, np.ndarray] = field(default_factory=dict)
    params_type: ParamsType = "full"
    num_examples: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    round: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.params_type not in PARAMS_TYPES:
            raise ValueError(
                f"Model.params_type must be 'full' or 'diff', got {self.params_type!r}"
            )
        if not isinstance(self.params, dict):
            raise TypeError(
                f"Model.params must be a dict of name -> numpy array, got {type(self.params).__name__}"
            )
        for name, value in list(self.params.items()):
            if not isinstance(name, str) or not name:
                raise TypeError(f"Model.params keys must be non-empty strings, got {name!r}")
            if isinstance(value, np.generic):  # arithmetic on a 0-d array gives a numpy scalar
                self.params[name] = value = np.asarray(value)
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"Model.params[{name!r}] must be a numpy array, got {type(value).__name__}; "
                    "convert a PyTorch state_dict with atoll.fl.torch_bridge.to_params()"
                )
        if isinstance(self.num_examples, bool) or not isinstance(
            self.num_examples, int | np.integer
        ):
            raise TypeError(f"Model.num_examples must be an int, got {self.num_examples!r}")
        if self.num_examples < 0:
            raise ValueError(f"Model.num_examples must be >= 0, got {self.num_examples}")
        self.num_examples = int(self.num_examples)
        self.metrics = _float_metrics(self.metrics)
        if self.round is not None and (
            isinstance(self.round, bool) or not isinstance(self.round, int)
        ):
            raise TypeError(f"Model.round must be an int or None, got {self.round!r}")
        try:
            json.dumps(self.meta)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"Model.meta must be JSON-serializable: {exc}") from None

    # FLModel-style names, so scripts written for NVIDIA FLARE's Client API read the same.
    @property
    def current_round(self) -> int | None:
        return self.round

    @property
    def total_rounds(self) -> int | None:
        value = self.meta.get("total_rounds")
        return int(value) if isinstance(value, int) else None

    @property
    def task(self) -> str | None:
        """The task this model came with ("train", "validate", ...), on received models."""
        value = self.meta.get("task")
        return value if isinstance(value, str) else None

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.params.values())


def _float_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise TypeError(f"Model.metrics must be a dict of name -> number, got {metrics!r}")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"Model.metrics keys must be strings, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            # A 0-d tensor or array: accept anything float() understands and that is a scalar.
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"Model.metrics[{name!r}] must be a number, got {type(value).__name__}"
                ) from None
        out[name] = float(value)
    return out
