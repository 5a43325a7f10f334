"""A job's metrics, stored with its results as they arrive.

One record per (round, phase, site): ``phase`` is ``train`` (what a site reported with its
result), ``validate`` (a site's evaluation of the new global model), ``cross_site`` (the final
evaluation; ``model`` names what was evaluated) or ``log`` (what a site script passed to
``fl.log_metrics``, with its ``step``). ``site`` is ``global`` for the example-weighted mean over
sites. Rounds count from 1, as everywhere users see them. Written to:

- ``metrics.jsonl``: one JSON object per record, flushed at once (follow it with ``tail -f``);
- ``metrics.csv``: long format ``round,phase,site,model,metric,value,step``, one row per metric;
- the job's experiment trackers (``atoll.fl.tracking``: TensorBoard event files under
  ``tensorboard/``, MLflow), as app.yaml's ``server.tracking`` asks;
- ``training_curves.png`` at ``close()`` (matplotlib, imported only then).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from atoll.fl.tracking import LOGGED, Record, Streamer, server_streamer

log = logging.getLogger(__name__)

LOGGED_KEY = "logged_metrics"  # where a site's fl.log_metrics values ride with its result
MAX_LOGGED = 10_000  # per result: a script logging every batch must not grow a model's header


class MetricsLog:
    def __init__(self, results_dir: Path, job_args: dict[str, Any] | None = None):
        """``job_args``: the job's settings from the runner (``tracking``, ``name``, ``job_id``)."""
        job_args = job_args or {}
        self.results_dir = Path(results_dir)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []
        self._jsonl = open(self.results_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        csv_path = self.results_dir / "metrics.csv"
        new_csv = not csv_path.exists()
        self._csv_file = open(csv_path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = csv.writer(self._csv_file)
        if new_csv:
            self._csv.writerow(["round", "phase", "site", "model", "metric", "value", "step"])
        self._tracking: Streamer = server_streamer(job_args.get("tracking"), self.results_dir,
                                                   job_args)

    def record(
        self,
        round: int | None,
        phase: str,
        site: str,
        metrics: dict[str, float],
        num_examples: int = 0,
        model: str = "global",
        step: int | None = None,
    ) -> None:
        entry: dict[str, Any] = {
            "round": round,
            "phase": phase,
            "site": site,
            "model": model,
            "num_examples": num_examples,
            "metrics": metrics,
        }
        if phase == LOGGED:
            entry["step"] = step
        self.records.append(entry)
        self._jsonl.write(json.dumps(entry) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            self._csv.writerow(["" if round is None else round, phase, site, model, name, value,
                                "" if step is None else step])
        self._csv_file.flush()
        self._tracking.log(Record(round, phase, site, metrics, model, step))

    def record_logged(self, site: str, meta: dict[str, Any]) -> None:
        """The ``fl.log_metrics`` values a site sent with a result (its model's meta)."""
        for entry in _logged_entries(meta.get(LOGGED_KEY)):
            self.record(entry["round"], LOGGED, site, entry["metrics"], step=entry["step"])

    def close(self, plot: bool = True) -> Path | None:
        """Close the files and trackers, draw the training curves; returns the PNG's path.
        Called while the workflow's exception propagates, the trackers' runs end as failed."""
        self._jsonl.close()
        self._csv_file.close()
        self._tracking.close(failed=sys.exc_info()[0] is not None)
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


def _logged_entries(value: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a site's logged metrics (the site's code wrote them: any
    shape); anything else is skipped, never trusted."""
    if not isinstance(value, list):
        return []
    entries = []
    for item in value[:MAX_LOGGED]:
        if not isinstance(item, dict) or not isinstance(item.get("metrics"), dict):
            continue
        metrics = {str(k): float(v) for k, v in item["metrics"].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)
                   and math.isfinite(v)}
        round_, step = item.get("round"), item.get("step")
        if metrics:
            entries.append({"metrics": metrics,
                            "round": round_ if isinstance(round_, int) else None,
                            "step": step if isinstance(step, int) else None})
    return entries


def truncate_after(results_dir: Path, round_: int) -> None:
    """After a server restart: drop the records of rounds after ``round_`` (and of a final
    cross-site evaluation) that an interrupted run wrote, so that each round is in the files
    once when the resumed run writes it again. Each file is rewritten atomically."""
    import os

    results_dir = Path(results_dir)

    def keep(round_value: Any, phase: str) -> bool:
        if phase == "cross_site":
            return False
        return not (isinstance(round_value, int) and round_value > round_)

    def rewrite(path: Path, lines: list[str]) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, path)

    jsonl = results_dir / "metrics.jsonl"
    if jsonl.is_file():
        kept = []
        for line in jsonl.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line the kill cut short
            if isinstance(entry, dict) and keep(entry.get("round"), str(entry.get("phase"))):
                kept.append(line if line.endswith("\n") else line + "\n")
        rewrite(jsonl, kept)
    table = results_dir / "metrics.csv"
    if table.is_file():
        with open(table, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        kept_rows = rows[:1]
        for row in rows[1:]:
            if len(row) != 7:
                continue  # a row the kill cut short
            value = int(row[0]) if row[0].isdigit() else None
            if keep(value, row[1]):
                kept_rows.append(row)
        tmp = table.with_name(".metrics.csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(kept_rows)
        os.replace(tmp, table)
