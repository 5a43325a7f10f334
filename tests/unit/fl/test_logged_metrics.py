"""fl.log_metrics values land in the job's metrics files and plot, not only in its logs."""

from __future__ import annotations

import csv
import json
import textwrap

from atoll.fl.plots import plot_training_curves
from atoll.fl.simulator import simulate

LOGGING_SITE = """
import numpy as np
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    params = model.params or {"w": np.zeros(2)}
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 0.5}, num_examples=1))
        continue
    for epoch in range(3):
        fl.log_metrics({"epoch_loss": 1.0 / (epoch + 1)}, step=10 * model.current_round + epoch)
    fl.send(fl.Model(params={"w": params["w"] + 1}, num_examples=1, metrics={"loss": 0.1}))
"""


def _job(tmp_path):
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps({"name": "logs", "deploy_map": {"app": ["@ALL"]}}))
    (job / "app" / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 2, cross_site_eval: none}}\n"
        "site: {script: train.py}\n")
    (job / "app" / "train.py").write_text(textwrap.dedent(LOGGING_SITE))
    return job


def test_logged_metrics_reach_metrics_jsonl_csv_and_the_plot(tmp_path):
    out = tmp_path / "out"
    simulate(_job(tmp_path), {"a": {}, "b": {}}, results_dir=out)
    logged = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r["phase"] == "log"]
    assert sorted((r["site"], r["round"], r["step"]) for r in logged) == sorted(
        (site, round_, 10 * round_ + epoch)
        for site in ("a", "b") for round_ in (1, 2) for epoch in range(3))
    assert {r["metrics"]["epoch_loss"] for r in logged} == {1.0, 0.5, 1.0 / 3}
    with open(out / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["phase"] == "log"]
    assert ("1", "a", "epoch_loss", "1.0", "10") in {
        (r["round"], r["site"], r["metric"], r["value"], r["step"]) for r in rows}
    assert len(rows) == 12


def test_the_plot_draws_logged_values_alone(tmp_path):
    records = [{"round": 1, "phase": "log", "site": "a", "step": s, "metrics": {"x": float(s)}}
               for s in range(3)]
    assert plot_training_curves(records, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_malformed_logged_entries_from_a_site_are_skipped(tmp_path):
    from atoll.fl.metrics_log import LOGGED_KEY, MetricsLog

    metrics = MetricsLog(tmp_path)
    metrics.record_logged("a", {LOGGED_KEY: [
        "junk", {"metrics": "no"}, {"metrics": {"ok": 1.5, "nan": float("nan"), "s": "x"},
                                    "round": 2, "step": "7"}]})
    metrics.close(plot=False)
    (row,) = map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert (row["round"], row["step"], row["metrics"]) == (2, None, {"ok": 1.5})

