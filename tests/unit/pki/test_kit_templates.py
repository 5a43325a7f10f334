"""The commented local/ templates parse with the real site parsers, and so do their examples."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from atoll.pki.provision import ProvisionResult
from atoll.pki.templates import site_yaml, study_runtime_yaml
from atoll.spec.site_config import load_site_config, parse_site_config
from atoll.spec.study_runtime import load_study_runtime, parse_study_runtime


def uncomment(text: str, key: str) -> str:
    """Turn the example line ``# <key>: ...`` into a real line (at its indentation)."""
    new, count = re.subn(rf"^(\s*)# ({re.escape(key)}: )", r"\1\2", text, flags=re.M)
    assert count >= 1, f"no commented example for {key!r}"
    return new


def use_examples(text: str) -> str:
    """Replace each ``{}  # e.g. X`` with X."""
    new, count = re.subn(r"\{\}  # e\.g\. (.*)$", r"\1", text, flags=re.M)
    assert count >= 1
    return new


def test_provisioned_local_files_parse(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    for kit in ("server", "hospital-a", "university"):
        assert load_site_config(root / kit).launcher == "process"
    runtime = load_study_runtime(root / "hospital-a" / "local", "process")
    assert sorted(runtime.studies) == ["outcomes", "pathology"]  # no `default` study
    assert runtime.studies["pathology"].datasets == {}


@pytest.mark.parametrize("launcher", ["process", "docker", "k8s", "slurm"])
def test_every_site_yaml_example_is_valid(launcher: str) -> None:
    text = site_yaml().replace("launcher: process", f"launcher: {launcher}")
    for key in (launcher, "capacity", "worker_endpoint"):
        text = uncomment(text, key)
    config = parse_site_config(yaml.safe_load(text))
    assert config.launcher == launcher
    assert getattr(config, launcher) is not None
    assert config.capacity.gpus == 8 and config.capacity.memory == "512Gi"


def test_the_server_template_names_the_server() -> None:
    assert "how this server runs" in site_yaml("server")
    assert parse_site_config(yaml.safe_load(site_yaml("server"))).launcher == "process"


def test_every_study_runtime_example_is_valid() -> None:
    text = uncomment(use_examples(study_runtime_yaml(["pathology", "outcomes"])), "secret_env")
    runtime = parse_study_runtime(yaml.safe_load(text), "process")
    entry = runtime.studies["pathology"]
    assert entry.datasets["slides"].source == "/srv/data/pathology/slides"
    assert entry.datasets["slides"].mode == "ro"
    assert entry.env == {"LOG_LEVEL": "info"}
    assert entry.secret_env["DB_PASSWORD"].key == "PATHOLOGY_DB_PASSWORD"
    with_rules = parse_study_runtime(yaml.safe_load(uncomment(text, "statistics")), "process")
    rules = with_rules.studies["outcomes"].statistics
    assert rules.bounds_of("age") == (0.0, 120.0) and rules.budget() == (4.0, 0.0)
    with_image = uncomment(text, "container")
    runtime = parse_study_runtime(yaml.safe_load(with_image), "docker")
    assert (
        runtime.studies["outcomes"].container.image == "registry.example.org/outcomes-trainer:1.0"
    )


def test_a_site_in_no_study_gets_an_empty_mapping_and_an_example() -> None:
    text = study_runtime_yaml([])
    assert list(parse_study_runtime(yaml.safe_load(text), "process").studies) == ["default"]
    assert "atoll study add-site" in text


def test_a_project_with_named_studies_maps_no_default_study() -> None:
    for studies in ([], ["pathology"]):
        text = study_runtime_yaml(studies, default_study=False)
        assert list(parse_study_runtime(yaml.safe_load(text), "process").studies) == studies


def test_the_authorization_template_is_the_default_policy() -> None:
    from atoll.pki.templates import authorization_json
    from atoll.spec.authorization import default_policy, parse_policy

    policy = parse_policy(json.loads(authorization_json()))
    assert policy.permissions == default_policy().permissions
    assert policy.code_approval == "none"


def test_study_names_yaml_would_misread_stay_strings() -> None:
    text = study_runtime_yaml(["yes", "123", "null"])
    assert list(yaml.safe_load(text)["studies"]) == ["default", "yes", "123", "null"]
