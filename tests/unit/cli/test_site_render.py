from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.site_render import render_command, validate_command

SEED = Path(__file__).parents[2] / "fixtures/seed"


@pytest.fixture
def kit(tmp_path):
    local = tmp_path / "hospital-a" / "local"
    local.mkdir(parents=True)
    shutil.copy(SEED / "site_process.yaml", local / "site.yaml")
    shutil.copy(SEED / "study_runtime_process.yaml", local / "study_runtime.yaml")
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(SEED / "meta.json", job / "meta.json")
    return local.parent, job


def run(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def test_render_json_for_the_folder_named_site(kit):
    site_dir, job = kit
    result = run(render_command, site_dir, job, "--study", "pathology", "--job-id", "a" * 32,
                 "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["site"], out["launcher"], out["job_id"]) == ("hospital-a", "process", "a" * 32)
    assert out["resources"] == {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"}
    assert out["render"]["memory_limit_bytes"] == 68719476736
    assert out["render"]["env"]["ATOLL_SITE"] == "hospital-a"


def test_render_text_and_site_override(kit):
    site_dir, job = kit
    result = run(render_command, site_dir, job, "--study", "pathology", "--site", "server")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("site server (launcher process), study pathology, job ")
    assert "resources: 0 GPU(s), 4 CPU(s), memory 64Gi" in result.output
    assert "CUDA_VISIBLE_DEVICES: ''" in result.output


def test_render_lists_every_problem_with_exit_code_2(kit):
    site_dir, job = kit
    (site_dir / "local" / "site.yaml").write_text("launcher: process\nprocess: {gpu_idz: [0]}\n")
    (site_dir / "local" / "study_runtime.yaml").write_text("format_version: 3\nstudies: {}\n")
    (job / "meta.json").write_text(json.dumps({"name": "j", "deploy_map": {}}))
    result = run(render_command, site_dir, job, "--study", "pathology", "--format", "json")
    assert result.exit_code == 2
    errors = json.loads(result.output)["error"]["problems"]
    assert {e["path"] for e in errors} == {"process.gpu_idz", "format_version", "deploy_map"}


def test_render_a_job_this_site_can_never_run(kit):
    site_dir, job = kit
    result = run(render_command, site_dir, job, "--study", "pathology", "--site", "university")
    assert result.exit_code == 2
    assert "resource_spec.num_of_gpus: asks 8 GPU(s); this site has 2" in result.output


def test_validate_ok_and_errors(kit):
    site_dir, _ = kit
    ok = run(validate_command, site_dir)
    assert ok.exit_code == 0
    lines = ok.output.splitlines()
    assert lines[0] == "local/site.yaml: ok (launcher process)"
    assert lines[1].startswith("process sandbox: bwrap (") and "a test sandbox started" in lines[1]
    assert lines[2] == ("process network: isolated: each worker reaches its parent, its job's "
                        "own ranks and nothing else")
    assert lines[3] == "local/study_runtime.yaml: ok; studies: pathology"
    (site_dir / "local" / "site.yaml").write_text("launcher: docker\nprocess: {}\n")
    with open(site_dir / "local" / "study_runtime.yaml", "a") as f:
        f.write("    pod_template: {kind: Pod}\n")
    bad = run(validate_command, site_dir)
    assert bad.exit_code == 2
    assert "local/site.yaml: process: settings for the process launcher" in bad.output
    # The study runtime is still checked, against docker: the launcher the file asks for.
    assert "studies.pathology.pod_template: pod_template is read by the k8s launcher(s), but " \
        "this site's launcher is docker: remove it" in bad.output


def test_validate_tries_the_sandbox_and_names_the_opt_out(kit):
    site_dir, _ = kit
    site_yaml = site_dir / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text().replace("{python:", "{bwrap: /bin/false, python:"))
    bad = run(validate_command, site_dir)
    assert bad.exit_code == 2
    assert "local/site.yaml: process.sandbox: bwrap (/bin/false) could not make a sandbox" \
        in bad.output
    assert "`process: {sandbox: none}`" in bad.output


def test_validate_shows_the_allowed_destinations_and_the_opt_out(kit):
    site_dir, _ = kit
    site_yaml = site_dir / "local" / "site.yaml"
    original = site_yaml.read_text()
    site_yaml.write_text(original.replace(
        "{python:", '{network: {allow: ["mlflow.example.org:5000"]}, python:'))
    ok = run(validate_command, site_dir)
    assert ok.exit_code == 0, ok.output
    assert ("process network: isolated: each worker reaches its parent, its job's own ranks "
            "and mlflow.example.org:5000") in ok.output
    site_yaml.write_text(original.replace("{python:", "{network: host, python:"))
    ok = run(validate_command, site_dir)
    assert "process network: host (network: host): workers reach every port" in ok.output
    site_yaml.write_text(original.replace("{python:", '{network: {allow: ["10.1.2.3:80"]}, python:'))
    bad = run(validate_command, site_dir)
    assert bad.exit_code == 2
    assert "process.network.allow[0]: '10.1.2.3:80': name the destination by its host name" \
        in bad.output


def test_an_unconfined_site_maps_one_study_at_most(kit):
    site_dir, _ = kit
    site_yaml = site_dir / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text().replace("{python:", "{sandbox: none, python:"))
    ok = run(validate_command, site_dir)
    assert ok.exit_code == 0, ok.output
    assert "process sandbox: none: workers run with the parent's privileges" in ok.output
    assert "process network: host (sandbox: none)" in ok.output
    with open(site_dir / "local" / "study_runtime.yaml", "a") as f:
        f.write("  outcomes: {}\n")
    bad = run(validate_command, site_dir)
    assert bad.exit_code == 2
    assert ("local/study_runtime.yaml: studies: maps 2 studies (outcomes, pathology) while "
            "site.yaml sets process.sandbox: none") in bad.output


def test_render_shows_the_run_folder_the_running_site_makes(kit):
    from atoll.spec.run_folders import run_folder
    from atoll.spec.site_config import load_site_config

    site_dir, job = kit
    out = json.loads(run(render_command, site_dir, job, "--study", "pathology", "--job-id",
                         "a" * 32, "--format", "json").output)
    config = load_site_config(site_dir / "local" / "site.yaml")
    expected = run_folder(config, site_dir / "workspace", "a" * 32)
    assert out["run_folder"] == str(expected) == f"/var/lib/atoll/hospital-a/jobs/{'a' * 32}"
    assert out["render"]["env"]["ATOLL_WORKDIR"] == str(expected)
    server = json.loads(run(render_command, site_dir, job, "--study", "pathology", "--job-id",
                            "a" * 32, "--site", "server", "--format", "json").output)
    assert server["run_folder"] == str(site_dir.resolve() / "workspace" / "jobs" / ("a" * 32)
                                       / "run" / "server")


def test_validate_refuses_a_bare_slurm_site_with_two_studies(kit):
    site_dir, _ = kit
    (site_dir / "local" / "site.yaml").write_text("launcher: slurm\n")
    (site_dir / "local" / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  pathology: {}\n  outcomes: {}\n")
    bad = run(validate_command, site_dir)
    assert bad.exit_code == 2, bad.output
    assert ("local/study_runtime.yaml: studies: maps 2 studies (outcomes, pathology) while the "
            "workers of outcomes, pathology run as bare Slurm jobs") in bad.output
    (site_dir / "local" / "site.yaml").write_text("launcher: slurm\nslurm: {sandbox: apptainer}\n")
    ok = run(validate_command, site_dir)
    assert ok.exit_code == 0, ok.output
    assert ("slurm sandbox: apptainer: each worker sees its run folder and its study's datasets "
            "only") in ok.output
    (site_dir / "local" / "site.yaml").write_text("launcher: slurm\n")
    (site_dir / "local" / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  pathology: {}\n")
    ok = run(validate_command, site_dir)
    assert ok.exit_code == 0, ok.output
    assert ("slurm sandbox: none: workers run as bare Slurm jobs with the parent's rights, one "
            "study at most") in ok.output


def test_validate_records_files_that_pass_so_the_next_start_skips_their_check(kit):
    from atoll.parent.local_config import load_local_config
    from atoll.parent.local_record import RECORD_FILE

    site_dir, _ = kit
    record = site_dir / "workspace" / RECORD_FILE
    (site_dir / "local" / "site.yaml").write_text("launcher: process\nprocess: {gpu_idz: [0]}\n")
    assert run(validate_command, site_dir).exit_code == 2
    assert not record.exists()  # nothing recorded for files that fail
    shutil.copy(SEED / "site_process.yaml", site_dir / "local" / "site.yaml")
    assert run(validate_command, site_dir).exit_code == 0
    assert record.is_file()
    config = load_local_config(site_dir / "local", True, site_dir / "workspace")
    assert config._checked().site_yaml is not None  # the record stood for the start's check
    assert config.launcher_name == "process"
