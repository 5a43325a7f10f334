"""The client API a site script uses, against an in-memory federation."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest

import atoll.client as fl
from atoll.fl.client_runtime import ClientError, ClientSession, bind, unbind
from atoll.fl.model import Model
from atoll.fl.runner import SiteScriptError, run_site_app
from atoll.fl.serde import decode, encode
from atoll.fl.simulator import Federation


@pytest.fixture
def federation(tmp_path):
    federation = Federation(["a"], tmp_path)
    session = ClientSession(
        federation.site_channel("a"), "a", {"records": "/srv/records"}, {"lr": 0.1}
    )
    bind(session, thread_only=True)
    yield federation
    unbind(thread_only=True)


def _send(federation, topic, params=None, round_=0):
    model = Model(params=params or {"w": np.arange(3.0)}, round=round_, meta={"total_rounds": 5})
    return federation.send(["a"], topic, {"round": round_}, encode(model))


def _reply(federation, task_id):
    (reply,) = list(federation.replies(task_id, timeout=5))
    return decode(reply.chunks)


def test_the_usual_loop(federation):
    task = _send(federation, "train", round_=2)
    assert fl.is_running()
    model = fl.receive()
    assert (model.current_round, model.total_rounds, model.task) == (2, 5, "train")
    assert fl.is_train() and not fl.is_evaluate() and fl.task_name() == "train"
    assert fl.receive() is model  # the same task until it is answered
    fl.send(fl.Model(params={"w": model.params["w"] + 1}, num_examples=7, metrics={"loss": 0.5}))
    answer = _reply(federation, task)
    np.testing.assert_array_equal(answer.params["w"], [1.0, 2.0, 3.0])
    assert (answer.num_examples, answer.metrics, answer.round) == (7, {"loss": 0.5}, 2)
    federation.close()
    assert not fl.is_running() and fl.receive() is None


def test_evaluation_by_hand_sends_metrics_without_weights(federation):
    task = _send(federation, "validate")
    model = fl.receive()
    assert fl.is_evaluate()
    fl.send(fl.Model(params=model.params, metrics={"accuracy": 0.9}, num_examples=4))
    answer = _reply(federation, task)
    assert answer.params == {} and answer.metrics == {"accuracy": 0.9} and answer.num_examples == 4


def test_an_evaluate_function_answers_validate_tasks_inside_the_loop(federation):
    seen = []
    fl.init(evaluate=lambda m: seen.append(m.params["w"].sum()) or {"accuracy": 0.25})
    validate = _send(federation, "validate", {"w": np.ones(4)})
    train = _send(federation, "train")
    assert fl.is_running()
    assert fl.receive().task == "train"  # the validate task never reached the loop
    assert seen == [4.0] and _reply(federation, validate).metrics == {"accuracy": 0.25}
    fl.send(fl.Model(params={"w": np.zeros(1)}, num_examples=1))
    assert _reply(federation, train).num_examples == 1


def test_misuse_is_explained(federation):
    with pytest.raises(ClientError, match="without a task to answer: call fl.receive"):
        fl.send(fl.Model(metrics={"a": 1.0}))
    _send(federation, "train")
    fl.receive()
    with pytest.raises(ClientError, match="a train task needs the trained weights"):
        fl.send(fl.Model(metrics={"loss": 1.0}))
    with pytest.raises(TypeError, match="takes an fl.Model, got dict"):
        fl.send({"w": 1})


def test_site_job_args_and_datasets(federation, monkeypatch):
    assert fl.site_name() == "a" and fl.job_id() == "simulated"
    assert fl.job_args() == {"lr": 0.1}
    assert str(fl.dataset_path("records")) == "/srv/records"
    with pytest.raises(
        ClientError, match="dataset 'slides' is not mapped .* at site a; mapped: records"
    ):
        fl.dataset_path("slides")


def test_dataset_paths_from_the_worker_environment(tmp_path, monkeypatch):
    session = ClientSession(Federation(["b"], tmp_path).site_channel("b"), "b")
    monkeypatch.setenv("ATOLL_DATASETS", '{"slides": "/host/slides"}')
    assert str(session.dataset_path("slides")) == "/host/slides"
    monkeypatch.delenv("ATOLL_DATASETS")
    (tmp_path / "scans").mkdir()
    monkeypatch.setenv("ATOLL_DATA_ROOT", str(tmp_path))
    assert session.dataset_path("scans") == tmp_path / "scans"
    with pytest.raises(ClientError, match="mapped: scans"):
        session.dataset_path("slides")


def test_log_metrics_reaches_the_job_status(federation):
    fl.log_metrics({"epoch_loss": 0.3}, step=4)
    assert federation.events[-1] == {
        "site": "a",
        "event": "site_metrics",
        "round": None,
        "step": 4,
        "metrics": {"epoch_loss": 0.3},
    }


def test_an_unbound_client_says_how_to_run_the_script():
    with pytest.raises(ClientError, match="not connected to a job"):
        fl.site_name()


SCRIPT = """
import os, sys
import atoll.client as fl
fl.init()
while fl.is_running():
    model = fl.receive()
    if {fail!r} == "raise":
        raise ValueError("bad batch at round %d" % model.current_round)
    if {fail!r} == "exit":
        sys.exit(3)
    fl.send(fl.Model(params=model.params, num_examples=1,
                     meta={{"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__}}))
"""


@pytest.mark.parametrize("fail", ["", "raise", "exit"])
def test_run_site_app_runs_the_script_in_process(tmp_path, fail):
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.yaml").write_text("site: {script: train.py, args: ['--epochs', '2']}\n")
    (app / "train.py").write_text(textwrap.dedent(SCRIPT.format(fail=fail)))
    federation = Federation(["a"], tmp_path / "results")
    task = _send(federation, "train", round_=1)
    federation.close()
    argv, cwd = sys.argv[:], os.getcwd()
    if fail == "raise":
        with pytest.raises(ValueError, match="bad batch at round 1"):
            run_site_app(federation.site_channel("a"), app, "a", {})
    elif fail == "exit":
        with pytest.raises(SiteScriptError, match="train.py exited with status 3"):
            run_site_app(federation.site_channel("a"), app, "a", {})
    else:
        run_site_app(federation.site_channel("a"), app, "a", {})
        meta = _reply(federation, task).meta
        assert meta == {"argv": ["--epochs", "2"], "cwd": str(app), "name": "__main__"}
    assert (sys.argv, os.getcwd()) == (argv, cwd)  # restored
    with pytest.raises(ClientError):
        fl.site_name()  # unbound again
