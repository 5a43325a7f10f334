"""Secure aggregation on the public workflow API: ``ctx.secure_round`` in a job's own workflow.

The job runs in the simulator with its workflow shipped in the app folder
(``workflow: my_workflow.py:MyWorkflow``) and the real site runtime (``SitePrivacy`` masking
each update). The probe of test_secure_aggregation.py watches the server side, plus everything
reachable from the workflow's context before and after each private round.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.fl.model import Model
from atoll.fl.serde import load_file, save_file
from atoll.fl.simulator import simulate
from atoll.fl.workflows.api import Context
from atoll.workflow import WorkflowError

from .test_secure_aggregation import (  # noqa: F401 - probe is a fixture
    EXAMPLES,
    INITIAL,
    _deltas,
    _fedavg,
    probe,
    reachable_arrays,
)

SITES = {site: {} for site in EXAMPLES}

SITE_SCRIPT = """
import numpy as np
import atoll.client as fl

SITE = fl.site_name()
DELTAS = dict(np.load("deltas.npz"))
EXAMPLES = {examples!r}
LEAVE_AFTER = {leave!r}
fl.init()
while fl.is_running():
    model = fl.receive()
    fl.send(fl.Model(params={{k: v + DELTAS[SITE + "__" + k] for k, v in model.params.items()}},
                     num_examples=EXAMPLES[SITE], metrics={{"loss": 0.5}}))
    if LEAVE_AFTER.get(SITE) == model.current_round:
        raise RuntimeError("left after sending its masked update")
"""

WORKFLOW = """
from atoll.workflow import Model, Workflow


class MyWorkflow(Workflow):
    def run(self) -> None:
        ctx, rounds = self.ctx, []
        model = ctx.initial_model
        for round_ in range(1, ctx.args["num_rounds"] + 1):
            result = ctx.secure_round(model, round=round_, total_rounds=ctx.args["num_rounds"],
                                      timeout=60)
            model = Model(params=result.aggregate, round=round_)
            ctx.log_metrics(result.mean_metrics(), round=round_)
            rounds.append({"ok": sorted(result.ok), "failed": sorted(result.failed),
                           "total_weight": result.total_weight, "privacy": result.privacy,
                           "metrics": result.metrics})
        ctx.save_model("global_model_final", model)
        ctx.save_json("summary", {"rounds": rounds, "dropped": sorted(ctx.dropped),
                                  "active": sorted(ctx.active)})
"""

SECURE = "privacy: {secure_aggregation: {threshold: 3}}\n"


def _job(tmp_path: Path, deltas, *, workflow: str = "my_workflow.py:MyWorkflow",
         args: str = "{num_rounds: 1}", privacy: str = SECURE,
         leave: dict[str, int] | None = None) -> Path:
    job = tmp_path / "job"
    app = job / "app"
    app.mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps({"name": "t", "deploy_map": {"app": ["@ALL"]}}))
    (app / "app.yaml").write_text(
        f"server:\n  workflow: {workflow}\n  args: {args}\n"
        "  initial_model: initial.safetensors\n"
        f"site:\n  script: train.py\n{privacy}")
    save_file(Model(params=INITIAL), app / "initial.safetensors")
    np.savez(app / "deltas.npz", **{f"{s}__{k}": v for s, d in deltas.items() for k, v in d.items()})
    (app / "train.py").write_text(SITE_SCRIPT.format(examples=EXAMPLES, leave=leave or {}))
    (app / "my_workflow.py").write_text(WORKFLOW)
    return job


@pytest.fixture
def scanned(probe, monkeypatch):  # noqa: F811 - the probe fixture, imported
    """The probe, also scanning the workflow's context around each private round."""
    private_round = Context._private_round

    def scanning(self, *args, **kwargs):
        probe.arrays.extend(reachable_arrays(self))
        result = private_round(self, *args, **kwargs)
        probe.arrays.extend(reachable_arrays(self))
        probe.arrays.extend(reachable_arrays(result[0]))  # the round's replies and its sum
        probe.arrays.extend(reachable_arrays(result[1]))  # the aggregate (the sum's memory)
        return result

    monkeypatch.setattr(Context, "_private_round", scanning)
    return probe


def _summary(results: Path) -> dict:
    return json.loads((results / "summary.json").read_text())


def test_a_job_workflow_gets_fedavgs_aggregate_and_the_server_never_holds_one_update(
        tmp_path, scanned):
    deltas = _deltas()
    secure = simulate(_job(tmp_path / "secure", deltas), SITES, results_dir=tmp_path / "out")
    assert secure.site_errors == {}
    final = load_file(tmp_path / "out" / "global_model_final.safetensors").params
    expected = _fedavg(EXAMPLES, deltas)
    for name, value in final.items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    summary = _summary(tmp_path / "out")
    [round_] = summary["rounds"]
    assert round_["ok"] == sorted(EXAMPLES) and round_["failed"] == []
    assert round_["total_weight"] == sum(EXAMPLES.values())
    assert round_["metrics"] == {site: {"loss": 0.5} for site in EXAMPLES}
    # the probe saw the server's traffic, the masked sum and the workflow's memory
    assert scanned.payloads and any(a.dtype.kind == "u" for a in scanned.arrays)
    assert any(np.allclose(a, expected["layer.weight"], atol=1e-5) for a in scanned.arrays
               if a.shape == expected["layer.weight"].shape)
    for site in EXAMPLES:
        assert scanned.holds(deltas[site], INITIAL, EXAMPLES[site]) == [], site
    # the same sites under the built-in FedAvg without privacy: the same aggregate, and the
    # same probe finds every site's update (the attack, shown to work without the defence)
    scanned.payloads.clear()
    scanned.arrays.clear()
    simulate(_job(tmp_path / "plain", deltas, workflow="fedavg", privacy="",
                  args="{num_rounds: 1, evaluate_every: 0, cross_site_eval: none}"),
             SITES, results_dir=tmp_path / "plain-out")
    plain = load_file(tmp_path / "plain-out" / "global_model_final.safetensors").params
    for name, value in final.items():
        np.testing.assert_allclose(value, plain[name], atol=1e-6)
    for site in EXAMPLES:
        assert any("weights in a reply's bytes" in where
                   for where in scanned.holds(deltas[site], INITIAL, EXAMPLES[site])), site


@pytest.mark.parametrize("privacy", ["", "privacy: {dp: {clip_norm: 1.0, noise_multiplier: 1.0}}\n"])
def test_secure_round_without_secure_aggregation_in_app_yaml_names_the_field(tmp_path, privacy):
    with pytest.raises(WorkflowError, match=r"privacy\.secure_aggregation in the job's app\.yaml"):
        simulate(_job(tmp_path, _deltas(), privacy=privacy), SITES, results_dir=tmp_path / "out")


def test_a_site_leaving_after_masking_is_recovered_through_the_public_call(tmp_path, scanned):
    deltas = _deltas()
    result = simulate(_job(tmp_path, deltas, args="{num_rounds: 2, min_clients: 3}",
                           leave={"c": 1}),
                      SITES, results_dir=tmp_path / "out")
    assert set(result.site_errors) == {"c"}
    # round 1: all four in the sum (c's self mask rebuilt from the others' shares); round 2:
    # a, b, d
    after_1 = _fedavg(EXAMPLES, deltas)
    rest = ("a", "b", "d")
    weights = sum(EXAMPLES[s] for s in rest)
    expected = {k: v + sum(EXAMPLES[s] * deltas[s][k] for s in rest) / weights
                for k, v in after_1.items()}
    final = load_file(tmp_path / "out" / "global_model_final.safetensors").params
    for name, value in final.items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    summary = _summary(tmp_path / "out")
    first, second = summary["rounds"]
    assert first["ok"] == ["a", "b", "c", "d"]
    assert first["total_weight"] == sum(EXAMPLES.values())
    assert second["ok"] == ["a", "b", "d"] and second["total_weight"] == weights
    assert summary["dropped"] == ["c"] and summary["active"] == ["a", "b", "d"]
    for site in EXAMPLES:
        assert scanned.holds(deltas[site], INITIAL, EXAMPLES[site]) == [], site
