"""Federated evaluation (fl/workflows/evaluation.py) through the simulator: each target evaluates
the model it is sent (told which by its label) and only metrics come back; a cross-site table
evaluates each saved model on every site and keeps who failed; the table prints and saves."""

from __future__ import annotations

import json

import numpy as np

from atoll.fl.model import Model
from atoll.fl.serde import encode
from atoll.fl.workflows.api import Context
from atoll.fl.workflows.evaluation import (
    VALIDATE,
    cross_site_table,
    evaluate,
    format_table,
    save_table,
)
from tests.unit.fl.helpers import SiteGone, run_workflow

# site -> the value it adds to w[0] to make its "accuracy": a table a mix-up would show
OFFSET = {"site-1": 0.0, "site-2": 0.5}


def evaluator(site: str, seen: list):
    def handle(topic, model):
        seen.append((site, topic, model.meta.get("model")))
        accuracy = float(model.params["w"][0]) + OFFSET[site]
        return Model(metrics={"accuracy": accuracy}, num_examples=10 + len(site))
    return handle


def in_context(fn):
    out = {}

    def workflow(channel, args, initial, job_args):
        out["value"] = fn(Context(channel, {}, initial, job_args))
    return workflow, out


def test_every_target_evaluates_the_model_and_only_metrics_come_back(tmp_path):
    seen: list = []
    workflow, out = in_context(lambda ctx: evaluate(
        ctx, ["site-1", "site-2"], Model(params={"w": np.full(2, 0.25)}), "global", None))
    run_workflow(workflow, None, {s: evaluator(s, seen) for s in OFFSET}, tmp_path)
    result = out["value"]
    assert sorted(seen) == [("site-1", VALIDATE, "global"), ("site-2", VALIDATE, "global")]
    assert result.metrics == {"site-1": {"accuracy": 0.25}, "site-2": {"accuracy": 0.75}}
    assert result.num_examples == {"site-1": 16, "site-2": 16}
    assert result.outcome.failed == {}


def test_a_site_that_drops_out_of_an_evaluation_is_failed_not_fatal(tmp_path):
    def gone(topic, model):
        raise SiteGone("out of memory")

    seen: list = []
    workflow, out = in_context(lambda ctx: evaluate(
        ctx, ["site-1", "site-2"], Model(params={"w": np.zeros(2)}), "best", None))
    run_workflow(workflow, None, {"site-1": evaluator("site-1", seen), "site-2": gone}, tmp_path)
    assert out["value"].metrics == {"site-1": {"accuracy": 0.0}}
    assert out["value"].outcome.failed == {"site-2": "site-2 dropped out: out of memory"}


def test_cross_site_table_evaluates_each_saved_model_on_every_site(tmp_path):
    models = {}
    for label, value in (("global", 0.5), ("site-1", 0.125)):
        path = tmp_path / f"{label}.model"
        path.write_bytes(b"".join(encode(Model(params={"w": np.full(2, value)}))))
        models[label] = path
    seen: list = []

    def gone_on_local(topic, model):
        if model.params["w"][0] == 0.125:  # site-1's local model (a saved file goes as it is)
            raise SiteGone("evaluation crashed")
        return evaluator("site-2", seen)(topic, model)

    workflow, out = in_context(lambda ctx: cross_site_table(
        ctx, ["site-1", "site-2"], models.items(), None))
    run_workflow(workflow, None, {"site-1": evaluator("site-1", seen), "site-2": gone_on_local},
                 tmp_path / "results")
    table, failures = out["value"]
    assert table == {"global": {"site-1": {"accuracy": 0.5}, "site-2": {"accuracy": 1.0}},
                     "site-1": {"site-1": {"accuracy": 0.125}}}
    assert failures == {"site-1": {"site-2": "site-2 dropped out: evaluation crashed"}}


def test_the_table_prints_a_row_per_model_and_dashes_for_what_is_missing(tmp_path):
    table = {"global": {"site-1": {"accuracy": 0.5}, "site-2": {"accuracy": 0.75}},
             "site-1": {"site-1": {"accuracy": 0.125}}}
    assert format_table(table, "accuracy").splitlines() == [
        "model   " + f"{'site-1':>12}  {'site-2':>12}",
        "global  " + f"{0.5:>12.4f}  {0.75:>12.4f}",
        "site-1  " + f"{0.125:>12.4f}  {'-':>12}",
    ]
    path = tmp_path / "cross_site_eval.json"
    save_table(path, table, {"site-1": {"site-2": "gone"}}, "accuracy")
    assert json.loads(path.read_text()) == {"key_metric": "accuracy", "table": table,
                                            "failures": {"site-1": {"site-2": "gone"}}}
