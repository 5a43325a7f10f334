"""Kubernetes renders of FLARE-format inputs against NVIDIA FLARE 2.9's K8s launcher
(app_opt/job_launcher/k8s_launcher.py: K8sJobLauncher.launch_job's resources block and
_select_job_container; its tests k8s_launcher_test.py). Ids name the behaviour checked."""

from __future__ import annotations

import pytest

from atoll.launchers.base import LaunchError
from atoll.launchers.kubernetes_render import MAIN_CONTAINER, render
from atoll.spec.errors import SpecError
from tests.compat.flare_requests import flare_request, site_block


def worker(pod):
    return next(c for c in pod["spec"]["containers"] if c["name"] == MAIN_CONTAINER)


def resources(**kwargs):
    return worker(render(flare_request("k8s", **kwargs))["pod"])["resources"]


@pytest.mark.parametrize(("block", "requests", "limits"), [
    pytest.param({"cpu": "2"}, {"cpu": "2"}, {"cpu": "2"},
                 id="k8s_launcher-cpu-is-limit-and-request"),
    pytest.param({"memory": "2Gi"}, {"memory": "2Gi"}, {"memory": "2Gi"},
                 id="k8s_launcher-memory-is-limit-and-request"),
    pytest.param({"cpu": "2", "cpu_request": "500m"}, {"cpu": "500m"}, {"cpu": "2"},
                 id="k8s_launcher-cpu_request-below-the-limit"),
    pytest.param({"memory": "8Gi", "memory_request": "2Gi"}, {"memory": "2Gi"},
                 {"memory": "8Gi"}, id="k8s_launcher-memory_request-below-the-limit"),
    pytest.param({"cpu_request": "500m"}, {"cpu": "500m"}, {},
                 id="k8s_launcher-cpu_request-alone-sets-no-limit"),
    pytest.param({"memory_request": "1Gi"}, {"memory": "1Gi"}, {},
                 id="k8s_launcher-memory_request-alone-sets-no-limit"),
    pytest.param({"cpu": 2}, {"cpu": "2"}, {"cpu": "2"}, id="k8s_launcher-cpu-as-a-number"),
    pytest.param({"memory": "500M"}, {"memory": "500M"}, {"memory": "500M"},
                 id="k8s_launcher-memory-decimal-suffix"),
    pytest.param({"ephemeral_storage": "4Gi"}, {"ephemeral-storage": "4Gi"},
                 {"ephemeral-storage": "4Gi"}, id="k8s_launcher-ephemeral_storage-both"),
    pytest.param({"num_of_gpus": 2}, {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2"},
                 id="k8s_launcher-native-num_of_gpus"),
])
def test_native_k8s_values_render_as_flare_renders_them(block, requests, limits):
    assert resources(launcher_spec=site_block("k8s", **block)) == {
        "requests": requests, "limits": limits}


def test_k8s_launcher_no_resource_spec_sets_no_cpu_or_memory():
    assert resources() == {"requests": {}, "limits": {}}


def test_k8s_launcher_portable_values_set_request_and_limit():
    res = resources(resource_spec={"@default": {"num_of_cpus": 4, "memory": "64Gi",
                                                "num_of_gpus": 1}})
    expected = {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert res == {"requests": expected, "limits": expected}


@pytest.mark.parametrize("block", [
    pytest.param({"cpu": "1", "cpu_request": "2"}, id="kubernetes-cpu-request-above-limit"),
    pytest.param({"memory": "1Gi", "memory_request": "2Gi"},
                 id="kubernetes-memory-request-above-limit"),
])
def test_a_request_above_its_limit_is_refused_naming_the_field(block):
    """Not a FLARE check: the Kubernetes API refuses such a pod; atoll says so at submit."""
    with pytest.raises(SpecError, match=r"launcher_spec\.site-1\.k8s\.(cpu|memory)_request"):
        flare_request("k8s", launcher_spec=site_block("k8s", **block))


def test_study_runtime_inline_pod_template_without_kind():
    template = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
    pod = render(flare_request("k8s", study={"pod_template": template}))["pod"]
    assert pod["kind"] == "Pod"
    assert pod["spec"]["nodeSelector"] == template["spec"]["nodeSelector"]


def test_select_job_container_finds_flares_nvflare_job_sentinel():
    template = {"spec": {"containers": [{"name": "proxy", "image": "envoy:1"},
                                        {"name": "nvflare_job", "env": [{"name": "A",
                                                                        "value": "1"}]}]}}
    pod = render(flare_request("k8s", study={"pod_template": template}))["pod"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["proxy", MAIN_CONTAINER]
    assert {"name": "A", "value": "1"} in worker(pod)["env"]


def test_select_job_container_falls_back_to_the_only_container():
    template = {"spec": {"containers": [{"name": "trainer", "workingDir": "/work"}]}}
    pod = render(flare_request("k8s", study={"pod_template": template}))["pod"]
    assert [c["name"] for c in pod["spec"]["containers"]] == [MAIN_CONTAINER]
    assert worker(pod)["workingDir"] == "/work"


def test_select_job_container_several_unmarked_containers_are_refused():
    template = {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}
    with pytest.raises(LaunchError, match="nvflare_job"):
        render(flare_request("k8s", study={"pod_template": template}))


def test_study_runtime_secret_mount_items_project_only_those_keys():
    study = {"secret_mounts": {"db-ca": {"source": "study-db-ca", "mode": "ro",
                                         "mount_path": "/var/run/secrets/db-ca",
                                         "items": {"ca.crt": "ca.crt"}}}}
    pod = render(flare_request("k8s", study=study))["pod"]
    volume = next(v for v in pod["spec"]["volumes"] if "secret" in v and "db-ca" in v["name"])
    assert volume["secret"] == {"secretName": "study-db-ca",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}]}


def test_study_runtime_secret_env_is_a_secret_key_ref_on_k8s():
    study = {"secret_env": {"DB_USER": {"source": "study-db", "key": "username"}}}
    env = worker(render(flare_request("k8s", study=study))["pod"])["env"]
    assert {"name": "DB_USER", "valueFrom": {"secretKeyRef": {"name": "study-db",
                                                              "key": "username"}}} in env


def test_design_doc_nested_resource_spec_k8s_block_is_used():
    res = resources(resource_spec={"site-1": {"k8s": {"cpu": "500m", "memory": "2Gi"}}})
    assert res == {"requests": {"cpu": "500m", "memory": "2Gi"},
                   "limits": {"cpu": "500m", "memory": "2Gi"}}


def test_a_request_above_the_default_blocks_limit_is_refused_after_the_merge():
    spec = {"default": {"k8s": {"cpu": "1"}}, "site-1": {"k8s": {"cpu_request": "2"}}}
    with pytest.raises(SpecError, match=r"launcher_spec\.site-1\.k8s\.cpu_request"):
        flare_request("k8s", launcher_spec=spec)
