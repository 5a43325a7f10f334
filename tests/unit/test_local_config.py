"""A parent checks its local/ files in a forked child and keeps plain values (local_config.py)."""

from __future__ import annotations

import os

import pytest

from atoll.forked import _single_threaded, run_forked
from atoll.local_config import load_local_config
from atoll.spec.errors import Issue, SpecError
from atoll.spec.site_config import load_site_config


def _fail(issues):
    raise SpecError(issues, source="site.yaml")


def test_the_result_comes_back_from_a_child():
    pid = run_forked(os.getpid)
    if _single_threaded():  # otherwise the function runs here, by design
        assert pid != os.getpid()
    assert run_forked(sorted, [3, 1, 2]) == [1, 2, 3]


def test_a_spec_error_comes_back_with_every_issue():
    issues = [Issue("capacity.gpus", "must be at least 0"), Issue("bogus", "unknown key")]
    with pytest.raises(SpecError) as err:
        run_forked(_fail, issues)
    assert err.value.issues == issues
    assert err.value.source == "site.yaml"
    assert "2 problems" in str(err.value)


def test_plain_values_at_rest_and_the_model_on_first_use(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text(
        "launcher: process\nprocess: {gpu_ids: [0, 1]}\n"
        "capacity: {gpus: 2, memory: 8Gi}\nworker_endpoint: {host: 127.0.0.1, port: 0}\n")
    (local / "study_runtime.yaml").write_text("format_version: 2\nstudies:\n  default: {}\n")
    config = load_local_config(local, study_runtime=True)
    assert config.launcher_name == "process"
    assert config.capacity == {"gpus": 2, "cpus": None, "memory": "8Gi"}
    assert (config.endpoint.dial_host, config.endpoint.port, config.endpoint.uses_tls) == (
        "127.0.0.1", 0, False)
    assert config.site_config == load_site_config(local / "site.yaml")
    assert config.site_config.kit_dir == tmp_path
    assert config.launcher.name == "process"
    assert config.launcher is config.launcher
    config.close()


def test_a_bad_study_runtime_fails_the_start(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: process\n")
    (local / "study_runtime.yaml").write_text("format_version: 2\nstudies: 7\n")
    config = load_local_config(local, study_runtime=True)  # the check runs meanwhile
    with pytest.raises(SpecError, match="study_runtime.yaml"):
        _ = config.launcher_name  # the first value the parent needs: its start fails here
    assert load_local_config(local, study_runtime=False).launcher_name == "process"
