"""The process launcher refuses datasets that are, hold or lie inside the site kit, as the Docker
launcher does (issue 32, item 7): one rule (spec/kit_paths.py, launchers/lent_folders.py), at
load and again at launch, sandboxed or not."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.process_sandbox import SandboxHost
from atoll.launchers.request import build_request
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import load_study_runtime, parse_study_runtime

JOB_ID = "0123456789abcdef0123456789abcdef"
HOST = SandboxHost("/usr/bin/bwrap", (("/usr", ""),), ("/opt/python3.11", "/srv/venv"))
CASES = [
    pytest.param("kit", id="the-kit"),
    pytest.param("kit/startup", id="inside-the-kit"),
    pytest.param("kit/workspace/jobs", id="every-run-folder"),
    pytest.param(".", id="holds-the-kit"),
]


def kit(tmp_path: Path, sandbox: str, studies: dict[str, Any] | None = None) -> Path:
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True)
    (tmp_path / "kit" / "startup").mkdir()
    (tmp_path / "kit" / "workspace" / "jobs").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    site = {"launcher": "process", "process": {"sandbox": sandbox}}
    (local / "site.yaml").write_text(yaml.safe_dump(site))
    runtime = {"format_version": 2, "studies": studies or {}}
    (local / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))
    return local


def request_with_dataset(local: Path, source: Path) -> Any:
    """A request made without the load-time check (study_runtime parsed with no kit folder)."""
    config = load_site_config(local / "site.yaml")
    runtime = parse_study_runtime({"format_version": 2, "studies": {"imaging": {
        "datasets": {"scans": {"source": str(source), "mode": "ro"}}}}}, "process")
    meta = load_meta({"name": "j", "deploy_map": {"app": ["@ALL"]}})
    return build_request(
        meta=meta, identity=JobIdentity(JOB_ID, "j", "imaging", "site-1", "site"),
        site_config=config, study_runtime=runtime,
        workdir=local.parent / "workspace" / "jobs" / JOB_ID, parent_address="127.0.0.1:7001",
        credentials={"ATOLL_JOB_TOKEN": "t"}, check_capacity=False)


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
@pytest.mark.parametrize("source", CASES)
def test_process_launcher_refuses_a_dataset_of_the_kit(tmp_path: Path, sandbox: str,
                                                       source: str) -> None:
    local = kit(tmp_path, sandbox)
    launcher = ProcessLauncher(load_site_config(local / "site.yaml"), share_cpus=False,
                               sandbox_host=HOST)
    request = request_with_dataset(local, (tmp_path / source).resolve())
    with pytest.raises(LaunchError) as err:
        launcher.render(request)
    assert str(err.value).startswith(
        "local/study_runtime.yaml: studies.imaging.datasets.scans.source: ")
    assert "site kit" in str(err.value) or "every job's run folder" in str(err.value)
    with pytest.raises(LaunchError):  # launch renders first: no worker starts
        launcher.launch(request)


def test_process_launcher_lends_data_beside_the_kit(tmp_path: Path) -> None:
    local = kit(tmp_path, "bwrap")
    launcher = ProcessLauncher(load_site_config(local / "site.yaml"), share_cpus=False,
                               sandbox_host=HOST)
    rendered = launcher.render(request_with_dataset(local, tmp_path / "data"))
    assert rendered["env"]["ATOLL_DATASETS"] == '{"scans": "/data/imaging/scans"}'


@pytest.mark.parametrize("source", [*CASES, pytest.param("link-to-kit", id="a-link-to-it")])
def test_process_study_runtime_with_a_dataset_of_the_kit_fails_to_load(
    tmp_path: Path, source: str
) -> None:
    (tmp_path / "link-to-kit").symlink_to(tmp_path / "kit")
    studies = {"imaging": {"datasets": {"scans": {"source": str(tmp_path / source),
                                                  "mode": "ro"}}}}
    local = kit(tmp_path, "bwrap", studies)
    with pytest.raises(SpecError, match=r"studies\.imaging\.datasets\.scans\.source.*site kit"):
        load_study_runtime(local, "process")


def test_the_folder_of_every_run_folder_is_refused_where_it_lies_outside_the_kit(
        tmp_path: Path) -> None:
    """A site whose run folders are outside its kit: their common folder is the parent's too."""
    from atoll.launchers.lent_folders import refuse_parent_folders

    local = kit(tmp_path, "bwrap")
    runs = tmp_path / "scratch" / "runs"
    request = request_with_dataset(local, tmp_path / "data")
    request = dataclasses.replace(request, workdir=runs / JOB_ID)
    for lent in (runs, runs.parent):  # the folder of all run folders, or one above it
        with pytest.raises(LaunchError, match="the folder of every job's run folder"):
            refuse_parent_folders(PurePosixPath(lent), request, "datasets.scans")
    refuse_parent_folders(PurePosixPath(tmp_path / "data"), request, "datasets.scans")
