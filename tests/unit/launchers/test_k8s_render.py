"""The Kubernetes launcher's pure half: Pod and Secret manifests (golden files) and their rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.kubernetes import KubernetesLauncher
from atoll.launchers.kubernetes_render import (
    LOCKED,
    MAIN_CONTAINER,
    PLACEHOLDER,
    job_labels,
    label_value,
    pod_name,
    render,
    secret_name,
)
from atoll.launchers.request import build_request
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.golden import assert_golden

JOB_ID = "0123456789abcdef0123456789abcdef"
TOKEN = "tok-SECRET-VALUE"
SEED_RESOURCES = {
    "@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"},
    "server": {"num_of_gpus": 0},
    "university": {"num_of_gpus": 8},
}
PATHOLOGY: dict[str, Any] = {
    "container": {"image": "registry.example.com/pathology-trainer:1.0"},
    "datasets": {"slides": {"source": "pathology-data-pvc", "mode": "ro"}},
    "secret_env": {
        "DB_USER": {"source": "pathology-db", "key": "username"},
        "DB_PASSWORD": {"source": "pathology-db", "key": "password"},
    },
}
SITE = {"namespace": "fl-jobs", "host_network": True}


def request_for(
    site: str = "hospital-a",
    *,
    k8s: dict[str, Any] | None = None,
    study: dict[str, Any] | None = None,
    resource_spec: dict[str, Any] | None = None,
    launcher_spec: dict[str, Any] | None = None,
    parent: str = "127.0.0.1:7001",
    job_name: str = "pathology-fedavg",
) -> Any:
    """A LaunchRequest built the way the site parent builds it, from parsed documents."""
    site_config = parse_site_config({"launcher": "k8s", "k8s": SITE if k8s is None else k8s})
    runtime = parse_study_runtime(
        {"format_version": 2, "studies": {"pathology": PATHOLOGY if study is None else study}},
        "k8s",
    )
    meta = load_meta(
        {
            "name": job_name,
            "deploy_map": {"app": ["@ALL"]},
            "resource_spec": SEED_RESOURCES if resource_spec is None else resource_spec,
            "launcher_spec": launcher_spec or {},
        }
    )
    identity = JobIdentity(
        JOB_ID, job_name, "pathology", site, "server" if site == "server" else "site"
    )
    return build_request(
        meta=meta,
        identity=identity,
        site_config=site_config,
        study_runtime=runtime,
        workdir=Path("/srv/atoll/hospital-a/workspace/jobs") / JOB_ID,
        parent_address=parent,
        credentials={"ATOLL_JOB_TOKEN": TOKEN},
        check_capacity=False,
    )


def main_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == MAIN_CONTAINER)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main_container(pod)["env"]}


# --- the seed's example --------------------------------------------------------------------------


def test_seed_hospital_golden() -> None:
    rendered = render(request_for())
    assert_golden("k8s/seed_hospital_a", rendered)
    container = main_container(rendered["pod"])
    quantities = {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert container["resources"] == {"requests": quantities, "limits": quantities}
    assert container["image"] == "registry.example.com/pathology-trainer:1.0"


def test_seed_pathology_pvc_is_read_only_at_the_study_path() -> None:
    pod = render(request_for())["pod"]
    claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [
        {
            "name": "atoll-data-slides",
            "persistentVolumeClaim": {"claimName": "pathology-data-pvc", "readOnly": True},
        }
    ]
    mounts = [m for m in main_container(pod)["volumeMounts"] if m["name"] == "atoll-data-slides"]
    assert mounts == [
        {"name": "atoll-data-slides", "mountPath": "/data/pathology/slides", "readOnly": True}
    ]


def test_seed_secret_env_are_two_secret_key_refs() -> None:
    env = env_of(render(request_for())["pod"])
    assert env["DB_USER"] == {"secretKeyRef": {"name": "pathology-db", "key": "username"}}
    assert env["DB_PASSWORD"] == {"secretKeyRef": {"name": "pathology-db", "key": "password"}}


def test_seed_server_and_university_golden() -> None:
    server, university = render(request_for("server")), render(request_for("university"))
    assert_golden("k8s/seed_server", server)
    assert_golden("k8s/seed_university", university)
    assert "nvidia.com/gpu" not in main_container(server["pod"])["resources"]["limits"]
    assert server["pod"]["metadata"]["labels"]["atoll.dev/role"] == "server"
    assert main_container(university["pod"])["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_rendered_objects_load_into_the_client_models() -> None:
    rendered = render(request_for(study={**PATHOLOGY, "pod_template": TEMPLATE}))
    client = ApiClient()
    pod = client._ApiClient__deserialize(rendered["pod"], "V1Pod")
    secret = client._ApiClient__deserialize(rendered["secret"], "V1Secret")
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert pod.spec.tolerations[0].key == "nvidia.com/gpu"
    assert secret.string_data == {"ATOLL_JOB_TOKEN": PLACEHOLDER}
    # What the client would send equals what we rendered: no field was lost in the models.
    assert client.sanitize_for_serialization(pod) == rendered["pod"]


# --- secrets -------------------------------------------------------------------------------------


def test_no_secret_value_in_any_rendered_object() -> None:
    rendered = render(request_for())
    assert TOKEN not in json.dumps(rendered)
    assert rendered["secret"]["stringData"] == {"ATOLL_JOB_TOKEN": PLACEHOLDER}
    assert env_of(rendered["pod"])["ATOLL_JOB_TOKEN"] == {
        "secretKeyRef": {"name": secret_name("hospital-a", JOB_ID), "key": "ATOLL_JOB_TOKEN"}
    }


def test_secret_mounts_are_read_only_secret_volumes() -> None:
    study = {**PATHOLOGY, "secret_mounts": {"db-ca": {"source": "db-ca", "mount_path": "/etc/db"}}}
    pod = render(request_for(study=study))["pod"]
    assert {"name": "atoll-secret-db-ca", "secret": {"secretName": "db-ca"}} in pod["spec"][
        "volumes"
    ]
    assert {"name": "atoll-secret-db-ca", "mountPath": "/etc/db", "readOnly": True} in (
        main_container(pod)["volumeMounts"]
    )


def test_worker_environment() -> None:
    env = env_of(render(request_for())["pod"])
    atoll = {k: v for k, v in env.items() if k.startswith("ATOLL_") and k != "ATOLL_JOB_TOKEN"}
    assert atoll == {
        "ATOLL_DATA_ROOT": "/data/pathology",
        "ATOLL_JOB_ID": JOB_ID,
        "ATOLL_PARENT": "127.0.0.1:7001",
        "ATOLL_RESULTS_HOME": "send",  # the emptyDir goes with the Pod: results travel
        "ATOLL_ROLE": "site",
        "ATOLL_SITE": "hospital-a",
        "ATOLL_STUDY": "pathology",
        "ATOLL_WORKDIR": "/atoll/job",
    }


# --- names and labels ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("site", "expected"),
    [
        ("hospital-a", "atoll-hospital-a-0123456789ab"),
        ("Hospital_A.East", "atoll-hospital-a-east-0123456789ab"),
        ("x-_", "atoll-x-0123456789ab"),
        ("s" * 63, "atoll-" + "s" * 38 + "-0123456789ab"),
    ],
)
def test_pod_names_are_rfc1123_labels(site: str, expected: str) -> None:
    name = pod_name(site, JOB_ID)
    assert name == expected
    assert len(secret_name(site, JOB_ID)) <= 63


def test_labels_name_job_site_study_and_are_valid_values() -> None:
    labels = job_labels(JobIdentity(JOB_ID, "x", "pathology", "Site_A.", "site"))
    assert labels["atoll.dev/job-id"] == JOB_ID
    assert labels["atoll.dev/site"] == "Site_A"
    assert labels["atoll.dev/study"] == "pathology"
    assert label_value("-" * 70) == ""


def test_free_text_job_name_goes_to_an_annotation_only() -> None:
    pod = render(request_for(job_name="Lung nodules, round 2 (ünï)"))["pod"]
    assert pod["metadata"]["annotations"] == {"atoll.dev/job-name": "Lung nodules, round 2 (ünï)"}


# --- template ------------------------------------------------------------------------------------

TEMPLATE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"labels": {"team": "pathology"}},
    "spec": {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": MAIN_CONTAINER,
                "imagePullPolicy": "Never",
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "securityContext": {"runAsNonRoot": True},
            },
            {"name": "log-shipper", "image": "registry.example.com/shipper:1"},
        ],
    },
}


def test_template_fields_kept_and_atoll_fields_applied_on_top() -> None:
    pod = render(request_for(study={**PATHOLOGY, "pod_template": TEMPLATE}))["pod"]
    assert_golden("k8s/pathology_with_template", pod)
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert pod["metadata"]["labels"]["team"] == "pathology"
    assert pod["metadata"]["labels"]["atoll.dev/job-id"] == JOB_ID
    assert [c["name"] for c in pod["spec"]["containers"]] == [MAIN_CONTAINER, "log-shipper"]
    main = main_container(pod)
    assert main["imagePullPolicy"] == "Never" and main["securityContext"]["runAsNonRoot"]
    assert env_of(pod)["NCCL_DEBUG"] == "INFO"
    assert TEMPLATE["spec"]["containers"][0].get("image") is None  # the study's copy is untouched


LOCKED_TEMPLATE: dict[str, Any] = {
    "kind": "Pod",
    "metadata": {"name": "mine", "namespace": "other", "labels": {"atoll.dev/job-id": "x"}},
    "spec": {
        "restartPolicy": "Always",
        "hostNetwork": True,
        "volumes": [{"name": "atoll-work", "emptyDir": {}}],
        "containers": [
            {
                "name": MAIN_CONTAINER,
                "image": "mine:1",
                "command": ["sh"],
                "resources": {"limits": {"cpu": "64"}},
                "env": [{"name": "ATOLL_JOB_ID", "value": "x"}, {"name": "OK", "value": "1"}],
                "volumeMounts": [{"name": "v", "mountPath": "/data/other"}],
            }
        ],
    },
}
LOCKED_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.labels.atoll.dev/job-id",
    "spec.restartPolicy",
    "spec.hostNetwork",
    "spec.volumes[0].name",
    "spec.containers[0].image",
    "spec.containers[0].command",
    "spec.containers[0].resources",
    "spec.containers[0].env[0].name",
    "spec.containers[0].volumeMounts[0].mountPath",
)


def with_template(template: dict[str, Any]) -> Any:
    """A request whose template skipped the load-time check (as if built some other way)."""
    request = request_for()
    request.study_runtime.pod_template = template
    return request


def test_template_locked_fields_reported_all_at_once_at_load() -> None:
    with pytest.raises(SpecError) as err:
        request_for(study={**PATHOLOGY, "pod_template": LOCKED_TEMPLATE})
    paths = {i.path for i in err.value.issues}
    assert paths == {f"studies.pathology.pod_template.{p}" for p in LOCKED_PATHS}
    assert len(LOCKED) >= 10  # the documented list


def test_template_locked_fields_reported_all_at_once_at_render() -> None:
    with pytest.raises(LaunchError) as err:
        render(with_template(LOCKED_TEMPLATE))
    message = str(err.value)
    assert message.startswith("local/study_runtime.yaml: studies.pathology.pod_template ")
    for path in LOCKED_PATHS:
        assert f"studies.pathology.pod_template.{path}: " in message
    assert "ATOLL_JOB_ID is set by the launcher" in message and "OK " not in message


def test_template_of_the_wrong_shape_is_refused_not_crashed() -> None:
    template = {"kind": "Pod", "spec": {"containers": "atoll-worker", "volumes": [1]}}
    with pytest.raises(SpecError) as err:
        request_for(study={**PATHOLOGY, "pod_template": template})
    assert {i.path for i in err.value.issues} == {
        "studies.pathology.pod_template.spec.containers",
        "studies.pathology.pod_template.spec.volumes",
    }
    with pytest.raises(LaunchError) as err:
        render(with_template(template))
    assert "pod_template.spec.containers: must be a list of mappings" in str(err.value)
    assert "pod_template.spec.volumes: must be a list of mappings" in str(err.value)


def test_template_without_the_worker_container_is_refused() -> None:
    """Several containers, none marked: FLARE refuses it too (a sidecar could get the secrets).
    One unmarked container is the worker's (FLARE's containers[0] fallback): tests/compat."""
    template = {"kind": "Pod", "spec": {"containers": [{"name": "trainer"}, {"name": "proxy"}]}}
    with pytest.raises(LaunchError, match="none named 'atoll-worker'"):
        render(request_for(study={**PATHOLOGY, "pod_template": template}))


def test_service_account_and_pull_secrets_from_the_site() -> None:
    k8s = {**SITE, "service_account": "fl-worker", "image_pull_secrets": ["regcred"]}
    pod = render(request_for(k8s=k8s))["pod"]
    assert pod["spec"]["serviceAccountName"] == "fl-worker"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["automountServiceAccountToken"] is False
    template = {"kind": "Pod", "spec": {"serviceAccountName": "root-ish"}}
    with pytest.raises(LaunchError, match="spec.serviceAccountName"):
        render(request_for(k8s=k8s, study={**PATHOLOGY, "pod_template": template}))


# --- resources, images, network ------------------------------------------------------------------


def test_launcher_spec_requests_replace_portable_ones() -> None:
    """cpu_request alone is a request without a limit (NVIDIA FLARE 2.9's meaning)."""
    spec = {"default": {"k8s": {"cpu_request": "500m", "ephemeral_storage": "20Gi"}}}
    pod = render(request_for(resource_spec={"@default": {"memory": "1Gi"}}, launcher_spec=spec))
    resources = main_container(pod["pod"])["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "20Gi"}
    assert resources["limits"] == {"memory": "1Gi", "ephemeral-storage": "20Gi"}


def test_image_precedence_shared_with_docker() -> None:
    spec = {"default": {"k8s": {"image": "registry.example.com/fl/trainer:2"}}}
    allowed = {**SITE, "allow_job_images": ["registry.example.com/fl/*"]}
    chosen = render(request_for(k8s=allowed, launcher_spec=spec))["pod"]
    assert main_container(chosen)["image"] == "registry.example.com/fl/trainer:2"
    with pytest.raises(LaunchError, match="k8s.allow_job_images"):
        render(request_for(launcher_spec=spec))
    no_image = {k: v for k, v in PATHOLOGY.items() if k != "container"}
    site = {**SITE, "default_image": "site/default:1"}
    assert main_container(render(request_for(k8s=site, study=no_image))["pod"])["image"] == (
        "site/default:1"
    )


def test_loopback_parent_needs_host_network() -> None:
    with pytest.raises(LaunchError, match="host_network"):
        render(request_for(k8s={"namespace": "fl-jobs"}))
    pod = render(request_for(k8s={"namespace": "fl-jobs"}, parent="10.1.2.3:7001"))["pod"]
    assert "hostNetwork" not in pod["spec"]


def test_launcher_render_is_the_pure_render() -> None:
    launcher = KubernetesLauncher(parse_site_config({"launcher": "k8s", "k8s": SITE}), api=object())
    assert launcher.render(request_for()) == render(request_for())


def test_a_job_of_several_ranks_runs_them_in_one_pod() -> None:
    spec = {"default": {"k8s": {"processes_per_node": 2}}}
    pod = render(request_for(resource_spec={"@default": {"num_of_gpus": 0}},
                             launcher_spec=spec))["pod"]
    env = env_of(pod)
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == ("2", "2",
                                                                               "127.0.0.1")
    assert "CUDA_VISIBLE_DEVICES" not in env and "RANK" not in env
