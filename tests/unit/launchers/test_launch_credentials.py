"""Launchers read no environment of their own: the job token and every ``source: env`` secret
value come only from the request's credentials (the site parent read them from its environment
once, launchers/request.py secret_env_values); a missing one is a LaunchError naming it, never a
value. The Slurm launcher watches the time limit render returned, not one read back from argv."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.docker import DockerLauncher
from atoll.launchers.request import build_request, launch_credentials
from atoll.launchers.slurm import SlurmLauncher
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime

JOB_ID = "0123456789abcdef0123456789abcdef"
STUDY = {"secret_env": {"DB_PASSWORD": {"source": "env", "key": "PATHOLOGY_DB_PASSWORD"}}}
VALUE = "pw-" + "x" * 12


def request(tmp_path: Path, launcher: str, credentials: dict[str, str],
            settings: dict[str, Any] | None = None):
    site_config = parse_site_config({"launcher": launcher, launcher: settings or {}})
    runtime = parse_study_runtime({"format_version": 2, "studies": {"pathology": STUDY}},
                                  launcher)
    meta = load_meta({"name": "job", "deploy_map": {"app": ["@ALL"]},
                      "resource_spec": {"@default": {"num_of_cpus": 1, "memory": "1Gi"}}})
    return build_request(meta=meta, identity=JobIdentity(JOB_ID, "job", "pathology", "site-a",
                                                         "site"),
                         site_config=site_config, study_runtime=runtime, workdir=tmp_path,
                         parent_address="127.0.0.1:7001", credentials=credentials,
                         check_capacity=False)


def test_the_credentials_are_the_requests_own(tmp_path: Path) -> None:
    given = {"ATOLL_JOB_TOKEN": "tok", "DB_PASSWORD": VALUE}
    assert launch_credentials(request(tmp_path, "slurm", given)) == given


def test_a_missing_value_is_named_never_looked_up(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHOLOGY_DB_PASSWORD", VALUE)  # in the environment: not used
    monkeypatch.setenv("ATOLL_JOB_TOKEN", "tok-from-env")
    with pytest.raises(LaunchError, match="no value for ATOLL_JOB_TOKEN, DB_PASSWORD") as err:
        launch_credentials(request(tmp_path, "slurm", {}))
    assert VALUE not in str(err.value) and "tok-from-env" not in str(err.value)


def test_the_slurm_launcher_submits_nothing_without_the_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHOLOGY_DB_PASSWORD", VALUE)
    calls: list[list[str]] = []
    launcher = SlurmLauncher(parse_site_config({"launcher": "slurm", "slurm": {}}),
                             lambda argv, timeout: calls.append(list(argv)))  # type: ignore
    try:
        with pytest.raises(LaunchError, match="no value for DB_PASSWORD"):
            launcher.launch(request(tmp_path, "slurm", {"ATOLL_JOB_TOKEN": "tok"}))
    finally:
        launcher.close()
    assert calls == [] and not (tmp_path / "slurm" / "secrets.env").exists()


def test_the_slurm_launcher_watches_the_time_limit_render_returned(tmp_path: Path) -> None:
    def runner(argv, timeout):
        out = "4242\n" if argv[0] == "sbatch" else ""
        return subprocess.CompletedProcess(list(argv), 0, out, "")

    settings = {"time": "1:30:00", "pending_timeout": 600}
    req = request(tmp_path, "slurm", {"ATOLL_JOB_TOKEN": "tok", "DB_PASSWORD": VALUE}, settings)
    launcher = SlurmLauncher(req.site_config, runner)
    try:
        handle = launcher.launch(req)
    finally:
        launcher.close()
    rendered = launcher.render(req)
    assert rendered["limits"] == {"time": "1:30:00", "mem": "1024M"}
    assert rendered["directives"]["time"] == "1:30:00"
    assert (handle.extra["time"], handle.extra["mem"]) == ("1:30:00", "1024M")


def test_the_docker_launcher_creates_nothing_without_the_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    importlib.import_module("docker")  # required: a process this test starts loads it
    monkeypatch.setenv("PATHOLOGY_DB_PASSWORD", VALUE)

    class NoEngine:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine was used ({name})")

    req = request(tmp_path, "docker", {"ATOLL_JOB_TOKEN": "tok"},
                  {"default_image": "python:3.11-slim"})
    with pytest.raises(LaunchError, match="no value for DB_PASSWORD"):
        DockerLauncher(req.site_config, client=NoEngine()).launch(req)
