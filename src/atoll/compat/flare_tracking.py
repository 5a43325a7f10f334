"""FLARE's experiment-tracking writers (``nvflare.client.tracking``) on atoll's metrics.

``atoll job import-flare`` points ``from nvflare.client.tracking import SummaryWriter`` here.
Every number a writer gets is one ``fl.log_metrics`` value (``atoll.fl.tracking``): in the
job's status and metrics files, and in the experiment tracker the site's operator configured
(TensorBoard, MLflow). The job chooses no tracking server: in FLARE the server's receiver
does; in atoll the site's operator and the app's ``server.tracking`` do.

What is not a number (MLflow's params, tags and text, a Weights & Biases table) has no place in
atoll's metrics: it is dropped, with one warning per kind in the site's log.
"""

from __future__ import annotations

from typing import Any

from atoll.compat import flare_client as _flare
from atoll.compat.flare_client import AnalyticsDataType, LogWriterName

__all__ = ["AnalyticsDataType", "LogWriterName", "MLflowWriter", "SummaryWriter", "WandBWriter",
           "get_context", "init", "log", "shutdown"]


def init(rank: Any = None, config_file: str | None = None) -> None:
    """Nothing to start: the site worker sends the metrics."""


def shutdown(ctx: Any = None) -> None:
    """Nothing to stop."""


def get_context(ctx: Any = None) -> Any:
    """FLARE's tracking context: ``ctx`` when given; atoll's worker holds the one session."""
    return ctx


def log(key: str, value: Any, data_type: AnalyticsDataType, ctx: Any = None,
        **kwargs: Any) -> None:
    _flare.log(key, value, data_type, **kwargs)


class _Writer:
    def __init__(self, ctx: Any = None) -> None:
        pass  # FLARE's API context: atoll's worker holds the session


class SummaryWriter(_Writer):
    """TensorBoard's ``add_scalar``/``add_scalars``."""

    def add_scalar(self, tag: str, scalar: float, global_step: int | None = None,
                   **kwargs: Any) -> None:
        _flare.log(tag, scalar, AnalyticsDataType.SCALAR, global_step=global_step)

    def add_scalars(self, tag: str, scalars: dict, global_step: int | None = None,
                    **kwargs: Any) -> None:
        _flare.log(tag, scalars, AnalyticsDataType.SCALARS, global_step=global_step)

    def flush(self) -> None:
        """Records go out as they are logged."""


class WandBWriter(_Writer):
    """Weights & Biases' ``log(metrics, step)``."""

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        _flare.log("", metrics, AnalyticsDataType.METRICS, global_step=step)


class MLflowWriter(_Writer):
    """MLflow's ``log_metric(s)``; params, tags and text are dropped (not numbers)."""

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        _flare.log(key, value, AnalyticsDataType.METRIC, global_step=step)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        _flare.log("", metrics, AnalyticsDataType.METRICS, global_step=step)

    def log_param(self, key: str, value: Any) -> None:
        _flare.log(key, value, AnalyticsDataType.PARAMETER)

    def log_params(self, values: dict) -> None:
        _flare.log("", values, AnalyticsDataType.PARAMETERS)

    def log_text(self, text: str, artifact_file_path: str) -> None:
        _flare.log(artifact_file_path, text, AnalyticsDataType.TEXT)

    def set_tag(self, key: str, tag: Any) -> None:
        _flare.log(key, tag, AnalyticsDataType.TAG)

    def set_tags(self, tags: dict) -> None:
        _flare.log("", tags, AnalyticsDataType.TAGS)
