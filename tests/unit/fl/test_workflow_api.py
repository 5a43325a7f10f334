"""The public workflow API: a job's own workflow class, aggregators, the errors a job author meets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atoll.fl.aggregation import ResultRejected
from atoll.fl.app_config import AppConfigError
from atoll.fl.simulator import simulate
from atoll.workflow import CoordinateMedian, Model, TrimmedMean, WeightedAverage

TEMPLATES = Path(__file__).resolve().parents[3] / "src" / "atoll" / "fl" / "templates"
DOC = Path(__file__).resolve().parents[3] / "docs" / "federated-learning.md"
SITES = {"site-1": {}, "site-2": {}, "site-3": {}}

# A site whose "loss" is its distance to 1.0: the weighted mean of [0, 1, 2] (weights 1, 2, 1)
# is 1.0 exactly, so the loss stops improving after round 1 and patience ends the job.
SITE_SCRIPT = """
import numpy as np
import atoll.client as fl

VALUE = {"site-1": 0.0, "site-2": 1.0, "site-3": 2.0}[fl.site_name()]
WEIGHT = {"site-1": 1, "site-2": 2, "site-3": 1}[fl.site_name()]
fl.init()
while fl.is_running():
    model = fl.receive()
    w = model.params.get("w", np.zeros(3))
    fl.log_metrics({"seen": float(w[0])})
    fl.send(fl.Model(params={"w": np.full(3, VALUE)}, num_examples=WEIGHT,
                     metrics={"loss": float(abs(w[0] - 1.0))}))
"""


def _job(tmp_path: Path, app_yaml: str, workflow_file: str | None = None) -> Path:
    app = tmp_path / "job" / "app"
    app.mkdir(parents=True)
    (tmp_path / "job" / "meta.json").write_text(
        json.dumps({"name": "t", "deploy_map": {"app": ["@ALL"]}})
    )
    (app / "app.yaml").write_text(app_yaml)
    (app / "train.py").write_text(SITE_SCRIPT)
    if workflow_file is not None:
        (app / "my_workflow.py").write_text(workflow_file)
    return tmp_path / "job"


CUSTOM_APP = """server:
  workflow: my_workflow.py:MyFedAvg
  args: {num_rounds: 6, patience: 2}
site:
  script: train.py
"""


def test_the_documented_workflow_runs_and_stops_early(tmp_path):
    template = (TEMPLATES / "my_workflow.py.tmpl").read_text()
    body = template.split("\n", 2)[2]  # the docs show it without its docstring line
    assert body.strip() in DOC.read_text(), "docs/federated-learning.md shows another version"
    assert len(body.strip().splitlines()) <= 40
    job = _job(tmp_path, CUSTOM_APP, template)
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    # round 1: every site saw w=0 (loss 1), round 2: w=1 (loss 0), rounds 3, 4: no better
    assert summary == {"rounds": 4, "best_loss": 0.0}
    from atoll.fl.serde import load_file

    w = load_file(tmp_path / "results" / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(w, np.ones(3))  # (0*1 + 1*2 + 2*1) / 4
    rounds = [e for e in result.events if e.get("event") == "round"]
    assert [e["round"] for e in rounds] == [1, 2, 3, 4]
    lines = (tmp_path / "results" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["metrics"] == {"loss": 0.0}


def test_the_robust_option_uses_the_trimmed_mean(tmp_path):
    job = _job(tmp_path, CUSTOM_APP.replace("patience: 2", "patience: 1, robust: true"),
               (TEMPLATES / "my_workflow.py.tmpl").read_text())
    simulate(job, SITES, results_dir=tmp_path / "results")
    from atoll.fl.serde import load_file

    w = load_file(tmp_path / "results" / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(w, np.ones(3))  # trim 0.2 of 3 cuts nothing: the plain mean


@pytest.mark.parametrize(
    ("workflow_file", "message"),
    [
        ("x = 1\n", "server.workflow: my_workflow.py has no class 'MyFedAvg'"),
        ("class MyFedAvg:\n    pass\n", "not a subclass of atoll.workflow.Workflow"),
    ],
)
def test_a_missing_or_wrong_class_is_named(tmp_path, workflow_file, message):
    job = _job(tmp_path, CUSTOM_APP, workflow_file)
    with pytest.raises(AppConfigError, match=message):
        simulate(job, SITES, results_dir=tmp_path / "results")


def test_bad_args_are_reported_with_their_field(tmp_path):
    job = _job(tmp_path, CUSTOM_APP.replace("patience: 2", "patience: 0, colour: red"),
               (TEMPLATES / "my_workflow.py.tmpl").read_text())
    with pytest.raises(AppConfigError) as failure:
        simulate(job, SITES, results_dir=tmp_path / "results")
    assert any(e.startswith("server.args.patience:") for e in failure.value.errors)


def test_a_workflow_file_outside_the_app_is_refused(tmp_path):
    job = _job(tmp_path, CUSTOM_APP.replace("my_workflow.py", "../evil.py"))
    with pytest.raises(AppConfigError, match="server.workflow: must be a relative path"):
        simulate(job, SITES, results_dir=tmp_path / "results")


def _models(values, dtype=np.float32):
    return [Model(params={"w": np.asarray(v, dtype)}, num_examples=n) for v, n in values]


def test_median_and_trimmed_mean_per_coordinate():
    rng = np.random.default_rng(0)
    stacked = rng.normal(size=(5, 4, 3))
    median, trimmed = CoordinateMedian(), TrimmedMean(0.2)
    for i, value in enumerate(stacked):
        for aggregator in (median, trimmed):
            aggregator.add(f"s{i}", Model(params={"w": value.copy()}, num_examples=1 + i))
    np.testing.assert_allclose(median.result()["w"], np.median(stacked, axis=0))
    ordered = np.sort(stacked, axis=0)
    np.testing.assert_allclose(trimmed.result()["w"], ordered[1:4].mean(axis=0))


def test_robust_aggregators_resist_one_poisoned_result_the_mean_does_not():
    honest = [([1.0, 1.0], 10), ([1.2, 0.8], 10), ([0.9, 1.1], 10), ([1.1, 0.9], 10)]
    poisoned = ([-1000.0, 1000.0], 10)
    results = {}
    for name, aggregator in (("mean", WeightedAverage()), ("median", CoordinateMedian()),
                             ("trimmed", TrimmedMean(0.2))):
        for i, model in enumerate(_models([*honest, poisoned])):
            aggregator.add(f"s{i}", model)
        results[name] = aggregator.result()["w"]
    assert np.abs(results["mean"] - 1).max() > 100
    assert np.abs(results["median"] - 1).max() < 0.2
    assert np.abs(results["trimmed"] - 1).max() < 0.2
    assert results["median"].dtype == np.float32


def test_robust_aggregators_refuse_mismatched_results_and_apply_diffs():
    median = CoordinateMedian(reference={"w": np.ones(2)})
    with pytest.raises(ResultRejected, match="shape"):
        median.add("a", Model(params={"w": np.ones(3)}, num_examples=1))
    median.add("a", Model(params={"w": np.full(2, 0.5)}, num_examples=1, params_type="diff"))
    np.testing.assert_allclose(median.result()["w"], np.full(2, 1.5))


def test_filters_see_every_model_before_the_wire_and_the_aggregator(tmp_path):
    """The seam for privacy filters: a task filter changes what leaves the server, a result
    filter what the aggregator gets, and can refuse a site's result."""
    from atoll.fl.simulator import Federation
    from atoll.fl.workflows.api import Context

    federation = Federation(["a", "b", "c"], tmp_path)
    seen_by_sites: dict[str, float] = {}

    def site(name: str, value: float) -> None:
        from atoll.fl.serde import decode, encode

        channel = federation.site_channel(name)
        task = channel.receive()
        model = decode(task.chunks)
        seen_by_sites[name] = float(model.params["w"][0])
        answer = Model(params={"w": np.full(2, value)}, num_examples=1)
        channel.reply(task.task_id, {}, encode(answer))

    import threading

    threads = [threading.Thread(target=site, args=(n, v)) for n, v in
               (("a", 1.0), ("b", 3.0), ("c", 100.0))]
    for thread in threads:
        thread.start()
    ctx = Context(federation.server_channel(), {"min_clients": 2})

    def clip_outgoing(target: str, model: Model) -> Model:
        return Model(params={k: np.clip(v, -1, 1) for k, v in model.params.items()})

    def refuse_outliers(site: str, model: Model) -> Model:
        if np.abs(model.params["w"]).max() > 10:
            raise ResultRejected("an update beyond the norm bound")
        return model

    ctx.task_filters.append(clip_outgoing)
    ctx.result_filters.append(refuse_outliers)
    sent = ctx.send("train", Model(params={"w": np.full(2, 5.0)}))
    gathered = ctx.gather(sent, timeout=60, aggregator=WeightedAverage())
    for thread in threads:
        thread.join()
    assert seen_by_sites == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert gathered.failed == {"c": "an update beyond the norm bound"}
    np.testing.assert_allclose(gathered.aggregate["w"], np.full(2, 2.0))


def test_gather_takes_who_answers_in_time_and_names_the_rest(tmp_path):
    """Two sites answer, one never does: with min_replies 2 the task succeeds after the
    timeout, the silent site is late (not dropped: it stays active); a dropped-out site leaves
    ctx.active; asking for 3 fails naming both."""
    import threading

    from atoll.fl.serde import decode, encode
    from atoll.fl.simulator import Federation
    from atoll.fl.workflows.api import Context
    from atoll.workflow import WorkflowError

    federation = Federation(["a", "b", "silent", "gone"], tmp_path)
    done = threading.Event()
    answered = {"a": threading.Semaphore(0), "b": threading.Semaphore(0)}

    def answer(name: str) -> None:
        channel = federation.site_channel(name)
        while (task := channel.receive(timeout=30)) is not None and not done.is_set():
            decode(task.chunks)
            channel.reply(task.task_id, {}, encode(Model(metrics={"n": 1.0}, num_examples=2)))
            answered[name].release()

    def replies_in() -> None:
        """Both answering sites have replied: how fast a loaded machine runs their threads must
        not decide which sites the timeout names."""
        for name, replied in answered.items():
            assert replied.acquire(timeout=60), f"{name} never replied"

    threads = [threading.Thread(target=answer, args=(n,), daemon=True) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    federation.drop("gone", "gone dropped out: worker killed by signal 9")
    ctx = Context(federation.server_channel(), {})
    sent = ctx.send("count", targets=["a", "b", "silent", "gone"])
    replies_in()
    got = ctx.gather(sent, timeout=1.0, min_replies=2)
    assert sorted(got.ok) == ["a", "b"] and got.mean_metrics() == {"n": 1.0}
    assert got.failed == {"silent": "no reply within round_timeout=1.0s",
                          "gone": "gone dropped out: worker killed by signal 9"}
    assert ctx.active == ["a", "b", "silent"] and list(ctx.dropped) == ["gone"]
    again = ctx.send("count", targets=["a", "b", "silent"])
    replies_in()
    with pytest.raises(WorkflowError, match=r"count: 2 site\(s\).*min_clients is 3.*silent"):
        ctx.gather(again, timeout=1.0, min_replies=3)
    done.set()
    federation.close()
