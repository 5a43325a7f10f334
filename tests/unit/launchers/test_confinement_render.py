"""Container confinement at render: the Docker and Kubernetes renders refuse what the spec layer
refuses (even for a request that skipped it) and always emit a confined worker."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.launchers.base import LaunchError
from atoll.launchers.docker_render import render_docker
from atoll.launchers.kubernetes_render import MAIN_CONTAINER, render
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import SecretMount
from tests.unit.launchers.test_docker_render import PATHOLOGY as DOCKER_PATHOLOGY
from tests.unit.launchers.test_docker_render import request_for as docker_request
from tests.unit.launchers.test_k8s_render import PATHOLOGY as K8S_PATHOLOGY
from tests.unit.launchers.test_k8s_render import main_container
from tests.unit.launchers.test_k8s_render import request_for as k8s_request
from tests.unit.spec.confinement_cases import DOCKER_REFUSED, POD_ALLOWED, POD_REFUSED, pod_with

# --- docker --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "key"), DOCKER_REFUSED, ids=[k for _, k in DOCKER_REFUSED])
def test_docker_render_refuses_study_kwargs_naming_key_and_file(
    kwargs: dict[str, Any], key: str
) -> None:
    request = docker_request()
    request.study_runtime.docker_kwargs.update(copy.deepcopy(kwargs))  # past the spec layer
    with pytest.raises(LaunchError) as err:
        render_docker(request)
    assert str(err.value).startswith(
        f"local/study_runtime.yaml: studies.pathology.docker_kwargs.{key}: "
    )


@pytest.mark.parametrize(("kwargs", "key"), DOCKER_REFUSED, ids=[k for _, k in DOCKER_REFUSED])
def test_docker_render_refuses_site_kwargs_naming_key_and_file(
    kwargs: dict[str, Any], key: str
) -> None:
    request = docker_request()
    request.site_config.settings.run_kwargs.update(copy.deepcopy(kwargs))
    with pytest.raises(LaunchError) as err:
        render_docker(request)
    assert str(err.value).startswith(f"local/site.yaml: docker.run_kwargs.{key}: ")


def test_docker_worker_is_always_confined() -> None:
    site = {"run_kwargs": {"cap_drop": ["NET_RAW"], "user": "0:0"}}
    kwargs = render_docker(docker_request(docker=site))["containers.run"]
    assert kwargs["privileged"] is False
    assert kwargs["cap_drop"] == ["ALL"]  # a site's narrower list cannot leave any in
    assert kwargs["security_opt"] == ["no-new-privileges"]
    for key in ("cap_add", "devices", "pid_mode", "ipc_mode", "userns_mode", "volumes_from",
                "sysctls", "ports", "volumes", "cgroupns", "uts_mode"):
        assert key not in kwargs


def test_docker_worker_binds_only_its_run_folder_and_datasets() -> None:
    request = docker_request()
    mounts = render_docker(request)["containers.run"]["mounts"]
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in mounts] == [
        (str(request.workdir), "/atoll/job", False),
        (DOCKER_PATHOLOGY["datasets"]["slides"]["source"], "/data/pathology/slides", True),
    ]


def test_docker_environment_holds_nothing_of_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOLL_TEST_PARENT_ONLY", "parent-secret-marker")
    rendered = render_docker(docker_request())
    text = yaml.safe_dump(rendered)
    assert "parent-secret-marker" not in text and "tok-SECRET-VALUE" not in text
    assert rendered["secret_env"]["ATOLL_JOB_TOKEN"] == "credential of this job, set at launch"


def test_docker_gpus_only_as_asked() -> None:
    none = {"@default": {"num_of_gpus": 0, "num_of_cpus": 1}}
    kwargs = render_docker(docker_request(resource_spec=none))["containers.run"]
    assert kwargs["device_requests"] == []
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    two = {"@default": {"num_of_gpus": 2, "num_of_cpus": 1}}
    kwargs = render_docker(docker_request(resource_spec=two))["containers.run"]
    assert kwargs["device_requests"][0]["device_ids"] == ["0", "1"]
    assert "NVIDIA_VISIBLE_DEVICES" not in kwargs["environment"]


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("datasets", "kit"),
        ("datasets", "kit/startup"),
        ("datasets", "kit/workspace/jobs/other-job"),
        ("secret_mounts", "kit/local"),
        ("secret_mounts", ""),  # a folder holding the kit
    ],
)
def test_docker_render_refuses_binds_of_the_kit(tmp_path: Path, where: str, source: str) -> None:
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True)
    (local / "site.yaml").write_text("launcher: docker\n")
    # A site.yaml loaded from its kit knows that kit's folder.
    request = replace(docker_request(), site_config=load_site_config(local / "site.yaml"))
    path = str(tmp_path / source).rstrip("/")
    if where == "datasets":
        request.study_runtime.datasets["slides"].source = path
    else:
        request.study_runtime.secret_mounts["x"] = SecretMount(source=path, mount_path="/s")
    with pytest.raises(LaunchError) as err:
        render_docker(request)
    assert str(err.value).startswith(f"local/study_runtime.yaml: studies.pathology.{where}.")
    assert "the site kit" in str(err.value)


def test_docker_render_refuses_binds_of_other_jobs_run_folders() -> None:
    request = docker_request()
    request.study_runtime.datasets["slides"].source = str(request.workdir.parent)
    with pytest.raises(LaunchError, match=r"datasets\.slides\.source: .*every job's run folder"):
        render_docker(request)


# --- kubernetes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fragment", "path"), POD_REFUSED, ids=[p for _, p in POD_REFUSED])
def test_k8s_render_refuses_template_keys_naming_path_and_file(
    fragment: dict[str, Any], path: str
) -> None:
    request = k8s_request(
        study={"datasets": {"beta": {"source": "beta-pvc", "mode": "ro"}}}
    )
    request.study_runtime.pod_template = pod_with(copy.deepcopy(fragment))  # past the spec layer
    with pytest.raises(LaunchError) as err:
        render(request)
    message = str(err.value)
    assert message.startswith("local/study_runtime.yaml: studies.pathology.pod_template ")
    assert f"studies.pathology.pod_template.{path}: " in message


def test_k8s_worker_is_always_confined() -> None:
    template = copy.deepcopy(POD_ALLOWED)
    request = k8s_request(study={**K8S_PATHOLOGY, "pod_template": template})
    pod = render(request)["pod"]
    worker = main_container(pod)["securityContext"]
    assert worker["privileged"] is False and worker["allowPrivilegeEscalation"] is False
    assert worker["capabilities"] == {"drop": ["ALL", "NET_RAW"]}
    assert worker["readOnlyRootFilesystem"] is True  # the template's own stays
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "Localhost"  # the site's
    plain = render(k8s_request())["pod"]
    assert plain["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert main_container(plain)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_k8s_pod_reaches_nothing_of_the_node() -> None:
    study = {**K8S_PATHOLOGY, "pod_template": copy.deepcopy(POD_ALLOWED)}
    pod = render(k8s_request(study=study))["pod"]
    spec = pod["spec"]
    assert not any(spec.get(k) for k in ("hostPID", "hostIPC"))
    assert not any("hostPath" in v for v in spec["volumes"])
    for c in spec["containers"]:
        assert not (c.get("securityContext") or {}).get("privileged")
        assert not any(p.get("hostPort") for p in c.get("ports") or [])


def test_k8s_token_travels_only_through_the_jobs_secret() -> None:
    rendered = render(k8s_request())
    env = {e["name"]: e for e in main_container(rendered["pod"])["env"]}
    token = env["ATOLL_JOB_TOKEN"]
    assert "value" not in token
    assert token["valueFrom"]["secretKeyRef"]["name"] == rendered["secret"]["metadata"]["name"]
    assert "tok-SECRET-VALUE" not in yaml.safe_dump(rendered)


def test_k8s_gpus_only_as_asked() -> None:
    none = {"@default": {"num_of_gpus": 0, "num_of_cpus": 1}}
    pod = render(k8s_request(resource_spec=none))["pod"]
    main = main_container(pod)
    assert "nvidia.com/gpu" not in main["resources"]["limits"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in main["env"]
    one = {"@default": {"num_of_gpus": 1, "num_of_cpus": 1}}
    main = main_container(render(k8s_request(resource_spec=one))["pod"])
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert not any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in main["env"])


def test_k8s_service_account_token_refused_even_when_the_site_names_an_account() -> None:
    request = k8s_request(k8s={"namespace": "fl", "host_network": True, "service_account": "w"})
    request.study_runtime.pod_template = pod_with(
        {"spec": {"serviceAccountName": "atoll-parent", "automountServiceAccountToken": True,
                  "containers": [{"name": MAIN_CONTAINER}]}}
    )
    with pytest.raises(LaunchError) as err:
        render(request)
    assert "pod_template.spec.serviceAccountName: set by the launcher" in str(err.value)
    assert "pod_template.spec.automountServiceAccountToken: not allowed" in str(err.value)
