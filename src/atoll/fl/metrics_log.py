"""A job's metrics, stored with its results as they arrive.

One record per (round, phase, site): ``phase`` is ``train`` (what a site reported with its
result), ``validate`` (a site's evaluation of the new global model), or ``cross_site`` (the final
evaluation; ``model`` names what was evaluated). ``site`` is ``global`` for the example-weighted
mean over sites. Written to:

- ``metrics.jsonl``: one JSON object per record, flushed at once (follow it with ``tail -f``);
- ``metrics.csv``: long format ``round,phase,site,model,metric,value``, one row per metric;
- TensorBoard event files under ``tensorboard/`` when ``torch.utils.tensorboard`` works (the
  ``tensorboard`` package is installed); silently skipped otherwise;
- ``training_curves.png`` at ``close()`` (matplotlib, imported only then).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, results_dir: Path):
        self.results_dir = Path(results_dir)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []
        self._jsonl = open(self.results_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        csv_path = self.results_dir / "metrics.csv"
        new_csv = not csv_path.exists()
        self._csv_file = open(csv_path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = csv.writer(self._csv_file)
        if new_csv:
            self._csv.writerow(["round", "phase", "site", "model", "metric", "value"])
        self._tb = _tensorboard_writer(self.results_dir / "tensorboard")

    def record(
        self,
        round: int | None,
        phase: str,
        site: str,
        metrics: dict[str, float],
        num_examples: int = 0,
        model: str = "global",
    ) -> None:
        entry = {
            "round": round,
            "phase": phase,
            "site": site,
            "model": model,
            "num_examples": num_examples,
            "metrics": metrics,
        }
        self.records.append(entry)
        self._jsonl.write(json.dumps(entry) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            self._csv.writerow(["" if round is None else round, phase, site, model, name, value])
        self._csv_file.flush()
        if self._tb is not None and round is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(f"{phase}/{name}/{site}", value, round)

    def close(self, plot: bool = True) -> Path | None:
        """Close the files and draw the training curves; returns the PNG's path if drawn."""
        self._jsonl.close()
        self._csv_file.close()
        if self._tb is not None:
            self._tb.close()
        if not plot:
            return None
        from atoll.fl.plots import plot_training_curves

        path = self.results_dir / "training_curves.png"
        try:
            drawn = plot_training_curves(self.records, path)
        except ImportError as exc:
            log.warning("no training_curves.png: %s (install matplotlib)", exc)
            return None
        return path if drawn else None


def _tensorboard_writer(path: Path) -> Any:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return None  # checked first so that a server without tensorboard never imports torch
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # torch or tensorboard missing: event files are optional
        return None
    return SummaryWriter(log_dir=str(path))
