"""study_runtime.yaml as NVIDIA FLARE 2.9 parses it (app_opt/job_launcher/study_runtime.py,
docs/design/study_runtime_config.md; its tests study_runtime_test.py). Ids name the behaviour.
Render-level effects are in the per-backend compat tests."""

from __future__ import annotations

from typing import Any

import pytest

from atoll.spec.errors import SpecError
from atoll.spec.study_runtime import parse_study_runtime


def parse(launcher: str, **entry: Any):
    return parse_study_runtime({"format_version": 2, "studies": {"lung": entry}},
                               launcher).entry("lung")


def refused(launcher: str, **entry: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse(launcher, **entry)
    return [i.path for i in info.value.issues]


@pytest.mark.parametrize("launcher", ["docker", "k8s", "slurm"])
def test_parse_dataset_type_mount_is_the_default(launcher):
    source = "lung-pvc" if launcher == "k8s" else "/srv/data/lung"
    entry = parse(launcher, datasets={"ref": {"type": "mount", "source": source, "mode": "ro"}})
    assert entry.datasets["ref"].source == source


def test_parse_dataset_type_databricks_is_reserved_not_supported():
    paths = refused("k8s", datasets={"ref": {"type": "databricks", "source": "x", "mode": "ro"}})
    assert paths == ["studies.lung.datasets.ref.type"]


def test_parse_dataset_unknown_type_is_refused():
    paths = refused("docker", datasets={"ref": {"type": "s3", "source": "/x", "mode": "ro"}})
    assert paths == ["studies.lung.datasets.ref.type"]


@pytest.mark.parametrize("launcher", ["docker", "k8s"])
def test_parse_secret_mount_mode_ro_is_accepted(launcher):
    source = "db-ca" if launcher == "k8s" else "/srv/secrets/db-ca"
    entry = parse(launcher, secret_mounts={"db-ca": {"source": source, "mode": "ro",
                                                     "mount_path": "/run/secrets/db-ca"}})
    assert entry.secret_mounts["db-ca"].mode == "ro"


def test_parse_secret_mount_mode_rw_is_refused():
    paths = refused("k8s", secret_mounts={"db": {"source": "db", "mode": "rw",
                                                 "mount_path": "/run/db"}})
    assert paths == ["studies.lung.secret_mounts.db.mode"]


@pytest.mark.parametrize("launcher", ["docker", "slurm"])
def test_parse_secret_mount_items_are_kubernetes_only(launcher):
    paths = refused(launcher, secret_mounts={"db": {"source": "/srv/db", "items": {"a": "a"},
                                                    "mount_path": "/run/db"}},
                    **({"slurm": {"sandbox": "apptainer"}} if launcher == "slurm" else {}))
    assert paths == ["studies.lung.secret_mounts.db.items"]


def test_parse_secret_mount_empty_items_are_refused():
    paths = refused("k8s", secret_mounts={"db": {"source": "db", "items": {},
                                                 "mount_path": "/run/db"}})
    assert paths == ["studies.lung.secret_mounts.db.items"]


@pytest.mark.parametrize(("launcher", "ref"), [
    pytest.param("docker", {"source": "LUNG_DB_USER", "key": "unused"},
                 id="docker-source-is-the-parent-variable"),
    pytest.param("slurm", {"source": "LUNG_DB_USER"}, id="slurm-source-only"),
    pytest.param("process", {"source": "LUNG_DB_USER"}, id="process-source-only"),
    pytest.param("docker", {"source": "env", "key": "LUNG_DB_USER"},
                 id="atoll-source-env-keeps-working"),
])
def test_parse_secret_env_flare_forms_read_the_parent_environment(launcher, ref):
    secret = parse(launcher, secret_env={"DB_USER": ref}).secret_env["DB_USER"]
    assert (secret.source, secret.key) == ("env", "LUNG_DB_USER")


def test_parse_secret_env_k8s_needs_secret_and_key():
    assert refused("k8s", secret_env={"DB_USER": {"source": "study-db"}}) == [
        "studies.lung.secret_env.DB_USER.key"]


def test_parse_env_in_both_env_and_secret_env_is_refused():
    paths = refused("docker", env={"DB": "x"}, secret_env={"DB": {"source": "DB_VAR"}})
    assert paths == ["studies.lung.secret_env.DB"]


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_parse_env_value_must_be_a_scalar(value):
    assert refused("docker", env={"X": value}) == ["studies.lung.env.X"]


@pytest.mark.parametrize("launcher", ["docker", "k8s"])
def test_parse_env_empty_value_is_refused_off_slurm(launcher):
    assert refused(launcher, env={"X": ""}) == ["studies.lung.env.X"]


def test_parse_env_pythonpath_is_launcher_owned():
    assert refused("docker", env={"PYTHONPATH": "/x"}) == ["studies.lung.env.PYTHONPATH"]


def test_parse_inline_pod_template_with_another_kind_is_refused():
    assert refused("k8s", pod_template={"kind": "Deployment"}) == ["studies.lung.pod_template"]


@pytest.mark.parametrize(("field", "value", "launcher"), [
    pytest.param("pod_template", {"spec": {}}, "docker", id="pod_template-is-k8s-only"),
    pytest.param("docker_kwargs", {"shm_size": "8g"}, "k8s", id="docker_kwargs-is-docker-only"),
    pytest.param("slurm", {"sandbox": "none"}, "docker", id="slurm-is-slurm-only"),
])
def test_parse_launcher_mismatched_keys_are_refused(field, value, launcher):
    assert refused(launcher, **{field: value}) == [f"studies.lung.{field}"]


@pytest.mark.parametrize("sandbox", ["apptainer", "pyxis", "none"])
def test_parse_slurm_sandboxes(sandbox):
    assert parse("slurm", slurm={"sandbox": sandbox}).slurm.sandbox == sandbox


def test_parse_slurm_unknown_sandbox_is_refused():
    assert refused("slurm", slurm={"sandbox": "docker"}) == ["studies.lung.slurm.sandbox"]


def test_parse_slurm_setup_may_be_empty():
    assert parse("slurm", slurm={"setup": ""}).slurm.setup == ""


@pytest.mark.parametrize("launcher", ["docker", "k8s", "slurm"])
def test_require_env_name_lowercase_posix_names_are_accepted(launcher):
    assert parse(launcher, env={"http_proxy": "http://proxy:3128"}).env == {
        "http_proxy": "http://proxy:3128"}


@pytest.mark.parametrize("value", [
    pytest.param("a\0b", id="study_runtime-env-value-NUL"),
    pytest.param("\ud800", id="study_runtime-env-value-not-utf8"),
])
@pytest.mark.parametrize("launcher", ["docker", "slurm"])
def test_require_utf8_text_env_values_without_nul(launcher, value):
    assert refused(launcher, env={"X": value}) == ["studies.lung.env.X"]


def test_explicit_slurm_sandbox_none_rejects_secret_mounts():
    paths = refused("slurm", slurm={"sandbox": "none"},
                    secret_mounts={"tls": {"source": "/secrets/tls", "mount_path": "/run/tls"}})
    assert paths == ["studies.lung.secret_mounts"]
