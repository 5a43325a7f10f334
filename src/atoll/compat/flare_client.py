"""NVIDIA FLARE's Client API on atoll: ``import atoll.compat.flare_client as flare``.

A training script written for ``nvflare.client`` runs unchanged but for that import line::

    import atoll.compat.flare_client as flare

    flare.init()
    while flare.is_running():
        input_model = flare.receive()              # FLModel: params, current_round, meta...
        model.load_state_dict(input_model.params)  # torch tensors when the job says pytorch
        ...
        flare.send(flare.FLModel(params=model.state_dict(), metrics={"accuracy": acc},
                                 meta={"NUM_STEPS_CURRENT_ROUND": steps}))

atoll installs nothing under FLARE's own name: a package called ``nvflare`` would shadow the
real one on a machine that has both.

How FLARE's terms map to atoll's (``atoll.client``):

- ``FLModel.params`` are numpy arrays, or CPU torch tensors when the site's config (app.yaml
  ``site.config``) says ``nvflare_params_exchange_format: pytorch`` (what ``atoll job
  import-flare`` writes for a PyTorch recipe); sent params may be either.
- ``params_type`` ``FULL``/``DIFF`` is atoll's ``full``/``diff``.
- A result's weight in FedAvg is ``meta["NUM_STEPS_CURRENT_ROUND"]`` (FLARE's aggregation
  weight), 1 when absent, as in FLARE.
- ``is_train()``, ``is_evaluate()`` and ``is_submit_model()`` read the task's topic (``train``,
  ``validate``, ``submit_model``).
- ``meta`` travels as JSON: values that are not JSON are dropped on send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import atoll.client as _atoll
from atoll.fl.model import Model

NUM_STEPS_CURRENT_ROUND = "NUM_STEPS_CURRENT_ROUND"
FORMAT_KEY = "nvflare_params_exchange_format"
SUBMIT_MODEL = "submit_model"

__all__ = [
    "FLModel", "ParamsType", "get_config", "get_job_id", "get_site_name", "init",
    "is_evaluate", "is_running", "is_submit_model", "is_train", "log", "receive", "send",
    "shutdown", "system_info",
]


class ParamsType(StrEnum):
    """FLARE's ``ParamsType``: the weights themselves, or their change."""

    FULL = "FULL"
    DIFF = "DIFF"


@dataclass
class FLModel:
    """FLARE's ``FLModel``, with its field names and defaults."""

    params_type: ParamsType | str | None = None
    params: dict[str, Any] | None = None
    optimizer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    start_round: int | None = 0
    current_round: int | None = None
    total_rounds: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.meta = dict(self.meta or {})


def init(rank: int | str | None = None, config_file: str | None = None) -> None:
    """Start the Client API (FLARE's arguments are accepted; atoll needs neither)."""
    _atoll.init()


def is_running() -> bool:
    return _atoll.is_running()


def receive(timeout: float | None = None) -> FLModel | None:
    """The current task's model; None once the job is over."""
    model = _atoll.receive(timeout)
    if model is None:
        return None
    params: dict[str, Any] = dict(model.params)
    if params and _exchange_format() == "pytorch":
        from atoll.fl.torch_bridge import to_state_dict

        params = to_state_dict(params)
    meta = {k: v for k, v in model.meta.items() if k not in ("task", "total_rounds")}
    return FLModel(
        params_type=ParamsType.DIFF if model.params_type == "diff" else ParamsType.FULL,
        params=params,
        metrics=dict(model.metrics) or None,
        # FLARE counts rounds from 0; atoll's users see them from 1
        current_round=model.round - 1 if isinstance(model.round, int) else None,
        total_rounds=model.total_rounds,
        meta=meta,
    )


def send(model: FLModel, clear_cache: bool = True) -> None:
    """Answer the current task with ``model``."""
    if not isinstance(model, FLModel):
        raise TypeError(f"flare.send() takes an FLModel, not {type(model).__name__}")
    _atoll.send(_to_atoll(model))


def _to_atoll(model: FLModel) -> Model:
    params = dict(model.params or {})
    if any(type(v).__module__.startswith("torch") for v in params.values()):
        from atoll.fl.torch_bridge import to_params

        params = to_params(params)
    kind = model.params_type.value if isinstance(model.params_type, ParamsType) else (
        model.params_type or "FULL")
    weight = model.meta.get(NUM_STEPS_CURRENT_ROUND, 1)
    weight = weight if isinstance(weight, int) and not isinstance(weight, bool) else 1
    return Model(
        params=params,
        params_type="diff" if str(kind).upper() == "DIFF" else "full",
        num_examples=max(weight, 0),
        metrics=dict(model.metrics or {}),
        round=model.current_round + 1 if isinstance(model.current_round, int) else None,
        meta=_json_safe(model.meta),
    )


def _json_safe(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in meta.items():
        try:
            json.dumps({str(key): value})
        except (TypeError, ValueError):
            continue  # FLARE lets any object ride in meta; atoll's wire carries JSON only
        out[str(key)] = value
    return out


def _exchange_format() -> str:
    return str(_atoll.job_args().get(FORMAT_KEY, "numpy"))


def is_train() -> bool:
    return _atoll.is_train()


def is_evaluate() -> bool:
    return _atoll.is_evaluate()


def is_submit_model() -> bool:
    return _atoll.task_name() == SUBMIT_MODEL


def get_site_name() -> str:
    return _atoll.site_name()


def get_job_id() -> str:
    return _atoll.job_id()


def system_info() -> dict[str, str]:
    """FLARE's ``system_info()``: the site's name and the job's id."""
    return {"site_name": get_site_name(), "job_id": get_job_id()}


def get_config() -> dict[str, Any]:
    """The site's settings for the script (app.yaml ``site.config``)."""
    return _atoll.job_args()


def log(key: str, value: Any, data_type: Any = None, **kwargs: Any) -> None:
    """A metric, sent to the job's status (numbers only; ``global_step`` is the step)."""
    step = kwargs.get("global_step")
    _atoll.log_metrics({key: value}, step=step if isinstance(step, int) else None)


def shutdown() -> None:
    """Nothing to release: the worker ends the script's session."""
