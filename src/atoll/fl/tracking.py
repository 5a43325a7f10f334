"""Experiment tracking: a job's metrics streamed to TensorBoard and MLflow as they are recorded.

Who tracks what, and who configures it:

- the **server worker**, as the job's app.yaml asks (``server.tracking``): every record the
  workflow makes (each site's and the global train and validation metrics, per round; the
  cross-site table) and the ``fl.log_metrics`` values each site sent with its results. MLflow
  gets one run per job (the global metrics) with a nested run per site.
- a **site worker**, when its site sets ``MLFLOW_TRACKING_URI`` (a token through
  ``secret_env``) or ``TENSORBOARD_LOGDIR`` for the study (``env`` in the site's
  ``local/study_runtime.yaml``): its own metrics, live, at every ``fl.log_metrics`` and
  ``fl.send``, in one MLflow run per site and job, or event files under
  ``<TENSORBOARD_LOGDIR>/<job id>/<site>``. The site's operator
  chooses the server and holds its credentials; the job never sees them in its payload.

Tracking never fails a job: a tracking server that cannot be reached costs one warning in the
worker's log, then that tracker goes quiet. Records go out from a background thread, so a slow
tracking server does not slow the rounds down.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from atoll.spec.errors import AtollError

log = logging.getLogger(__name__)

GLOBAL = "global"
LOGGED = "log"  # the phase of fl.log_metrics values
# A site's own TensorBoard folder, as its worker sees it (a study env variable the site sets;
# named after `tensorboard --logdir`: ATOLL_* names belong to the launcher)
TENSORBOARD_DIR_VAR = "TENSORBOARD_LOGDIR"


@dataclass(frozen=True)
class Record:
    """One set of metrics: of a site (or ``global``) in a round (1-based), in a phase."""

    round: int | None
    phase: str  # train | validate | cross_site | log
    site: str
    metrics: dict[str, float]
    model: str = GLOBAL
    step: int | None = None  # fl.log_metrics(step=...)
    timestamp: float = field(default_factory=time.time)

    def key(self, name: str) -> str:
        """The metric's name in a tracker: log values keep the name the script gave them."""
        if self.phase == LOGGED:
            return name
        if self.phase == "cross_site":
            return f"cross_site/{self.model}/{name}"
        return f"{self.phase}/{name}"

    def x(self) -> int:
        """Where on a curve: the round, or the script's own step for logged values."""
        if self.phase == LOGGED and self.step is not None:
            return self.step
        return self.round or 0


class Tracker(Protocol):
    def log(self, record: Record) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class TrackingError(AtollError, RuntimeError):
    """A tracker could not start (MLflow's package is missing); the message says what to
    install."""


# --- TensorBoard ----------------------------------------------------------------------------------


class TensorBoardTracker:
    """Event files under ``folder``: ``phase/metric/site`` scalars against the round, written
    by atoll's own writer (fl/tensorboard_events.py: no torch, no tensorboard import)."""

    def __init__(self, folder: Path):
        from atoll.fl.tensorboard_events import EventFileWriter

        self.writer = EventFileWriter(folder)

    def log(self, record: Record) -> None:
        if record.round is None and record.phase != LOGGED:
            return  # cross-site results have no round: they are in cross_site_eval.json
        self.writer.add_scalars({f"{record.key(name)}/{record.site}": value
                                 for name, value in record.metrics.items()},
                                record.x(), record.timestamp)
        self.writer.flush()  # live: TensorBoard shows the round as soon as it is recorded

    def close(self, failed: bool = False) -> None:
        self.writer.close()


def tensorboard_tracker(folder: Path, required: bool | None) -> TensorBoardTracker | None:
    """TensorBoard event files: ``required`` None writes them when the tensorboard package
    (which shows them) is installed, True always, False never."""
    import importlib.util

    if required is False:
        return None
    if required is None and importlib.util.find_spec("tensorboard") is None:
        return None
    return TensorBoardTracker(folder)


# --- MLflow -----------------------------------------------------------------------------------------


class MlflowTracker:
    """One MLflow run for the job, and a nested run per site (``per_site``), or one run in all.

    Uses MLflow's own client, so its environment variables work as documented
    (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``...)."""

    def __init__(self, uri: str, experiment: str, run_name: str, tags: dict[str, str],
                 per_site: bool):
        # a tracking server that is down must not hold the worker for minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise TrackingError("MLflow tracking is configured but the mlflow package is not "
                                "installed where this worker runs (pip install "
                                "'atoll[tracking]')") from None
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(experiment))
        self.tags = tags
        self.per_site = per_site
        self.run_id = self._start(run_name, {})
        self.site_runs: dict[str, str] = {}

    def _start(self, name: str, extra: dict[str, str]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={**self.tags, **extra})
        return run.info.run_id

    def _run_of(self, site: str) -> str:
        if not self.per_site or site == GLOBAL:
            return self.run_id
        if site not in self.site_runs:
            self.site_runs[site] = self._start(
                site, {"mlflow.parentRunId": self.run_id, "atoll.site": site})
        return self.site_runs[site]

    def log(self, record: Record) -> None:
        from mlflow.entities import Metric

        stamp = int(record.timestamp * 1000)
        metrics = [Metric(record.key(name), value, stamp, record.x())
                   for name, value in record.metrics.items()]
        if metrics:
            self.client.log_batch(self._run_of(record.site), metrics=metrics)

    def close(self, failed: bool = False) -> None:
        for run_id in [*self.site_runs.values(), self.run_id]:
            self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")


# --- streaming --------------------------------------------------------------------------------------


class Streamer:
    """Hands records to trackers from a background thread, in order; a tracker that raises is
    dropped with one warning. ``close()`` waits (bounded) for what is queued."""

    CLOSE_WAIT_S = 60.0

    def __init__(self, trackers: list[Tracker]):
        self.trackers = list(trackers)
        self._queue: queue.Queue[Record | None] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="atoll-tracking", daemon=True)
        if self.trackers:
            self._thread.start()

    def log(self, record: Record) -> None:
        if self.trackers:
            self._queue.put(record)

    def _drain(self) -> None:
        while (record := self._queue.get()) is not None:
            for tracker in list(self.trackers):
                try:
                    tracker.log(record)
                except Exception as exc:  # noqa: BLE001 - tracking must never fail the job
                    self._drop(tracker, exc)

    def _drop(self, tracker: Tracker, exc: BaseException) -> None:
        log.warning("experiment tracking to %s stopped: %s", type(tracker).__name__, exc)
        self.trackers.remove(tracker)

    def close(self, failed: bool = False) -> None:
        """Send what is queued, then end each tracker's runs (as failed when the job's part
        failed)."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(self.CLOSE_WAIT_S)
        for tracker in list(self.trackers):
            try:
                tracker.close(failed)
            except Exception as exc:  # noqa: BLE001
                self._drop(tracker, exc)


def start_mlflow(uri: str | None, experiment: str | None, run_name: str, tags: dict[str, str],
                 per_site: bool) -> MlflowTracker | None:
    """An MLflow tracker, or None (with a warning) when its server cannot be reached now."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        log.warning("MLflow tracking is configured without a server: set "
                    "server.tracking.mlflow.tracking_uri in app.yaml, or MLFLOW_TRACKING_URI")
        return None
    experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "atoll"
    try:
        return MlflowTracker(uri, experiment, run_name, tags, per_site)
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unreachable server must not fail the job
        log.warning("MLflow tracking to %s is off for this job: %s", uri, exc)
        return None


def server_streamer(config: Any, results_dir: Path, job: dict[str, Any]) -> Streamer:
    """The server worker's trackers, as app.yaml's ``server.tracking`` (``config``) asks."""
    trackers: list[Tracker] = []
    tensorboard = tensorboard_tracker(Path(results_dir) / "tensorboard",
                                      getattr(config, "tensorboard", None))
    if tensorboard is not None:
        trackers.append(tensorboard)
    mlflow = getattr(config, "mlflow", None)
    if mlflow is not None:
        name = str(job.get("name") or job.get("job_id") or "job")
        tracker = start_mlflow(mlflow.tracking_uri, mlflow.experiment or name,
                               f"{name} ({job.get('job_id', '')})".replace(" ()", ""),
                               {"atoll.job_id": str(job.get("job_id", "")), "atoll.job": name},
                               per_site=True)
        if tracker is not None:
            trackers.append(tracker)
    return Streamer(trackers)


def site_streamer(site: str, job_id: str) -> Streamer | None:
    """A site worker's trackers, as its site set them for the study (its env): MLflow when
    ``MLFLOW_TRACKING_URI`` is set, TensorBoard event files under ``TENSORBOARD_LOGDIR``."""
    trackers: list[Tracker] = []
    folder = os.environ.get(TENSORBOARD_DIR_VAR)
    if folder:
        try:
            tensorboard = tensorboard_tracker(Path(folder) / job_id / site, required=True)
        except OSError as exc:
            log.warning("TensorBoard tracking to %s is off for this job: %s", folder, exc)
        else:
            if tensorboard is not None:
                trackers.append(tensorboard)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            tracker = start_mlflow(None, None, f"{site} ({job_id})",
                                   {"atoll.job_id": job_id, "atoll.site": site}, per_site=False)
        except TrackingError as exc:
            log.warning("%s", exc)
        else:
            if tracker is not None:
                trackers.append(tracker)
    return Streamer(trackers) if trackers else None
