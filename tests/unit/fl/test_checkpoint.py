"""The server side's checkpoint (atoll.fl.checkpoint) and a workflow resumed from it: the
format (atomic commits, damage named by the digest), and FedAvg / FedOpt / scatter_gather /
examples/cyclic runs interrupted after a round, resumed in a new context, ending as the
uninterrupted run ends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from atoll.fl import checkpoint
from atoll.fl.app_config import FedAvgArgs, FedOptArgs, ScatterGatherArgs
from atoll.fl.model import Model
from atoll.fl.runner import _resume
from atoll.fl.serde import load_file
from atoll.fl.workflows import FedAvg
from atoll.fl.workflows.api import Context, Workflow
from atoll.fl.workflows.fedopt import FedOpt
from atoll.fl.workflows.rounds import WorkflowError
from atoll.fl.workflows.scatter_gather import ScatterGather

from .helpers import run_workflow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _state(seed: float) -> dict:
    return {"model": {"w": np.arange(6, dtype=np.float64).reshape(2, 3) * seed,
                      "b": np.float32(seed)},
            "moments": [np.ones(3) * seed, {"v": np.zeros(2, np.int64)}],
            "round": 3, "best": [2, 0.5], "note": None, "flag": True}


def test_a_state_comes_back_as_it_was_saved(tmp_path):
    size = checkpoint.save(tmp_path, 3, _state(2.0)).bytes
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


def test_a_round_model_comes_first_once_and_its_digest_is_its_own_files(tmp_path):
    """The workflow's round model leads the file, whole, as its own .safetensors file would be:
    its SHA-256 comes from the write's own pass, and the state's arrays that are the model's
    are stored once."""
    import hashlib

    from atoll.fl.serde import save_file

    state = _state(3.0)
    model = Model(params=state["model"], round=3, metrics={"loss": 0.5}, meta={"total": 9})
    saved = checkpoint.save(tmp_path, 3, state, model)
    save_file(model, tmp_path / "alone.safetensors")
    alone = (tmp_path / "alone.safetensors").read_bytes()
    assert saved.model_sha256 == hashlib.sha256(alone).hexdigest()
    raw = (tmp_path / "round-3.safetensors").read_bytes()
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    assert raw[:manifest["model_bytes"]] == alone and manifest["bytes"] == saved.bytes == len(raw)
    assert manifest["sha256"] == hashlib.sha256(raw).hexdigest()
    once = checkpoint.save(tmp_path / "plain", 3, state).bytes  # the same state, no model named
    assert saved.bytes < once + len(alone) - state["model"]["w"].nbytes  # w is not stored twice
    round_, back = checkpoint.load(tmp_path)
    assert round_ == 3
    np.testing.assert_array_equal(back["model"]["w"], state["model"]["w"])
    assert back["model"]["b"].dtype == np.float32 and float(back["model"]["b"]) == 3.0
    np.testing.assert_array_equal(back["moments"][0], np.ones(3) * 3.0)
    assert {k: back[k] for k in ("round", "best", "note", "flag")} == {
        "round": 3, "best": [2, 0.5], "note": None, "flag": True}


@pytest.mark.parametrize("where", ["model", "state"])
def test_damage_to_either_part_of_a_model_first_checkpoint_is_named(tmp_path, where):
    state = _state(1.0)
    checkpoint.save(tmp_path, 2, state, Model(params=state["model"]))
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    path = tmp_path / "round-2.safetensors"
    data = bytearray(path.read_bytes())
    data[manifest["model_bytes"] - 2 if where == "model" else -3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointDamaged, match="damaged"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("model_bytes", [-1, True, "8", 10**9])
def test_a_manifest_whose_model_part_is_out_of_the_file_is_damaged(tmp_path, model_bytes):
    state = _state(1.0)
    checkpoint.save(tmp_path, 2, state, Model(params=state["model"]))
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    manifest["model_bytes"] = model_bytes
    (tmp_path / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointDamaged, match="checkpoint.json is damaged"):
        checkpoint.load(tmp_path)


def _writes_seen(monkeypatch, direct_fails: str = "") -> list[tuple[int, bool]]:
    """Each os.write of the checkpoint module: its length, and whether O_DIRECT was on. A
    direct write, with ``direct_fails`` "refused", fails as on a filesystem without O_DIRECT;
    with "short", writes only its first half."""
    import errno
    import fcntl

    seen, real = [], os.write

    def write(fd, data):
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        seen.append((len(data), direct))
        if direct and direct_fails == "refused":
            raise OSError(errno.EINVAL, "Invalid argument")
        if direct and direct_fails == "short" and len(data) > 4096:
            return real(fd, memoryview(data)[:len(data) // 8192 * 4096])
        return real(fd, data)

    monkeypatch.setattr(checkpoint.os, "write", write)
    return seen


def _big_state() -> tuple[dict, Model]:
    """A model over one buffer of the direct writer, of a size no block divides."""
    rng = np.random.default_rng(7)
    params = {"w": rng.random(2_300_001, dtype=np.float32), "b": rng.random(3, dtype=np.float32)}
    return {"global": params, "note": "x"}, Model(params=params, round=5)


def _direct_io_works(folder: Path) -> bool:
    try:
        fd = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    (folder / "probe").unlink()
    return True


def test_a_state_file_is_written_past_the_page_cache_and_reads_back_whole(tmp_path, monkeypatch):
    """Nothing reads a checkpoint but a resume: its state file goes to the disk with O_DIRECT
    (filling new page-cache pages was most of its cost), whole blocks, cut to its size."""
    import hashlib

    state, model = _big_state()
    seen = _writes_seen(monkeypatch)
    saved = checkpoint.save(tmp_path, 5, state, model)
    raw = (tmp_path / "round-5.safetensors").read_bytes()
    assert len(raw) == saved.bytes and saved.bytes % 4096 != 0 and saved.bytes > 8 * 2**20
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(raw).hexdigest()
    state_writes = seen[:-1]  # the last write is checkpoint.json's, through the page cache
    if _direct_io_works(tmp_path):
        assert state_writes and all(direct and n % 4096 == 0 for n, direct in state_writes)
    else:  # this filesystem has no O_DIRECT: the same bytes through the page cache
        assert not any(direct for _, direct in state_writes)
    round_, back = checkpoint.load(tmp_path)
    assert round_ == 5 and back["note"] == "x"
    np.testing.assert_array_equal(back["global"]["w"], state["global"]["w"])


@pytest.mark.parametrize("fails", ["refused", "short"])
def test_a_filesystem_whose_direct_writes_fail_gets_the_same_bytes(tmp_path, monkeypatch, fails):
    import hashlib

    state, model = _big_state()
    checkpoint.save(tmp_path / "plain", 5, state, model)
    seen = _writes_seen(monkeypatch, fails)
    saved = checkpoint.save(tmp_path / "refused", 5, state, model)
    monkeypatch.undo()
    assert (tmp_path / "refused" / "round-5.safetensors").read_bytes() == (
        tmp_path / "plain" / "round-5.safetensors").read_bytes()
    assert saved.model_sha256 == hashlib.sha256(
        (tmp_path / "refused" / "round-5.safetensors").read_bytes()[
            :json.loads((tmp_path / "refused" / "checkpoint.json").read_text())["model_bytes"]]
    ).hexdigest()
    assert not any(direct for _, direct in seen[1:])  # failed once, then the page cache
    np.testing.assert_array_equal(checkpoint.load(tmp_path / "refused")[1]["global"]["w"],
                                  state["global"]["w"])


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

            def dying(round_, state, **how):
                commit(round_, state, **how)
                if round_ == stop_after:  # killed once that round's checkpoint is committed
                    ctx.settle_checkpoint()
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


def test_a_restart_during_the_cross_site_evaluation_evaluates_only_the_rest(tmp_path):
    """The evaluation after the last round is checkpointed row by row: resumed after its first
    model, the job asks the sites for the other models only, and ends on the same table."""
    args = FedAvgArgs(num_rounds=2, evaluate_every=0, cross_site_eval="all")
    shifts = {"a": 1.0, "b": -0.5}
    asked: list[str] = []

    def counted():
        sites = _sites(shifts)

        def site(name):
            def handler(topic, model):
                if topic == "validate":
                    asked.append(name)
                return sites[name](topic, model)
            return handler
        return {name: site(name) for name in sites}

    def initial():
        return Model(params={"w": np.array([1.0, 2.0, -3.0])})

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_workflow(_runner(FedAvg, whole), args, counted(), whole, initial=initial())
    rows = len(json.loads((whole / "cross_site_eval.json").read_text())["table"])
    assert rows == 3 and len(asked) == 2 * rows  # the final model and both sites' own

    def runner_dying_after_the_first_row(channel, args, initial, job_args):
        channel.checkpoint_dir = cut / "checkpoint"
        ctx = Context(channel, args, initial, job_args)
        commit, commits = ctx.checkpoint, []

        def dying(round_, state, **how):
            commit(round_, state, **how)
            commits.append(round_)
            if len(commits) == 3:  # rounds 1 and 2, then the first model's row
                ctx.settle_checkpoint()
                raise _Killed
        ctx.checkpoint = dying
        try:
            FedAvg(ctx).run()
        finally:
            ctx.close()

    with pytest.raises(_Killed):
        run_workflow(runner_dying_after_the_first_row, args, counted(), cut, initial=initial())
    asked.clear()
    run_workflow(_runner(FedAvg, cut, resume={"attempt": 1, "round": 2}), args, counted(), cut,
                 initial=initial())
    assert len(asked) == 2 * (rows - 1)  # the row saved before the restart is not asked again
    table = json.loads((cut / "cross_site_eval.json").read_text())["table"]
    assert table == json.loads((whole / "cross_site_eval.json").read_text())["table"]


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


def test_scatter_gather_resumed_after_round_2_records_each_round_once(tmp_path):
    args = ScatterGatherArgs(num_rounds=4, payload_bytes=600)
    seen = []

    def echo(topic, model):
        seen.append(model.current_round)
        return Model(params=dict(model.params), metrics={"ok": 1.0})

    sites = {"a": echo, "b": echo}
    with pytest.raises(_Killed):
        run_workflow(_runner(ScatterGather, tmp_path, stop_after=2), args, sites, tmp_path)
    resumed = run_workflow(_runner(ScatterGather, tmp_path, resume={"attempt": 1, "round": 2}),
                           args, sites, tmp_path)
    assert sorted(seen) == [1, 1, 2, 2, 3, 3, 4, 4]  # nothing sent twice, nothing skipped
    report = json.loads((tmp_path / "scatter_gather.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4]
    assert all(sorted(r["replies"]) == ["a", "b"] and r["replies"]["a"]["echoed"]
               for r in report["rounds"])
    assert [e["round"] for e in resumed.events if e["event"] == "round"] == [3, 4]


def test_cyclic_resumed_after_visit_4_ends_on_the_uninterrupted_trail(tmp_path):
    from atoll.fl.runner import _workflow_args, load_workflow_class

    app = EXAMPLES / "cyclic" / "app"
    cyclic = load_workflow_class(app, "cyclic_workflow.py", "Cyclic")
    args = _workflow_args(cyclic, {"num_cycles": 2, "order": ["c", "a", "b"]}, "app.yaml")

    def trail(me):
        def handler(topic, model):
            before = model.params.get("trail", np.zeros(0))
            return Model(params={"trail": np.append(before, me)}, num_examples=1,
                         metrics={"length": float(len(before) + 1)})
        return handler

    sites = {"a": trail(1), "b": trail(2), "c": trail(3)}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_workflow(_runner(cyclic, whole), args, sites, whole)
    with pytest.raises(_Killed):
        run_workflow(_runner(cyclic, cut, stop_after=4), args, sites, cut)
    run_workflow(_runner(cyclic, cut, resume={"attempt": 1, "round": 4}), args, sites, cut)
    final = load_file(cut / "global_model_final.safetensors").params["trail"]
    assert final.tolist() == [3, 1, 2, 3, 1, 2]
    assert final.tolist() == load_file(whole / "global_model_final.safetensors").params[
        "trail"].tolist()
    visits = json.loads((cut / "cyclic.json").read_text())["visits"]
    assert [(v["cycle"], v["site"], v["metrics"]["length"]) for v in visits] == [
        (1, "c", 1), (1, "a", 2), (1, "b", 3), (2, "c", 4), (2, "a", 5), (2, "b", 6)]


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


def test_without_a_checkpoint_folder_each_round_model_is_still_stated(tmp_path):
    """FedAvg's round digest runs with the checkpoint's work, and still where no checkpoint is
    kept: each round's once, reported and in model_digests.jsonl, the last the final model's."""
    from atoll.pki.provenance import file_digest

    args = FedAvgArgs(num_rounds=3, evaluate_every=0, cross_site_eval="none")

    def run(channel, args, initial, job_args):
        ctx = Context(channel, args, initial, job_args)
        assert ctx._checkpoints is None
        try:
            FedAvg(ctx).run()
        finally:
            ctx.close()

    federation = run_workflow(run, args, _sites({"a": 1.0, "b": 2.0}), tmp_path,
                              initial=Model(params={"w": np.ones(4, np.float32)}))
    stated = [(e["round"], e["model_digest"]) for e in federation.events
              if e.get("event") == "round_model"]
    assert [r for r, _ in stated] == [1, 2, 3]
    lines = (tmp_path / "model_digests.jsonl").read_text().splitlines()
    assert [(json.loads(line)["round"], json.loads(line)["digest"]) for line in lines] == stated
    assert stated[-1][1] == file_digest(tmp_path / "global_model_final.safetensors")
