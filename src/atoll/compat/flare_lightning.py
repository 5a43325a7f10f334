"""NVIDIA FLARE's Lightning Client API on atoll: ``import atoll.compat.flare_lightning as flare``.

The import line ``import nvflare.client.lightning as flare`` is the one change a FLARE
Lightning script needs (``atoll job import-flare`` makes it)::

    trainer = Trainer(max_epochs=1)
    flare.patch(trainer)                    # adds atoll's FederatedCallback
    while flare.is_running():
        input_model = flare.receive()       # FLModel: current_round...
        trainer.validate(model, datamodule=dm)   # the global model: its metrics
        trainer.fit(model, datamodule=dm)        # global model in, trained weights out

``patch`` adds ``atoll.fl.lightning_callback``'s callback, of the trainer's own package
(``pytorch_lightning`` as in FLARE's examples, or ``lightning.pytorch``), with FLARE's
arguments: ``load_state_dict_strict`` is the ``strict`` of loading the global model,
``restore_state`` keeps the optimizers' and LR schedulers' state from one round's ``fit`` to
the next (FLARE's ``RestoreState``). As in FLARE, a result's weight in FedAvg is
``NUM_STEPS_CURRENT_ROUND`` (the optimizer steps of this round's ``fit`` unless the module's
``__fl_meta__`` dict sets it; FLARE's ``estimated_stepping_batches`` counts every round's), and ``__fl_meta__`` rides with the trained weights (JSON values
only). The rest of the module is ``atoll.compat.flare_client``: ``init``, ``receive``,
``send``, ``is_running``, ``get_site_name``... What differs from FLARE: a ``validate`` task
answered by ``trainer.validate`` (atoll's FedAvg evaluates each global model), so the next
``fit`` of the same loop waits for the next task, as FLARE's own callback does.
"""

from __future__ import annotations

from typing import Any

from atoll.compat import flare_client as _flare
from atoll.compat.flare_client import (  # FLARE's module re-exports them
    NUM_STEPS_CURRENT_ROUND,
    AnalyticsDataType,
    FLModel,
    ParamsType,
    _json_safe,
    get_config,
    get_job_id,
    get_site_name,
    get_task_name,
    init,
    is_evaluate,
    is_running,
    is_submit_model,
    is_train,
    log,
    receive,
    send,
    shutdown,
    system_info,
)
from atoll.fl.lightning_callback import FederatedHooks, add_to

try:  # FLARE's module is pytorch_lightning's; lightning.pytorch where that is all there is
    import pytorch_lightning as _pl
except ModuleNotFoundError:
    import lightning.pytorch as _pl

FL_META_KEY = "__fl_meta__"

__all__ = [
    "FL_META_KEY", "AnalyticsDataType", "FLCallback", "FLModel", "ParamsType", "get_config",
    "get_job_id", "get_site_name", "get_task_name", "init", "is_evaluate", "is_running",
    "is_submit_model", "is_train", "log", "logger", "patch", "receive", "send", "shutdown",
    "system_info",
]


class FlareHooks(FederatedHooks):
    """FLARE's weight and meta for a Lightning result."""

    def result_weight(self, trainer: Any, pl_module: Any) -> tuple[int, dict[str, Any]]:
        meta = getattr(pl_module, FL_META_KEY, None)
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise TypeError(f"{type(pl_module).__name__}.{FL_META_KEY} must be a dict, not "
                            f"{type(meta).__name__}")
        meta = dict(meta)
        meta.setdefault(NUM_STEPS_CURRENT_ROUND, int(trainer.global_step - self.start_step))
        weight = meta[NUM_STEPS_CURRENT_ROUND]
        weight = weight if isinstance(weight, int) and not isinstance(weight, bool) else 1
        return max(weight, 0), _json_safe(meta)


class FLCallback(FlareHooks, _pl.Callback):
    """FLARE's ``FLCallback``, for a trainer given it directly (``callbacks=[FLCallback()]``)
    rather than through ``patch``. ``update_fit_loop`` is accepted: atoll's callback always
    counts ``max_epochs`` per round, as FLARE's default ``True`` does."""

    def __init__(self, rank: int = 0, load_state_dict_strict: bool = True,
                 update_fit_loop: bool = True) -> None:
        init(rank=rank)
        super().__init__(strict=load_state_dict_strict)


class ClientLogger(_pl.loggers.Logger):
    """FLARE's Lightning ``logger`` (its ``ClientLogger``): the trainer's logged numbers become
    the site's metrics, each name after ``prefix`` and ``-``; hyperparameters are not
    recorded (they are not numbers over steps)."""

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self._prefix = prefix

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _flare.log("", {}, AnalyticsDataType.PARAMETERS)  # dropped, with its one warning

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._prefix:
            metrics = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}
        _flare.log("", dict(metrics), AnalyticsDataType.METRICS, global_step=step)

    @property
    def name(self) -> str:
        return "nvflare"

    @property
    def version(self) -> str:
        return "atoll"


logger = ClientLogger  # FLARE's module exports the class under this name


def patch(trainer: Any, restore_state: bool = True, load_state_dict_strict: bool = True) -> None:
    """FLARE's ``flare.patch(trainer)``: federate this Lightning trainer (once)."""
    add_to(trainer, FlareHooks, strict=load_state_dict_strict,
           keep_optimizer_state=restore_state)
