"""The engine under ``Context.gather`` (fl/workflows/rounds.py), driven through the simulator with
scripted sites: each reply counted once as a result, a drop-out, a rejection or late; a round
that can no longer reach min_clients stops waiting; ``require`` names every failed site."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.aggregation import AggregateCorrupted, ResultRejected
from atoll.fl.channels import Reply
from atoll.fl.model import Model
from atoll.fl.serde import encode
from atoll.fl.workflows.rounds import (
    Outcome,
    WorkflowError,
    describe,
    gather,
    require,
    resolve_min_clients,
)
from tests.unit.fl.helpers import SiteGone, run_workflow

TASK = Model(params={"w": np.zeros(2)})


def answer(value: float):
    return lambda topic, model: Model(params={"w": np.full(2, value)}, num_examples=1)


def gone(topic, model):
    raise SiteGone("its worker died")


def silent(topic, model):
    return None


def gathered(handlers, tmp_path, on_result=None, min_clients=0, timeout=None):
    """Send one task to every site and gather it; (outcome, the results taken in order)."""
    taken: list[tuple[str, float]] = []
    out: dict[str, Outcome] = {}

    def keep(site, stream):
        model = stream.read()
        if on_result is not None:
            on_result(site, model)
        taken.append((site, float(model.params["w"][0])))

    def workflow(channel, args, initial, job_args):
        task_id = channel.send(list(handlers), "train", {}, encode(TASK))
        out["outcome"] = gather(channel, task_id, list(handlers), timeout, keep, min_clients)

    run_workflow(workflow, None, handlers, tmp_path)
    return out["outcome"], taken


def test_results_drop_outs_rejections_and_unreadable_models_each_counted_once(tmp_path):
    def refuse_site_3(site, model):
        if site == "site-3":
            raise ResultRejected("site-3 sent a model of the wrong shape")

    handlers = {"site-1": answer(1.0), "site-2": gone, "site-3": answer(3.0),
                "site-4": lambda topic, model: b"not a model"}
    outcome, taken = gathered(handlers, tmp_path, on_result=refuse_site_3)
    assert outcome.ok == ["site-1"] and taken == [("site-1", 1.0)]
    assert outcome.dropped == {"site-2": "site-2 dropped out: its worker died"}
    assert outcome.rejected["site-3"] == "site-3 sent a model of the wrong shape"
    assert outcome.rejected["site-4"].startswith("sent an unreadable model: ")
    assert outcome.late == {}
    assert set(outcome.failed) == {"site-2", "site-3", "site-4"}


def test_a_round_that_cannot_reach_min_clients_stops_waiting_for_the_silent(tmp_path):
    # no timeout: without the early stop this round would wait for site-3 for ever
    handlers = {"site-1": silent, "site-2": gone, "site-3": silent}
    outcome, _ = gathered(handlers, tmp_path, min_clients=3)
    assert outcome.dropped == {"site-2": "site-2 dropped out: its worker died"}
    why = "not waited for: the round could no longer reach min_clients"
    assert outcome.late == {"site-1": why, "site-3": why} and outcome.ok == []


def test_a_site_that_never_answers_is_late_with_the_timeout_named(tmp_path):
    outcome, _ = gathered({"site-1": answer(1.0), "site-2": silent}, tmp_path, timeout=1.0)
    assert outcome.ok == ["site-1"]
    assert outcome.late == {"site-2": "no reply within round_timeout=1.0s"}


def test_a_corrupted_aggregate_stops_the_workflow_naming_the_site(tmp_path):
    def corrupt(site, model):
        raise AggregateCorrupted("the running sum overflowed")

    with pytest.raises(WorkflowError, match="site-1: the running sum overflowed"):
        gathered({"site-1": answer(1.0)}, tmp_path, on_result=corrupt)


def test_require_names_every_failed_site_in_order():
    outcome = Outcome(ok=["site-1"], dropped={"site-3": "gone"}, late={"site-2": "slow"})
    require(outcome, 1, "round 1")  # enough: nothing raised
    with pytest.raises(WorkflowError) as err:
        require(outcome, 2, "round 4")
    assert str(err.value) == ("round 4: 1 site(s) returned a usable result, min_clients is 2. "
                              "Failed: site-2: slow; site-3: gone")
    assert describe({}) == ""


def test_min_clients_comes_from_the_workflow_then_the_job_then_every_site():
    sites = ["a", "b", "c"]
    assert resolve_min_clients(2, {"min_clients": 1}, sites) == 2
    assert resolve_min_clients(None, {"min_clients": 1}, sites) == 1
    assert resolve_min_clients(None, {}, sites) == 3
    assert resolve_min_clients(None, {"min_clients": 0}, sites) == 3  # not a valid count
    with pytest.raises(WorkflowError, match="min_clients is 4 but the job has only 3 site"):
        resolve_min_clients(4, {}, sites)


class Replaying:
    """A channel whose replies are given: a site answering twice, one not asked at all (a
    hostile or buggy relay; the simulator itself never sends these)."""

    def __init__(self, replies):
        self._replies = replies

    def replies(self, task_id, timeout=None):
        yield from self._replies


def test_a_repeated_reply_and_one_from_a_site_not_asked_are_ignored():
    def model(value):
        return Reply("site-1", chunks=iter(encode(Model(params={"w": np.full(2, value)}))))

    taken = []
    channel = Replaying([model(1.0), model(9.0), Reply("site-9", error="not a target"),
                         Reply("site-2", error="gone")])
    outcome = gather(channel, "t", ["site-1", "site-2"], None,
                     lambda site, stream: taken.append(float(stream.read().params["w"][0])))
    assert taken == [1.0]  # the first answer counts, the repeat is not folded in again
    assert outcome.ok == ["site-1"] and outcome.dropped == {"site-2": "gone"}
    assert "site-9" not in outcome.failed


class ScriptedChannel:
    """Replies per task as scripted: a site whose part restarted answers ``retry`` first."""

    def __init__(self, retries: dict[str, int]):
        self.retries = dict(retries)  # site: how many times its part restarts
        self.sent: list[tuple[str, list[str]]] = []

    def send(self, targets, topic, headers, payload):
        task_id = f"t{len(self.sent) + 1}"
        self.sent.append((task_id, list(targets)))
        return task_id

    def replies(self, task_id, timeout=None):
        targets = dict(self.sent)[task_id]
        for site in targets:
            if self.retries.get(site, 0) > 0:
                self.retries[site] -= 1
                yield Reply(site=site, error=f"{site}'s part restarted", retry=True)
            else:
                yield Reply(site=site, chunks=iter(encode(TASK)))


def test_a_site_whose_part_restarted_is_sent_the_task_again_and_counted_once():
    channel = ScriptedChannel({"site-1": 2})
    task_id = channel.send(["site-1", "site-2"], "train", {}, None)
    taken = []
    outcome = gather(channel, task_id, ["site-1", "site-2"], None,
                     lambda site, stream: taken.append(site), 2,
                     resend=lambda site: channel.send([site], "train", {}, None))
    assert sorted(outcome.ok) == ["site-1", "site-2"] and not outcome.failed
    assert sorted(taken) == ["site-1", "site-2"]  # each result once
    assert [t for t, _ in channel.sent] == ["t1", "t2", "t3"]  # sent to site-1 twice more


def test_retries_are_bounded_and_without_resend_a_restart_is_a_drop_out():
    channel = ScriptedChannel({"site-1": 99})
    task_id = channel.send(["site-1"], "train", {}, None)
    outcome = gather(channel, task_id, ["site-1"], None, lambda site, stream: None, 0,
                     resend=lambda site: channel.send([site], "train", {}, None))
    assert outcome.dropped == {"site-1": "site-1's part restarted"}
    assert len(channel.sent) == 1 + 3  # MAX_RETRIES
    channel = ScriptedChannel({"site-1": 1})
    outcome = gather(channel, channel.send(["site-1"], "train", {}, None), ["site-1"], None,
                     lambda site, stream: None)
    assert outcome.dropped == {"site-1": "site-1's part restarted"}
