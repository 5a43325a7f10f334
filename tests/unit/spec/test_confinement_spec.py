"""Container confinement at load: study_runtime.yaml and site.yaml may not hand the host to a job.

Every refusal is read from a real file, as the site parent and ``atoll site validate`` read it:
the error names the file and the key's full path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from atoll.cli.site_render import validate_command
from atoll.spec.errors import SpecError
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import load_study_runtime

from .confinement_cases import DOCKER_ALLOWED, DOCKER_REFUSED, POD_ALLOWED, POD_REFUSED, pod_with

BETA = {"datasets": {"slides": {"source": "beta-pvc", "mode": "ro"}}}


def write_kit(tmp_path: Path, launcher: str, studies: dict[str, Any], site: Any = None) -> Path:
    """A site kit folder with local/site.yaml and local/study_runtime.yaml; returns local/."""
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True, exist_ok=True)
    (local / "site.yaml").write_text(yaml.safe_dump(site or {"launcher": launcher}))
    runtime = {"format_version": 2, "studies": studies}
    (local / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))
    return local


def refusal(load: Any, *args: Any) -> SpecError:
    with pytest.raises(SpecError) as err:
        load(*args)
    return err.value


def assert_names(err: SpecError, file: Path, path: str) -> None:
    """The error names the file and the key path, in its fields and in its text."""
    assert err.source == str(file)
    assert path in {i.path for i in err.issues}, [str(i) for i in err.issues]
    text = str(err)
    assert text.startswith(f"{file}: ") and f"  {path}: " in text


# --- docker --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "key"), DOCKER_REFUSED, ids=[k for _, k in DOCKER_REFUSED])
def test_docker_kwargs_refusal_names_the_key_and_the_file(
    tmp_path: Path, kwargs: dict[str, Any], key: str
) -> None:
    local = write_kit(tmp_path, "docker", {"alpha": {"docker_kwargs": kwargs}})
    err = refusal(load_study_runtime, local, "docker")
    assert_names(err, local / "study_runtime.yaml", f"studies.alpha.docker_kwargs.{key}")


@pytest.mark.parametrize(("kwargs", "key"), DOCKER_REFUSED, ids=[k for _, k in DOCKER_REFUSED])
def test_site_run_kwargs_refusal_names_the_key_and_the_file(
    tmp_path: Path, kwargs: dict[str, Any], key: str
) -> None:
    site = {"launcher": "docker", "docker": {"run_kwargs": kwargs}}
    local = write_kit(tmp_path, "docker", {}, site=site)
    err = refusal(load_site_config, local / "site.yaml")
    assert_names(err, local / "site.yaml", f"docker.run_kwargs.{key}")


def test_host_control_messages_say_why_and_what_instead(tmp_path: Path) -> None:
    kwargs = {"devices": [], "security_opt": [], "binds": [], "ipc_mode": "host"}
    local = write_kit(tmp_path, "docker", {"alpha": {"docker_kwargs": kwargs}})
    issues = {i.path: i.message for i in refusal(load_study_runtime, local, "docker").issues}
    at = "studies.alpha.docker_kwargs"
    assert "GPUs come from the job's resource_spec num_of_gpus" in issues[f"{at}.devices"]
    assert "dockerd --seccomp-profile" in issues[f"{at}.security_opt"]
    assert "datasets or secret_mounts" in issues[f"{at}.binds"]
    assert "use private, shareable or none" in issues[f"{at}.ipc_mode"]


def test_docker_kwargs_that_keep_the_job_confined_are_accepted(tmp_path: Path) -> None:
    local = write_kit(tmp_path, "docker", {"alpha": {"docker_kwargs": DOCKER_ALLOWED}})
    assert load_study_runtime(local, "docker").entry("alpha").docker_kwargs == DOCKER_ALLOWED
    site = {"launcher": "docker", "docker": {"run_kwargs": DOCKER_ALLOWED, "network": "host"}}
    local = write_kit(tmp_path, "docker", {}, site=site)
    assert load_site_config(local / "site.yaml").settings.network == "host"  # the site's choice


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("datasets", "kit"),  # the kit itself
        ("datasets", "kit/startup"),  # the private key's folder
        ("datasets", "kit/workspace/jobs"),  # every job's run folder
        ("datasets", "."),  # a folder holding the kit
        ("secret_mounts", "kit/local"),  # the site's own settings
        ("datasets", "link-to-kit"),  # links are followed
    ],
)
def test_docker_binds_of_the_site_kit_are_refused(tmp_path: Path, where: str, source: str) -> None:
    (tmp_path / "link-to-kit").symlink_to(tmp_path / "kit")
    path = str(tmp_path / source)
    entry = (
        {"datasets": {"x": {"source": path, "mode": "ro"}}}
        if where == "datasets"
        else {"secret_mounts": {"x": {"source": path, "mount_path": "/run/secrets/x"}}}
    )
    local = write_kit(tmp_path, "docker", {"alpha": entry})
    err = refusal(load_study_runtime, local, "docker")
    assert_names(err, local / "study_runtime.yaml", f"studies.alpha.{where}.x.source")
    assert "site kit" in str(err)


def test_data_beside_the_kit_is_fine(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    entry = {"datasets": {"x": {"source": str(tmp_path / "data"), "mode": "ro"}}}
    local = write_kit(tmp_path, "docker", {"alpha": entry})
    assert load_study_runtime(local, "docker").entry("alpha").datasets["x"].mode == "ro"


# --- kubernetes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fragment", "path"), POD_REFUSED, ids=[p for _, p in POD_REFUSED])
def test_pod_template_refusal_names_the_key_and_the_file(
    tmp_path: Path, fragment: dict[str, Any], path: str
) -> None:
    studies = {"alpha": {"pod_template": pod_with(fragment)}, "beta": BETA}
    local = write_kit(tmp_path, "k8s", studies)
    err = refusal(load_study_runtime, local, "k8s")
    assert_names(err, local / "study_runtime.yaml", f"studies.alpha.pod_template.{path}")


@pytest.mark.parametrize(("fragment", "path"), POD_REFUSED[:3], ids=[p for _, p in POD_REFUSED[:3]])
def test_pod_template_file_refusal_names_the_template_file_too(
    tmp_path: Path, fragment: dict[str, Any], path: str
) -> None:
    local = write_kit(tmp_path, "k8s", {"alpha": {"pod_template": "templates/pod.yaml"}})
    (local / "templates").mkdir()
    (local / "templates" / "pod.yaml").write_text(yaml.safe_dump(pod_with(fragment)))
    err = refusal(load_study_runtime, local, "k8s")
    assert_names(err, local / "study_runtime.yaml", f"studies.alpha.pod_template.{path}")
    assert str(err).rstrip().endswith("(in local/templates/pod.yaml)")


def test_every_refusal_of_a_template_is_reported_at_once(tmp_path: Path) -> None:
    template: dict[str, Any] = {"kind": "Pod", "spec": {}}
    for fragment, _ in POD_REFUSED:
        for key, value in fragment.get("spec", {}).items():
            if isinstance(value, list):
                template["spec"].setdefault(key, []).extend(value)
            elif key not in template["spec"]:
                template["spec"][key] = value
    local = write_kit(tmp_path, "k8s", {"alpha": {"pod_template": template}, "beta": BETA})
    issues = refusal(load_study_runtime, local, "k8s").issues
    assert len(issues) >= 25
    assert all(i.path.startswith("studies.alpha.pod_template.spec.") for i in issues)


def test_a_confined_template_is_accepted_share_process_namespace_included(tmp_path: Path) -> None:
    local = write_kit(tmp_path, "k8s", {"alpha": {"pod_template": POD_ALLOWED}, "beta": BETA})
    template = load_study_runtime(local, "k8s").entry("alpha").pod_template
    assert template["spec"]["shareProcessNamespace"] is True


# --- atoll site validate -------------------------------------------------------------------------


def test_site_validate_reports_each_refused_key_with_its_file(tmp_path: Path) -> None:
    studies = {"alpha": {"docker_kwargs": {"privileged": True, "pid_mode": "host"}}}
    site = {"launcher": "docker", "docker": {"run_kwargs": {"cap_add": ["SYS_ADMIN"]}}}
    local = write_kit(tmp_path, "docker", studies, site=site)
    result = CliRunner().invoke(validate_command, [str(local.parent), "--format", "json"])
    assert result.exit_code == 2, result.output
    found = {(e["file"], e["path"]) for e in json.loads(result.output)["error"]["problems"]}
    assert (str(local / "site.yaml"), "docker.run_kwargs.cap_add") in found
    runtime = str(local / "study_runtime.yaml")
    assert (runtime, "studies.alpha.docker_kwargs.privileged") in found
    assert (runtime, "studies.alpha.docker_kwargs.pid_mode") in found
