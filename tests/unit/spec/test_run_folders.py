"""The one rule for where run folders live (spec/run_folders.py), and which sites run their
workers with the parent's rights (spec/study_runtime.py's unconfined_* checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atoll.spec.run_folders import (
    fetch_scratch,
    resolve_runs_root,
    run_folder,
    runs_root,
    runs_setting,
    server_run_folder,
)
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import (
    is_unconfined,
    parse_study_runtime,
    unconfined_issues,
    unconfined_studies,
)

KIT = Path("/kits/hospital-a")
WORKSPACE = Path("/state/hospital-a")  # kit.yaml's workspace, not <kit>/workspace
JOB = "a" * 32


def site(doc):
    return parse_site_config(doc, kit_dir=KIT)


@pytest.mark.parametrize(("doc", "root"), [
    ({"launcher": "process"}, WORKSPACE),
    ({"launcher": "process", "process": {"workdir": "/scratch/runs"}}, Path("/scratch/runs")),
    ({"launcher": "process", "process": {"workdir": "runs"}}, KIT / "runs"),
    ({"launcher": "slurm"}, WORKSPACE),
    ({"launcher": "slurm", "slurm": {"workspace": "/shared/atoll"}}, Path("/shared/atoll")),
    ({"launcher": "docker"}, WORKSPACE),
    ({"launcher": "k8s"}, WORKSPACE),
])
def test_run_folders_follow_the_launchers_setting_else_the_workspace(doc, root):
    config = site(doc)
    assert runs_root(config, WORKSPACE) == root
    assert run_folder(config, WORKSPACE, JOB) == root / "jobs" / JOB
    # what a parent at rest resolves from its check's record, without the SiteConfig: the same
    assert resolve_runs_root(runs_setting(config), KIT, WORKSPACE) == root
    # fetched and checked on the run folders' own file system, so renamed into place
    assert fetch_scratch(config, WORKSPACE).parent == root


def test_the_servers_run_folder_is_inside_its_job_folder():
    assert server_run_folder(WORKSPACE, JOB) == WORKSPACE / "jobs" / JOB / "run" / "server"


def runtime(launcher, studies):
    return parse_study_runtime({"format_version": 2, "studies": studies}, launcher)


@pytest.mark.parametrize(("doc", "studies", "unconfined"), [
    ({"launcher": "process", "process": {"sandbox": "none"}}, {"a": {}, "b": {}}, ["a", "b"]),
    ({"launcher": "process"}, {"a": {}, "b": {}}, []),
    ({"launcher": "slurm"}, {"a": {}, "b": {}}, ["a", "b"]),  # bare is Slurm's default
    ({"launcher": "slurm", "slurm": {"sandbox": "apptainer"}},
     {"a": {}, "b": {"slurm": {"sandbox": "none"}}}, ["b"]),
    ({"launcher": "slurm"},
     {"a": {"slurm": {"sandbox": "pyxis"}}, "b": {"slurm": {"sandbox": "apptainer"}}}, []),
    ({"launcher": "docker"}, {"a": {}, "b": {}}, []),
])
def test_which_studies_run_with_the_parents_rights(doc, studies, unconfined):
    config = site(doc)
    mapped = runtime(config.launcher, studies)
    assert unconfined_studies(config, mapped) == unconfined
    issues = unconfined_issues(config, mapped)
    assert bool(issues) == bool(unconfined)
    if issues and config.launcher == "slurm":
        assert issues[0].path == "studies"
        assert f"the workers of {', '.join(unconfined)} run as bare Slurm jobs" \
            in issues[0].message


def test_one_unconfined_study_is_allowed():
    config = site({"launcher": "slurm"})
    assert unconfined_issues(config, runtime("slurm", {"a": {}})) == []
    assert is_unconfined(config)
    assert not is_unconfined(site({"launcher": "slurm", "slurm": {"sandbox": "apptainer"}}))
