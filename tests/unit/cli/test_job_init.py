"""`atoll job init` writes job folders that run as written (checked in the simulator)."""

from __future__ import annotations

import json

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
    pytest.importorskip("torch")
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
    pytest.importorskip("torch")
    job = _init(tmp_path, "--framework", "torch-ddp")
    meta = json.loads((job / "meta.json").read_text())
    assert meta["launcher_spec"]["default"]["slurm"] == {"processes_per_node": 2}
    simulate(job, SITES, results_dir=tmp_path / "results")
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["final_validation"]["accuracy"] > 0.8
