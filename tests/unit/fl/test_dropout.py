"""Sites that drop out, send garbage or go silent: tolerated while min_clients holds."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from atoll.fl.app_config import FedAvgArgs
from atoll.fl.model import Model
from atoll.fl.serde import encode, load_file
from atoll.fl.workflows import WorkflowError, run_fedavg

from .helpers import SiteGone, fixed_result, run_workflow


def _dropping(round_to_drop, value=1.0):
    def handler(topic, model):
        if model.round == round_to_drop and topic == "train":
            raise SiteGone("worker killed by signal 9")
        if topic == "validate":
            return Model(metrics={"accuracy": 0.5}, num_examples=1)
        return Model(params={"w": np.full(2, value)}, num_examples=1)

    return handler


def _sites(**extra):
    return {
        "site-1": fixed_result({"w": np.full(2, 2.0)}, 1),
        "site-2": fixed_result({"w": np.full(2, 4.0)}, 1),
        **extra,
    }


def test_a_site_dropping_mid_round_is_tolerated_while_min_clients_holds(tmp_path):
    args = FedAvgArgs(num_rounds=3, min_clients=2)
    federation = run_workflow(run_fedavg, args, _sites(**{"site-3": _dropping(2, 30.0)}), tmp_path)
    final = load_file(tmp_path / "global_model_final.safetensors")
    np.testing.assert_array_equal(final.params["w"], [3.0, 3.0])  # mean of the two that stayed
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert "site-3 dropped out: worker killed by signal 9" in rounds[1]["failed"]["site-3"]
    assert rounds[2]["active"] == ["site-1", "site-2"]  # not asked again once gone
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["dropped"]) == ["site-3"]
    assert set(summary["cross_site_eval"]["global_final"]) == {"site-1", "site-2"}


def test_below_min_clients_the_workflow_fails_naming_the_site_and_reason(tmp_path):
    args = FedAvgArgs(num_rounds=3, min_clients=3)
    with pytest.raises(WorkflowError) as failure:
        run_workflow(run_fedavg, args, _sites(**{"site-3": _dropping(2)}), tmp_path)
    message = str(failure.value)
    # How many others answered before the round gave up depends on arrival order.
    assert message.startswith("round 2: ") and "min_clients is 3" in message
    assert "site-3: site-3 dropped out: worker killed by signal 9" in message


def test_a_site_dropping_during_validation_counts_too(tmp_path):
    def flaky(topic, model):
        if topic == "validate":
            raise SiteGone("out of memory")
        return Model(params={"w": np.ones(2)}, num_examples=1)

    with pytest.raises(
        WorkflowError, match=r"round 1 validation: 2 site\(s\).*site-3 dropped out: out of memory"
    ):
        run_workflow(
            run_fedavg,
            FedAvgArgs(num_rounds=2, min_clients=3),
            _sites(**{"site-3": flaky}),
            tmp_path,
        )


def test_a_silent_site_misses_the_round_by_timeout_and_stays_active(tmp_path):
    calls = []

    def silent_once(topic, model):
        calls.append((topic, model.round))
        if topic == "train" and model.round == 1:
            return None  # never answers this task
        if topic == "validate":
            return Model(metrics={"accuracy": 0.5}, num_examples=1)
        return Model(params={"w": np.full(2, 8.0)}, num_examples=1)

    # Long enough that the sites that do answer always make it, on a loaded machine too: the
    # exact set of late sites is what the test checks.
    args = FedAvgArgs(num_rounds=2, min_clients=2, round_timeout=5, cross_site_eval="none")
    federation = run_workflow(run_fedavg, args, _sites(**{"site-3": silent_once}), tmp_path)
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert rounds[0]["failed"] == {"site-3": "no reply within round_timeout=5.0s"}
    assert "site-3" in rounds[1]["sites"]  # back in round 2
    assert ("train", 2) in calls


def test_an_unusable_result_is_rejected_and_named(tmp_path):
    bad = fixed_result({"v": np.ones(2)}, 1)
    with pytest.raises(WorkflowError, match=r"site-3: params names differ from the global model"):
        run_workflow(
            run_fedavg,
            FedAvgArgs(num_rounds=1, min_clients=3),
            _sites(**{"site-3": bad}),
            tmp_path,
            initial=Model(params={"w": np.zeros(2)}),
        )


def test_min_clients_above_the_number_of_sites_is_refused_up_front(tmp_path):
    with pytest.raises(WorkflowError, match="min_clients is 5 but the job has only 2 site"):
        run_workflow(run_fedavg, FedAvgArgs(num_rounds=1, min_clients=5), _sites(), tmp_path)


def test_min_clients_defaults_to_the_jobs_then_to_every_site(tmp_path):
    gone = threading.Event()

    def drop_at_once(topic, model):
        gone.set()
        raise SiteGone("gone")

    # the job's meta.json says 2: one drop-out is fine
    run_workflow(
        run_fedavg,
        FedAvgArgs(num_rounds=1),
        _sites(**{"site-3": drop_at_once}),
        tmp_path / "a",
        job_args={"min_clients": 2},
    )
    assert gone.is_set()
    # no min_clients anywhere: every site is needed
    with pytest.raises(WorkflowError, match="min_clients is 3"):
        run_workflow(
            run_fedavg, FedAvgArgs(num_rounds=1), _sites(**{"site-3": drop_at_once}), tmp_path / "b"
        )


def test_an_unreadable_reply_is_rejected_and_a_broken_off_one_fails_the_round(tmp_path):
    initial = Model(params={"w": np.zeros(2)})
    garbage = fixed_result({"w": np.ones(2)}, 1)

    def unreadable(topic, model):
        return b"\x00" * 3 if topic == "train" else garbage(topic, model)

    args = FedAvgArgs(num_rounds=1, min_clients=2, cross_site_eval="none")
    federation = run_workflow(
        run_fedavg, args, _sites(**{"site-3": unreadable}), tmp_path / "a", initial=initial
    )
    failed = [e for e in federation.events if e["event"] == "round"][0]["failed"]
    assert failed["site-3"].startswith("sent an unreadable model: payload ended early")

    blob = b"".join(bytes(c) for c in encode(Model(params={"w": np.ones(2)}, num_examples=1)))

    def truncated(topic, model):
        return blob[:-4] if topic == "train" else garbage(topic, model)

    with pytest.raises(WorkflowError, match="site-3: the result broke off while being added"):
        run_workflow(
            run_fedavg, args, _sites(**{"site-3": truncated}), tmp_path / "b", initial=initial
        )


def test_a_round_that_cannot_reach_min_clients_stops_waiting_for_stalled_sites(tmp_path):
    """site-1 dies while the others stall: with min_clients 3 the round has failed already, so
    the workflow must fail now, not after round_timeout (600 s here, past the test's limit)."""
    stalled = threading.Event()

    def stall(topic, model):
        stalled.wait(2)  # never answers this round

    args = FedAvgArgs(num_rounds=2, min_clients=3, round_timeout=600)
    with pytest.raises(WorkflowError) as failure:
        run_workflow(run_fedavg, args,
                     {"site-1": _dropping(1), "site-2": stall, "site-3": stall}, tmp_path)
    message = str(failure.value)
    assert "site-1: site-1 dropped out: worker killed by signal 9" in message
    for site in ("site-2", "site-3"):
        assert f"{site}: not waited for: the round could no longer reach min_clients" in message
