"""The in-process simulator: job folders, crashing site scripts, the scatter_gather workflow."""

from __future__ import annotations

import json
import textwrap

import pytest

from atoll.fl.simulator import Federation, SimulationError, simulate
from atoll.fl.workflows import WorkflowError

ECHO = """
import atoll.client as fl
fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.site_name() == "{crash}" and model.current_round == 2:
        raise RuntimeError("disk full")
    fl.send(fl.Model(params=model.params, num_examples=1))
"""


def _job(tmp_path, workflow_args, crash="", deploy=None):
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text(
        json.dumps({"name": "t", "deploy_map": deploy or {"app": ["@ALL"]}})
    )
    (job / "app" / "app.yaml").write_text(
        f"server: {{workflow: scatter_gather, args: {json.dumps(workflow_args)}}}\n"
        "site: {script: echo.py}\n"
    )
    (job / "app" / "echo.py").write_text(textwrap.dedent(ECHO.format(crash=crash)))
    return job


def test_scatter_gather_sends_the_payload_and_gathers_every_echo(tmp_path):
    job = _job(tmp_path, {"num_rounds": 2, "payload_bytes": 100_000})
    result = simulate(job, {"a": {}, "b": {}, "c": {}}, results_dir=tmp_path / "out")
    report = json.loads((tmp_path / "out" / "scatter_gather.json").read_text())
    assert len(report["rounds"]) == 2
    for entry in report["rounds"]:
        assert {s: r["echoed"] for s, r in entry["replies"].items()} == {
            "a": True,
            "b": True,
            "c": True,
        }
        assert all(r["params"] == {"payload": 100_000} for r in entry["replies"].values())
    assert [e["round"] for e in result.events if e["event"] == "round"] == [1, 2]


def test_a_crashing_site_script_is_a_drop_out_with_its_traceback(tmp_path):
    job = _job(tmp_path, {"num_rounds": 3, "min_clients": 1}, crash="b")
    result = simulate(job, {"a": {}, "b": {}}, results_dir=tmp_path / "out")
    assert "RuntimeError: disk full" in result.site_errors["b"]
    assert 'echo.py", line' in result.site_errors["b"]  # the script's own frame
    rounds = json.loads((tmp_path / "out" / "scatter_gather.json").read_text())["rounds"]
    assert rounds[1]["failed"] == {"b": "b dropped out (RuntimeError)"}
    assert list(rounds[2]["replies"]) == ["a"]


def test_the_workflow_error_surfaces(tmp_path):
    job = _job(tmp_path, {"num_rounds": 3}, crash="b")
    # Site a's reply may come before b's drop-out or not: once b is out the round cannot reach
    # min_clients, and the workflow stops waiting for a.
    with pytest.raises(
        WorkflowError,
        match=r"round 2: [01] site.*min_clients is 2.*b: b dropped out \(RuntimeError\)",
    ):
        simulate(job, {"a": {}, "b": {}}, results_dir=tmp_path / "out")


def test_job_folder_problems_are_named(tmp_path):
    with pytest.raises(SimulationError, match="meta.json: missing"):
        simulate(tmp_path, {"a": {}})
    job = _job(tmp_path, {}, deploy={"app": ["server", "a"]})
    with pytest.raises(SimulationError, match="deploy_map gives no app to site"):
        simulate(job, {"a": {}, "b": {}})


def test_a_task_to_a_dropped_site_is_answered_with_the_error(tmp_path):
    federation = Federation(["a", "b"], tmp_path)
    federation.drop("b", "b: worker exited with code 1")
    task = federation.send(["a", "b"], "train", {}, [b"x"])
    federation.site_channel("a").reply(federation.site_channel("a").receive().task_id, {}, [b"y"])
    replies = {r.site: r for r in federation.replies(task, timeout=5)}
    assert replies["b"].error == "b: worker exited with code 1"
    assert b"".join(replies["a"].chunks) == b"y"


def test_a_relative_results_dir_is_the_callers(tmp_path, monkeypatch):
    """The sites run in the app folder; results_dir="out" still means the caller's ./out."""
    job = _job(tmp_path, {"num_rounds": 1})
    monkeypatch.chdir(tmp_path)
    result = simulate("job", {"a": {}}, results_dir="out")
    assert result.results_dir == tmp_path / "out"
    assert (tmp_path / "out" / "scatter_gather.json").is_file()
    assert not (job / "app" / "out").exists()


def test_the_site_scripts_libraries_are_imported_once_before_the_threads(tmp_path):
    """Libraries that import lazily (transformers) break when first imported by several site
    threads at once; the simulator imports a script's top-level libraries first, but leaves
    the app folder's own modules (and a missing library) to the script."""
    import sys

    from atoll.fl.simulator import preload_imports

    app = tmp_path / "app"
    app.mkdir()
    (app / "helper_mod_xyz.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    script = app / "train.py"
    script.write_text("import helper_mod_xyz\nimport no_such_library_xyz\n"
                      "from email.mime import text\nimport colorsys as c\n")
    sys.modules.pop("colorsys", None)
    sys.path.insert(0, str(app))
    try:
        preload_imports(script, app)
    finally:
        sys.path.remove(str(app))
    assert "colorsys" in sys.modules and "email.mime.text" in sys.modules
    assert not (tmp_path / "imported").exists() and "helper_mod_xyz" not in sys.modules


TURNS = """
import sys, time
import atoll.client as fl
state = sys.modules.setdefault("turns_probe_state", type(sys)("turns_probe_state"))
if not hasattr(state, "busy"):
    state.busy, state.overlaps = set(), []
fl.init()
while fl.is_running():
    model = fl.receive()
    state.busy.add(fl.site_name())
    if len(state.busy) > 1:
        state.overlaps.append(sorted(state.busy))
    time.sleep(0.05)  # a step of training: long enough for another site's to begin beside it
    state.busy.discard(fl.site_name())
    fl.send(fl.Model(params=model.params, num_examples=1))
"""


def test_site_scripts_take_turns_between_their_waits(tmp_path):
    """Two sites' training never runs at once in one process (libraries keep process-wide
    state: accelerate's, which a Hugging Face TrainingArguments resets); each still gets every
    task, and gives its turn up while it waits."""
    import sys

    job = _job(tmp_path, {"num_rounds": 3})
    (job / "app" / "echo.py").write_text(TURNS)
    try:
        result = simulate(job, {"a": {}, "b": {}, "c": {}}, results_dir=tmp_path / "out")
        overlaps = sys.modules["turns_probe_state"].overlaps
    finally:
        sys.modules.pop("turns_probe_state", None)
    assert not result.site_errors
    assert [e["round"] for e in result.events if e["event"] == "round"] == [1, 2, 3]
    assert overlaps == []
