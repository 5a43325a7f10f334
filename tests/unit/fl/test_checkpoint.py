"""The server side's checkpoint (atoll.fl.checkpoint) and a workflow resumed from it: the
format (atomic commits, damage named by the digest), and FedAvg / FedOpt runs interrupted after
a round, resumed in a new context, ending on the uninterrupted run's model."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from atoll.fl import checkpoint
from atoll.fl.app_config import FedAvgArgs, FedOptArgs
from atoll.fl.model import Model
from atoll.fl.runner import _resume
from atoll.fl.serde import load_file
from atoll.fl.workflows import FedAvg
from atoll.fl.workflows.api import Context, Workflow
from atoll.fl.workflows.fedopt import FedOpt
from atoll.fl.workflows.rounds import WorkflowError

from .helpers import run_workflow


def _state(seed: float) -> dict:
    return {"model": {"w": np.arange(6, dtype=np.float64).reshape(2, 3) * seed,
                      "b": np.float32(seed)},
            "moments": [np.ones(3) * seed, {"v": np.zeros(2, np.int64)}],
            "round": 3, "best": [2, 0.5], "note": None, "flag": True}


def test_a_state_comes_back_as_it_was_saved(tmp_path):
    size = checkpoint.save(tmp_path, 3, _state(2.0))
    round_, state = checkpoint.load(tmp_path)
    assert round_ == 3 and size == (tmp_path / "round-3.safetensors").stat().st_size
    np.testing.assert_array_equal(state["model"]["w"], _state(2.0)["model"]["w"])
    assert state["model"]["b"].dtype == np.float32 and float(state["model"]["b"]) == 2.0
    np.testing.assert_array_equal(state["moments"][0], np.ones(3) * 2.0)
    assert state["moments"][1]["v"].dtype == np.int64
    assert {k: state[k] for k in ("round", "best", "note", "flag")} == {
        "round": 3, "best": [2, 0.5], "note": None, "flag": True}


def test_no_checkpoint_yet_is_none_and_a_new_one_replaces_the_old(tmp_path):
    assert checkpoint.load(tmp_path) is None
    checkpoint.save(tmp_path, 1, _state(1.0))
    checkpoint.save(tmp_path, 2, _state(5.0))
    round_, state = checkpoint.load(tmp_path)
    assert round_ == 2 and float(state["model"]["b"]) == 5.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json",
                                                           "round-2.safetensors"]


def test_a_write_that_fails_midway_leaves_the_last_commit_whole(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, 1, _state(1.0))
    real_replace = os.replace

    def killed(src, dst):  # the process dies before the rename: a temporary file is left
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 2, _state(9.0))
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    round_, state = checkpoint.load(tmp_path)
    assert round_ == 1 and float(state["model"]["b"]) == 1.0
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest"])
def test_damage_is_named_never_half_restored(tmp_path, damage):
    checkpoint.save(tmp_path, 4, _state(1.0))
    state_file = tmp_path / "round-4.safetensors"
    if damage == "flip":
        data = bytearray(state_file.read_bytes())
        data[-3] ^= 0x40  # one bit of an array: the decoder alone would not notice
        state_file.write_bytes(bytes(data))
    elif damage == "truncate":
        state_file.write_bytes(state_file.read_bytes()[:-8])
    elif damage == "remove":
        state_file.unlink()
    else:
        (tmp_path / "checkpoint.json").write_text('{"round": 4, "fi')
    with pytest.raises(checkpoint.CheckpointDamaged, match="damaged|cannot be read"):
        checkpoint.load(tmp_path)


def test_objects_that_are_not_arrays_or_json_are_refused(tmp_path):
    with pytest.raises(TypeError, match="holds a set"):
        checkpoint.save(tmp_path, 1, {"model": {"w": {1, 2}}})


# --- a workflow resumed -----------------------------------------------------------------------

def _sites(shifts):
    def site(name):
        def handler(topic, model):
            if topic == "validate":
                return Model(metrics={"accuracy": float(model.params["w"].sum())}, num_examples=2)
            return Model(params={"w": model.params["w"] * 0.5 + shifts[name] * model.round},
                         num_examples={"a": 3, "b": 1}[name], metrics={"loss": 1.0 / model.round})
        return handler
    return {name: site(name) for name in shifts}


class _Killed(Exception):
    pass


def _runner(workflow_class, folder, resume=None, stop_after=None):
    """The server runner's path (fl/runner.py) on the in-memory channel with a checkpoint
    folder; ``stop_after``: the server "dies" once that round's checkpoint is committed."""

    def run(channel, args, initial, job_args):
        channel.checkpoint_dir = folder / "checkpoint"
        ctx = Context(channel, args, initial, {**job_args, "resume": resume})
        if stop_after is not None:
            commit = ctx.checkpoint

            def dying(round_, state):
                commit(round_, state)
                if round_ == stop_after:
                    raise _Killed
            ctx.checkpoint = dying
        workflow = workflow_class(ctx)
        if resume is not None:
            _resume(workflow, ctx, resume)
        try:
            workflow.run()
        finally:
            ctx.close()
    return run


@pytest.mark.parametrize("workflow_class, args", [
    (FedAvg, FedAvgArgs(num_rounds=6, evaluate_every=2, cross_site_eval="none")),
    (FedOpt, FedOptArgs(num_rounds=6, evaluate_every=2, cross_site_eval="none",
                        optimizer="adam", server_lr=0.3, tau=0.01)),
])
def test_a_run_resumed_after_round_3_ends_on_the_uninterrupted_model(tmp_path, workflow_class,
                                                                       args):
    shifts = {"a": 1.0, "b": -0.5}

    def initial():  # fresh arrays each run: the workflow takes the initial model's over
        return Model(params={"w": np.array([1.0, 2.0, -3.0])})

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_workflow(_runner(workflow_class, whole), args, _sites(shifts), whole,
                 initial=initial())
    with pytest.raises(_Killed):
        run_workflow(_runner(workflow_class, cut, stop_after=3), args, _sites(shifts), cut,
                     initial=initial())
    run_workflow(_runner(workflow_class, cut, resume={"attempt": 1, "round": 3}), args,
                 _sites(shifts), cut, initial=initial())
    expected = load_file(whole / "global_model_final.safetensors").params["w"]
    got = load_file(cut / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)  # replies' order: last bits
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    train = sorted((r["round"], r["site"]) for r in rows if r["phase"] == "train")
    assert train == sorted((r, s) for r in range(1, 7) for s in ("a", "b", "global"))
    digests = [json.loads(line)["round"]
               for line in (cut / "model_digests.jsonl").read_text().splitlines()]
    assert digests == [1, 2, 3, 4, 5, 6]


def test_a_missing_checkpoint_the_server_saw_committed_fails_the_resume(tmp_path):
    args = FedAvgArgs(num_rounds=3, evaluate_every=0, cross_site_eval="none")
    with pytest.raises(WorkflowError, match="checkpoint of round 2 is missing"):
        run_workflow(_runner(FedAvg, tmp_path, resume={"attempt": 1, "round": 2}), args,
                     _sites({"a": 1.0}), tmp_path, initial=Model(params={"w": np.ones(2)}))


def test_a_damaged_checkpoint_fails_the_resume_naming_it(tmp_path):
    args = FedAvgArgs(num_rounds=4, evaluate_every=0, cross_site_eval="none")
    with pytest.raises(_Killed):
        run_workflow(_runner(FedAvg, tmp_path, stop_after=2), args, _sites({"a": 1.0}),
                     tmp_path, initial=Model(params={"w": np.ones(2)}))
    state_file = tmp_path / "checkpoint" / "round-2.safetensors"
    state_file.write_bytes(state_file.read_bytes()[:-1] + b"\x01")
    with pytest.raises(WorkflowError, match="state of round 2 is damaged"):
        run_workflow(_runner(FedAvg, tmp_path, resume={"attempt": 1, "round": 2}), args,
                     _sites({"a": 1.0}), tmp_path, initial=Model(params={"w": np.ones(2)}))


def test_a_workflow_without_state_cannot_resume(tmp_path):
    class Plain(Workflow):
        def run(self):
            raise AssertionError("must not run")

    with pytest.raises(WorkflowError, match="keeps no checkpoint"):
        run_workflow(_runner(Plain, tmp_path, resume={"attempt": 1}), {}, _sites({"a": 1.0}),
                     tmp_path)


def test_a_channel_that_sends_checkpoints_home_gets_each_once_committed_before_its_report(
        tmp_path):
    """A server worker whose run folder goes with it (a Pod) sends each checkpoint home
    (worker/grpc_channels.py): the context calls its channel's ``checkpoint_committed`` once the
    checkpoint is on disk and before it reports it, so that the server holds every round it was
    told was committed."""
    seen = []

    def run(channel, args, initial, job_args):
        folder = tmp_path / "checkpoint"
        channel.checkpoint_dir = folder
        reported = channel._federation.events

        def sent_home(round_):
            told = [e["round"] for e in reported if e.get("event") == "checkpoint"]
            seen.append((round_, checkpoint.load(folder)[0], told))
        channel.checkpoint_committed = sent_home
        ctx = Context(channel, args, initial, job_args)
        try:
            FedAvg(ctx).run()
        finally:
            ctx.close()

    args = FedAvgArgs(num_rounds=3, evaluate_every=0, cross_site_eval="none")
    run_workflow(run, args, _sites({"a": 1.0}), tmp_path, initial=Model(params={"w": np.ones(2)}))
    assert seen == [(1, 1, []), (2, 2, [1]), (3, 3, [1, 2])]
