"""examples/cyclic: the model visits the sites in the configured order, cycle after cycle."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from atoll.fl.serde import load_file
from atoll.fl.simulator import simulate
from atoll.workflow import WorkflowError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cyclic"
SITES = {"site-a": {}, "site-b": {}, "site-c": {}}

# Each site appends its number to the model's "trail": the final model records the visits as the
# sites saw them, independently of the workflow's own cyclic.json. site-b fails when told to.
TRAIL = """
import numpy as np
import atoll.client as fl

ME = {"site-a": 1, "site-b": 2, "site-c": 3}[fl.site_name()]
fl.init()
while fl.is_running():
    model = fl.receive()
    if ME == 2 and fl.job_args().get("b_fails"):
        raise RuntimeError("site-b's disk is full")
    trail = model.params.get("trail", np.zeros(0))
    fl.send(fl.Model(params={"trail": np.append(trail, ME)}, num_examples=1,
                     metrics={"length": float(len(trail) + 1)}))
"""


def _job(tmp_path: Path, order, cycles: int, b_fails: bool = False) -> Path:
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("__pycache__"))
    (job / "app" / "train.py").write_text(TRAIL)
    app = yaml.safe_load((job / "app" / "app.yaml").read_text())
    app["server"]["args"] = {"num_cycles": cycles, "order": order, "round_timeout": 60}
    app["site"]["config"] = {"b_fails": b_fails}
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    return job


def test_sites_are_visited_in_the_configured_order(tmp_path):
    job = _job(tmp_path, ["site-c", "site-a", "site-b"], cycles=2)
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    assert result.site_errors == {}
    trail = load_file(tmp_path / "results" / "global_model_final.safetensors").params["trail"]
    assert trail.tolist() == [3, 1, 2, 3, 1, 2]
    visits = json.loads((tmp_path / "results" / "cyclic.json").read_text())["visits"]
    assert [(v["cycle"], v["site"]) for v in visits] == [
        (1, "site-c"), (1, "site-a"), (1, "site-b"), (2, "site-c"), (2, "site-a"), (2, "site-b")]
    assert [v["metrics"]["length"] for v in visits] == [1, 2, 3, 4, 5, 6]


def test_a_failing_site_is_skipped_and_the_model_goes_on(tmp_path):
    job = _job(tmp_path, ["site-a", "site-b", "site-c"], cycles=2, b_fails=True)
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    assert "site-b's disk is full" in result.site_errors["site-b"]
    trail = load_file(tmp_path / "results" / "global_model_final.safetensors").params["trail"]
    assert trail.tolist() == [1, 3, 1, 3]
    visits = json.loads((tmp_path / "results" / "cyclic.json").read_text())["visits"]
    # the reason names the site and its error's kind; the error itself is in site_errors
    assert all("site-b dropped out (RuntimeError)" in visits[i]["skipped"] for i in (1, 4))


def test_an_unknown_site_in_the_order_is_named(tmp_path):
    job = _job(tmp_path, ["site-a", "site-x"], cycles=1)
    with pytest.raises(WorkflowError, match=r"order names \['site-x'\]"):
        simulate(job, SITES, results_dir=tmp_path / "results")


def test_the_example_learns_on_the_hospitals(tmp_path):
    importlib.import_module("sklearn")  # required: a process this test starts loads it
    from atoll.demo.data import prepare

    folders = prepare(tmp_path / "data")
    sites = {site: {"records": str(folder)} for site, folder in folders.items()}
    result = simulate(EXAMPLE, sites, results_dir=tmp_path / "results")
    assert result.site_errors == {}
    params = load_file(tmp_path / "results" / "global_model_final.safetensors").params
    with np.load(folders["hospital-1"] / "test.npz") as test:
        logits = test["x"] @ params["w"] + params["b"]
        accuracy = float(np.mean(logits.argmax(axis=1) == test["y"]))
    assert accuracy > 0.8, accuracy
