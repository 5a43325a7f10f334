"""Experiment tracking configured in app.yaml: TensorBoard event files written as rounds end."""

from __future__ import annotations

import importlib
import json
import textwrap

import pytest

from atoll.fl.app_config import AppConfigError, parse_app_config
from atoll.fl.simulator import simulate

importlib.import_module("tensorboard")  # required: its reader checks the files atoll writes

SITE = """
import numpy as np
import atoll.client as fl
fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 0.25 * model.current_round}, num_examples=1))
        continue
    fl.log_metrics({"epoch_loss": 0.5}, step=model.current_round)
    fl.send(fl.Model(params={"w": np.ones(2)}, num_examples=1, metrics={"loss": 1.0}))
"""


def _job(tmp_path, tracking: str):
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps({"name": "tb", "deploy_map": {"app": ["@ALL"]}}))
    (job / "app" / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 3, cross_site_eval: none}, "
        f"tracking: {tracking}}}\nsite: {{script: train.py}}\n")
    (job / "app" / "train.py").write_text(textwrap.dedent(SITE))
    return job


def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_each_sites_and_the_global_curves_by_round(tmp_path):
    simulate(_job(tmp_path, "{tensorboard: true}"), {"a": {}, "b": {}},
             results_dir=tmp_path / "out")
    scalars = _scalars(tmp_path / "out" / "tensorboard")
    assert scalars["validate/accuracy/global"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert scalars["train/loss/a"] == [(1, 1.0), (2, 1.0), (3, 1.0)]
    assert scalars["epoch_loss/b"] == [(1, 0.5), (2, 0.5), (3, 0.5)]  # fl.log_metrics


def test_tensorboard_false_writes_no_event_files(tmp_path):
    simulate(_job(tmp_path, "{tensorboard: false}"), {"a": {}}, results_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "tensorboard").exists()


@pytest.mark.parametrize("tracking, message", [
    ({"mlflow": {"tracking_uri": "http://me:secret@mlflow:5000"}}, "must not hold credentials"),
    ({"mlflow": {"tracking_uri": "file:///tmp/x"}}, "must be an http(s)://host[:port] URL"),
    ({"mlfow": {}}, "server.tracking.mlfow: unknown key (allowed: tensorboard, mlflow)"),
])
def test_tracking_settings_are_checked_with_their_field(tracking, message):
    doc = {"server": {"workflow": "fedavg", "args": {"num_rounds": 1}, "tracking": tracking}}
    with pytest.raises(AppConfigError) as error:
        parse_app_config(doc)
    assert message in str(error.value)
