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
- ``log()`` and the writers of ``atoll.compat.flare_tracking`` (FLARE's
  ``nvflare.client.tracking``) record numbers with ``fl.log_metrics``: in the job's status and
  metrics files and the site's experiment tracker. Text, parameters and tags have no place in
  atoll's metrics and are dropped (one warning per kind).
- ``ctx=`` is accepted wherever FLARE's functions take it (FLARE's ``APIContext``): a site
  worker runs one script session, so there is one context and the argument is not read.
- The ``@train``/``@evaluate`` decorators behave as FLARE's: the first argument is the received
  model; ``@evaluate``'s metrics ride with the next ``@train`` result, or answer a validate
  task on their own.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

import atoll.client as _atoll
from atoll.compat.flare_constants import FLMetaKey, FLModelConst, MetaKey
from atoll.fl.model import Model

NUM_STEPS_CURRENT_ROUND = "NUM_STEPS_CURRENT_ROUND"
FORMAT_KEY = "nvflare_params_exchange_format"
SUBMIT_MODEL = "submit_model"

log_ = logging.getLogger(__name__)

__all__ = [
    "AnalyticsDataType", "FLMetaKey", "FLModel", "FLModelConst", "LogWriterName", "MetaKey",
    "ParamsType", "clear", "evaluate", "get_config", "get_context", "get_job_id",
    "get_site_name", "get_task_name", "init", "is_evaluate", "is_running", "is_submit_model",
    "is_train", "log", "receive", "send", "shutdown", "system_info", "train",
]


class AnalyticsDataType(Enum):
    """FLARE's kinds of tracked data (``nvflare.apis.analytix``); atoll records the numbers."""

    SCALARS = "SCALARS"
    SCALAR = "SCALAR"
    IMAGE = "IMAGE"
    TEXT = "TEXT"
    LOG_RECORD = "LOG_RECORD"
    PARAMETER = "PARAMETER"
    PARAMETERS = "PARAMETERS"
    METRIC = "METRIC"
    METRICS = "METRICS"
    MODEL = "MODEL"
    TAG = "TAG"
    TAGS = "TAGS"
    INIT_DATA = "INIT_DATA"


class LogWriterName(Enum):
    """FLARE's tracking back ends, named in ``flare.log(..., writer=)``; atoll's site decides
    where numbers go, so the argument is not read."""

    TORCH_TB = "TORCH_TENSORBOARD"
    MLFLOW = "MLFLOW"
    WANDB = "WEIGHTS_AND_BIASES"


NUMBER_KINDS = {"SCALAR", "METRIC"}
MAPPING_KINDS = {"SCALARS", "METRICS"}


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


def get_context(ctx: Any = None) -> Any:
    """FLARE's ``APIContext``: ``ctx`` when given. A site worker runs one script session, so
    atoll needs no context object; every function accepts ``ctx=`` and does not read it."""
    return ctx


def clear(ctx: Any = None) -> None:
    """FLARE's ``clear()`` of its received-model cache: atoll keeps no copy to clear."""


def init(rank: int | str | None = None, config_file: str | None = None) -> None:
    """Start the Client API (FLARE's arguments are accepted; atoll needs neither)."""
    _atoll.init()


def is_running(ctx: Any = None) -> bool:
    return _atoll.is_running()


def receive(timeout: float | None = None, ctx: Any = None) -> FLModel | None:
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


def send(model: FLModel, clear_cache: bool = True, ctx: Any = None) -> None:
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


def is_train(ctx: Any = None) -> bool:
    return _atoll.is_train()


def is_evaluate(ctx: Any = None) -> bool:
    return _atoll.is_evaluate()


def is_submit_model(ctx: Any = None) -> bool:
    return _atoll.task_name() == SUBMIT_MODEL


def get_site_name(ctx: Any = None) -> str:
    return _atoll.site_name()


def get_job_id(ctx: Any = None) -> str:
    return _atoll.job_id()


def system_info(ctx: Any = None) -> dict[str, str]:
    """FLARE's ``system_info()``: the site's name and the job's id."""
    return {"site_name": get_site_name(), "job_id": get_job_id()}


def get_config(ctx: Any = None) -> dict[str, Any]:
    """The site's settings for the script (app.yaml ``site.config``)."""
    return _atoll.job_args()


def get_task_name(ctx: Any = None) -> str | None:
    """The current task's name: ``train``, ``validate`` or ``submit_model``."""
    return _atoll.task_name()


_dropped: set[str] = set()


def log(key: str, value: Any, data_type: AnalyticsDataType | str | None = None,
        ctx: Any = None, **kwargs: Any) -> None:
    """FLARE's ``flare.log``: numbers (SCALAR/METRIC, or a mapping for SCALARS/METRICS) become
    ``fl.log_metrics`` values; ``global_step`` or ``step`` is the step. Other kinds are
    dropped with one warning per kind: atoll's metrics are numbers."""
    kind = data_type.value if isinstance(data_type, AnalyticsDataType) else str(
        data_type or "SCALAR").upper()
    step = kwargs.get("global_step", kwargs.get("step"))
    if kind in MAPPING_KINDS and isinstance(value, dict):
        values = {f"{key}/{k}" if kind == "SCALARS" and key else str(k): v
                  for k, v in value.items()}
    elif kind in NUMBER_KINDS:
        values = {key: value}
    else:
        _drop(kind)
        return
    numeric = {k: float(v) for k, v in values.items()
               if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    if len(numeric) < len(values):
        _drop("non-numeric " + kind)
    if numeric:
        _atoll.log_metrics(numeric, step=int(step) if isinstance(step, numbers.Integral)
                           and not isinstance(step, bool) else None)


def _drop(kind: str) -> None:
    if kind not in _dropped:
        _dropped.add(kind)
        log_.warning("flare.log: %s values are not recorded (atoll tracks numbers only)", kind)


# @evaluate's metrics waiting for @train, per site: `job simulate` runs every site in one process
_held: dict[str, Any] = {}


def _first_argument(fn: Callable, kwargs: dict[str, Any], model: FLModel | None) -> None:
    first = next(iter(inspect.signature(fn).parameters.values()))
    kwargs[first.name] = model


def train(_func: Callable | None = None, **_options: Any) -> Callable:
    """FLARE's ``@flare.train``: receives the model into the first argument and sends the
    FLModel the function returns."""
    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> FLModel:
            _first_argument(fn, kwargs, receive())
            result = fn(**kwargs)
            if not isinstance(result, FLModel):
                raise TypeError(f"@flare.train: {fn.__name__} must return an FLModel, not "
                                f"{type(result).__name__}")
            held = _held.pop(get_site_name(), None)
            if held is not None:
                result.metrics = held
            send(result)
            return result
        return wrapper
    return decorator if _func is None else decorator(_func)


def evaluate(_func: Callable | None = None, **_options: Any) -> Callable:
    """FLARE's ``@flare.evaluate``: receives the model into the first argument; the metrics
    returned answer a validate task, or ride with the next ``@flare.train`` result."""
    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _first_argument(fn, kwargs, receive())
            result = fn(**kwargs)
            if result is None:
                raise TypeError(f"@flare.evaluate: {fn.__name__} returned None, not metrics")
            if is_train():
                _held[get_site_name()] = result
            else:
                send(FLModel(metrics=result))
            return result
        return wrapper
    return decorator if _func is None else decorator(_func)


def shutdown(ctx: Any = None) -> None:
    """Nothing to release: the worker ends the script's session."""
