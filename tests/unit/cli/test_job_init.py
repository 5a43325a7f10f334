"""`atoll job init` writes job folders that run as written (checked in the simulator)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from atoll.cli.job_init import init_command
from atoll.fl.app_config import load_app_config
from atoll.fl.simulator import simulate

SITES = {"site-1": {}, "site-2": {}}


def _init(tmp_path, *args):
    result = CliRunner().invoke(init_command, [str(tmp_path / "job"), *args])
    assert result.exit_code == 0, result.output
    return tmp_path / "job"


@pytest.mark.parametrize("workflow", ["fedavg", "fedopt", "fedprox"])
def test_numpy_templates_train(tmp_path, workflow):
    job = _init(tmp_path, "--workflow", workflow)
    meta = json.loads((job / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["@ALL"]} and meta["name"] == "job"
    simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["final_validation"]["accuracy"] > 0.8  # the synthetic task is learnable
    assert (tmp_path / "results" / "training_curves.png").exists()


def test_torch_template_trains(tmp_path):
    importlib.import_module("torch")  # required: a process this test starts loads it
    job = _init(tmp_path, "--framework", "torch", "--sites", "site-1,site-2")
    assert json.loads((job / "meta.json").read_text())["deploy_map"] == {
        "app": ["server", "site-1", "site-2"]
    }
    simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["final_validation"]["accuracy"] > 0.8


def test_scatter_gather_template_echoes(tmp_path):
    job = _init(tmp_path, "--workflow", "scatter_gather")
    simulate(job, SITES, results_dir=tmp_path / "results")
    result = json.loads((tmp_path / "results" / "scatter_gather.json").read_text())
    assert {site: r["echoed"] for site, r in result["rounds"][0]["replies"].items()} == {
        "site-1": True,
        "site-2": True,
    }


def test_custom_template_runs_its_own_workflow_class(tmp_path):
    job = _init(tmp_path, "--workflow", "custom")
    assert "class MyFedAvg(Workflow)" in (job / "app" / "my_workflow.py").read_text()
    config, _ = load_app_config(job / "app")
    assert config.server.workflow == "my_workflow.py:MyFedAvg"
    simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert 1 <= summary["rounds"] <= 5 and summary["best_loss"] < 0.6
    assert (tmp_path / "results" / "global_model_final.safetensors").is_file()


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(
    ("template", "example"),
    [
        ("scaffold_workflow.py", "scaffold/app/scaffold_workflow.py"),
        ("scaffold.py", "scaffold/app/scaffold.py"),
        ("cyclic_workflow.py", "cyclic/app/cyclic_workflow.py"),
        ("cyclic_model.py", "cyclic/app/model.py"),
        ("statistics_workflow.py", "statistics/app/statistics_workflow.py"),
    ],
)
def test_shipped_workflow_templates_are_the_examples_own(template, example):
    from importlib import resources

    text = resources.files("atoll.fl").joinpath("templates", f"{template}.tmpl").read_text()
    assert text == (EXAMPLES / example).read_text(), f"copy examples/{example} over the template"


def test_scaffold_template_trains(tmp_path):
    job = _init(tmp_path, "--workflow", "scaffold")
    assert (job / "app" / "scaffold.py").is_file()
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    assert result.site_errors == {}
    accuracy = [e["metrics"]["accuracy"] for e in result.events if e.get("event") == "round"]
    assert len(accuracy) == 5 and accuracy[-1] > accuracy[0] and accuracy[-1] > 0.5


def test_cyclic_template_trains(tmp_path):
    job = _init(tmp_path, "--workflow", "cyclic")
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    assert result.site_errors == {}
    visits = json.loads((tmp_path / "results" / "cyclic.json").read_text())["visits"]
    assert [v["site"] for v in visits] == ["site-1", "site-2"] * 3


def test_stats_template_counts(tmp_path):
    job = _init(tmp_path, "--workflow", "stats")
    result = simulate(job, SITES, results_dir=tmp_path / "results")
    assert result.site_errors == {}
    stats = json.loads((tmp_path / "results" / "statistics.json").read_text())
    assert stats["columns"]["age"]["global"]["count"] == 400
    assert (tmp_path / "results" / "histograms.png").is_file()


def test_the_written_app_yaml_validates(tmp_path):
    job = _init(tmp_path, "--workflow", "fedopt")
    config, args = load_app_config(job / "app")
    assert config.server.workflow == "fedopt" and args.num_rounds == 5 and args.round_timeout == 600


def test_a_non_empty_folder_is_not_overwritten(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "notes.txt").write_text("mine")
    result = CliRunner().invoke(init_command, [str(tmp_path / "job")])
    assert result.exit_code != 0 and "is not empty" in result.output
    assert CliRunner().invoke(init_command, [str(tmp_path / "job"), "--force"]).exit_code == 0


def test_reserved_site_names_are_refused(tmp_path):
    result = CliRunner().invoke(init_command, [str(tmp_path / "job"), "--sites", "server"])
    assert result.exit_code == 2 and "not a site name: server" in result.output


def test_torch_ddp_template_trains_in_one_process(tmp_path):
    """The simulator runs each site as one process (rank 0 of 1): the same script, no DDP.
    With two ranks per site in a real federation: tests/integration/federation/
    test_distributed_site.py."""
    importlib.import_module("torch")  # required: a process this test starts loads it
    job = _init(tmp_path, "--framework", "torch-ddp")
    meta = json.loads((job / "meta.json").read_text())
    assert meta["launcher_spec"]["default"]["slurm"] == {"processes_per_node": 2}
    simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["final_validation"]["accuracy"] > 0.8


@pytest.mark.parametrize("framework,ranks", [("torch-ddp", 2), ("lightning", 2), ("torch", None),
                                             ("numpy", None), ("hf", None), ("hf-lora", None)])
def test_only_the_templates_written_for_ranks_ask_for_them(tmp_path, framework, ranks):
    """A script not written for several ranks never runs several times: its job asks none."""
    meta = json.loads((_init(tmp_path, "--framework", framework) / "meta.json").read_text())
    asked = {backend: spec.get("processes_per_node")
             for backend, spec in meta.get("launcher_spec", {}).get("default", {}).items()}
    if ranks is None:
        assert asked == {}
    else:
        assert asked == dict.fromkeys(("process", "docker", "k8s", "slurm"), ranks)


def _with_mu(job, mu: float):
    app = job / "app" / "app.yaml"
    app.write_text(app.read_text().replace("mu: 0.01", f"mu: {mu}"))
    assert f"mu: {mu}" in app.read_text()
    return job


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_the_fedprox_template_applies_the_proximal_term(tmp_path, framework):
    """mu = 0 trains exactly as the FedAvg template does; mu > 0 changes every site's update
    and keeps it nearer the global model (the proximal term's whole point)."""
    if framework == "torch":
        importlib.import_module("torch")  # required: a process this test starts loads it
    from atoll.fl.serde import load_file

    def final(name: str, workflow: str, mu: float | None = None) -> dict:
        folder = tmp_path / name
        folder.mkdir()
        job = _init(folder, "--workflow", workflow, "--framework", framework)
        if mu is not None:
            _with_mu(job, mu)
        simulate(job, SITES, results_dir=folder / "results")
        return load_file(folder / "results" / "global_model_final.safetensors").params, folder

    fedavg, _ = final("fedavg", "fedavg")
    same, _ = final("mu0", "fedprox", 0.0)
    strong, strong_dir = final("mu1", "fedprox", 1.0)
    for name, value in fedavg.items():
        np.testing.assert_allclose(same[name], value, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(strong[name], value) for name, value in fedavg.items())
    rows = [json.loads(line) for line in (strong_dir / "results" / "metrics.jsonl").read_text()
            .splitlines()]
    terms = [r["metrics"]["proximal_term"] for r in rows
             if r["phase"] == "train" and r["site"] != "global" and r["round"] > 1]
    assert terms and all(t > 0 for t in terms)  # the sites moved, and paid for it


def test_only_the_fedprox_template_carries_fedprox_code(tmp_path):
    for workflow in ("fedavg", "fedopt"):
        script = (_init(tmp_path / workflow, "--workflow", workflow) / "app" / "train.py")
        assert "fedprox" not in script.read_text() and "proximal" not in script.read_text()
