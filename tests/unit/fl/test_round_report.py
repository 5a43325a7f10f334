"""What the FedAvg family reports at the end of a round (fl/workflows/round_report.py): one
``round`` event with each site's train and validation metrics, the global ones, the failed and
active sites, the best round and the privacy spent; and its one-line headline."""

from __future__ import annotations

import logging

from atoll.fl.app_config import FedAvgArgs
from atoll.fl.workflows.round_report import headline, report_round

VALIDATION = {"global": {"accuracy": 0.8, "loss": 0.4},
              "sites": {"site-2": {"accuracy": 0.9}, "site-1": {"accuracy": 0.7},
                        "site-3": {"loss": 0.2}}}


class Ctx:
    def __init__(self):
        self.events = []

    def report(self, event):
        self.events.append(event)


def test_the_headline_is_global_validation_and_each_sites_key_metric():
    assert headline("accuracy", {"loss": 1.5}, VALIDATION) == {
        "accuracy": 0.8, "loss": 0.4, "site-1/accuracy": 0.7, "site-2/accuracy": 0.9}
    # no validation this round: the global training metrics, named so
    assert headline("accuracy", {"loss": 1.5}, None) == {"train_loss": 1.5}


def test_a_round_event_carries_sites_globals_failures_best_and_privacy(caplog):
    ctx = Ctx()
    args = FedAvgArgs(num_rounds=5, key_metric="accuracy")
    caplog.set_level(logging.INFO, logger="atoll.fl.workflows.fedavg")
    report_round(ctx, 3, args,
                 train={"site-1": ({"loss": 1.0}, 10), "site-2": ({"loss": 2.0}, 30)},
                 global_train={"loss": 1.75}, validation=VALIDATION,
                 failed={"site-4": "dropped out: gone"}, active=["site-1", "site-2", "site-3"],
                 best=(2, 0.85), privacy={"epsilon": 1.23456, "delta": 1e-5},
                 model_digest="sha256:" + "ab" * 32)
    [event] = ctx.events
    assert event == {
        "event": "round", "round": 3, "total_rounds": 5, "num_rounds": 5,
        "metrics": headline("accuracy", {"loss": 1.75}, VALIDATION),
        "sites": {"site-1": {"train": {"loss": 1.0}, "num_examples": 10,
                             "validate": {"accuracy": 0.7}},
                  "site-2": {"train": {"loss": 2.0}, "num_examples": 30,
                             "validate": {"accuracy": 0.9}},
                  "site-3": {"validate": {"loss": 0.2}}},  # validated without training
        "global": {"train": {"loss": 1.75}, "validate": {"accuracy": 0.8, "loss": 0.4}},
        "failed": {"site-4": "dropped out: gone"},
        "active": ["site-1", "site-2", "site-3"],
        "best": {"round": 2, "accuracy": 0.85},
        "privacy": {"epsilon": 1.23456, "delta": 1e-5},
        "model_digest": "sha256:" + "ab" * 32,  # the server's round.model entry
    }
    assert caplog.messages == [
        "round 3 of 5: 2 result(s), validation {'accuracy': 0.8, 'loss': 0.4}, failed: "
        "site-4: dropped out: gone, epsilon 1.235 at delta 1e-05"]


def test_a_round_without_validation_best_or_privacy_leaves_them_out(caplog):
    ctx = Ctx()
    caplog.set_level(logging.INFO, logger="atoll.fl.workflows.fedavg")
    report_round(ctx, 1, FedAvgArgs(num_rounds=2), train={"site-1": ({"loss": 1.0}, 4)},
                 global_train={"loss": 1.0}, validation=None, failed={}, active=["site-1"],
                 best=None)
    [event] = ctx.events
    assert "best" not in event and "privacy" not in event and "model_digest" not in event
    assert event["global"] == {"train": {"loss": 1.0}, "validate": {}}
    assert event["metrics"] == {"train_loss": 1.0}
    assert caplog.messages == ["round 1 of 2: 1 result(s)"]
