"""meta.json as NVIDIA FLARE 2.9 accepts or refuses it (FLARE's private/fed/server/
job_meta_validator.py, private/fed/utils/fed_utils.extract_participants and
utils/job_launcher_utils.py; their unit tests job_meta_validator_test.py and
job_launcher_utils_test.py). Each id names the FLARE behaviour checked."""

from __future__ import annotations

from typing import Any

import pytest

from atoll.spec.meta import load_meta
from tests.unit.spec.helpers import issues_of


def meta(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": "flare-job", "deploy_map": {"app": ["@ALL"]}}
    doc.update(fields)
    return doc


S3 = ["server", "site-1", "site-2"]

ACCEPTED_DEPLOY_MAPS = [
    pytest.param({"app1": ["@ALL"]}, {"app1": ["@ALL"]}, id="validator-deploy_map-all"),
    pytest.param({"app1": ["@ALL"], "app2": []}, {"app1": ["@ALL"]},
                 id="validator-deploy_map-all_idle-app-without-targets-is-idle"),
    pytest.param({"app1": S3, "app2": []}, {"app1": S3}, id="validator-deploy_map-idle_app"),
    pytest.param({"app1": S3}, {"app1": S3}, id="validator-deploy_map-one_app"),
    pytest.param({"app1": ["server", "site-1"], "app2": ["site-2"]},
                 {"app1": ["server", "site-1"], "app2": ["site-2"]},
                 id="validator-deploy_map-two_app"),
    pytest.param({"app1": {"targets": ["@ALL"]}}, {"app1": ["@ALL"]},
                 id="validator-deploy_map-all_targets_dict"),
    pytest.param({"app1": {"targets": S3}}, {"app1": S3},
                 id="validator-deploy_map-explicit_sites_targets_dict"),
    pytest.param({"app1": {"sites": S3}}, {"app1": S3},
                 id="extract_participants-sites-dict"),
    pytest.param({"app1": [{"sites": ["site-1"]}, "server"]}, {"app1": ["site-1", "server"]},
                 id="extract_participants-list-with-sites-entry"),
    pytest.param({"app1": [{"targets": ["site-1"]}, "server"]}, {"app1": ["site-1", "server"]},
                 id="extract_participants-list-with-targets-entry"),
    pytest.param({"app1": "@ALL"}, {"app1": ["@ALL"]}, id="extract_participants-single-name"),
    pytest.param({"app1": ["@all"]}, {"app1": ["@ALL"]}, id="validator-ALL_SITES-casefold"),
]


@pytest.mark.parametrize(("deploy_map", "canonical"), ACCEPTED_DEPLOY_MAPS)
def test_deploy_map_forms_flare_accepts(deploy_map, canonical):
    assert load_meta(meta(deploy_map=deploy_map)).deploy_map == canonical


REFUSED_DEPLOY_MAPS = [
    pytest.param({"app1": ["@ALL", "server"]}, "deploy_map.app1", id="validator-all_other"),
    pytest.param({"/tmp/app": ["server"]}, "deploy_map./tmp/app", id="validator-absolute_app"),
    pytest.param({"../app": ["server"]}, "deploy_map.../app", id="validator-traversing_app"),
    pytest.param({"app/sub": ["server"]}, "deploy_map.app/sub", id="validator-nested_app"),
    pytest.param({"app1": ["@ALL"], "app2": ["@all"]}, "deploy_map.app2",
                 id="validator-dup_all"),
    pytest.param({"app1": S3, "app2": ["site-2"]}, "deploy_map.app2[0]",
                 id="validator-dup_client"),
    pytest.param({"app1": ["server", "site-1"], "app2": ["server", "site-2"]},
                 "deploy_map.app2[0]", id="validator-dup_server"),
    pytest.param({}, "deploy_map", id="validator-empty_deploy_map"),
    pytest.param({"app1": []}, "deploy_map.app1", id="validator-no_deployment"),
    pytest.param({"app1": [], "app2": []}, "deploy_map.app1",
                 id="validator-no_deployment_two_apps"),
    pytest.param({"app1": {"targets": []}}, "deploy_map.app1",
                 id="validator-no_deployment_targets_dict"),
    pytest.param({"app1": {"foo": ["@ALL"]}}, "deploy_map.app1",
                 id="validator-invalid_targets_key"),
    pytest.param({"app1": [{"foo": ["site-1"]}, "server"]}, "deploy_map.app1",
                 id="extract_participants-entry-without-sites-or-targets"),
    pytest.param({"app1": ["site-1", "site-2"]}, "deploy_map",
                 id="validator-missing_server_in_deployment"),
]


@pytest.mark.parametrize(("deploy_map", "path"), REFUSED_DEPLOY_MAPS)
def test_deploy_maps_flare_refuses_are_refused_naming_the_field(deploy_map, path):
    paths = [i.path for i in issues_of(load_meta, meta(deploy_map=deploy_map))]
    assert any(p.startswith(path) for p in paths), paths


@pytest.mark.parametrize(("value", "ok"), [
    pytest.param(2, True, id="validator-min_clients-int"),
    pytest.param("2", True, id="validator-min_clients-string-converted-with-int"),
    pytest.param(0, False, id="validator-min_clients-zero"),
    pytest.param(-1, False, id="validator-min_clients-negative"),
    pytest.param(1_000_001, False, id="validator-min_clients-above-MAX_CLIENTS"),
    pytest.param(3, False, id="validator-not_enough_clients"),
])
def test_min_clients(value, ok):
    doc = meta(deploy_map={"app": S3}, min_clients=value)
    if ok:
        assert load_meta(doc).min_clients == int(value)
    else:
        assert "min_clients" in [i.path for i in issues_of(load_meta, doc)]


def test_validator_mandatory_not_met_is_refused_naming_the_client():
    doc = meta(deploy_map={"app": S3}, mandatory_clients=["site-9"])
    assert [i.path for i in issues_of(load_meta, doc)] == ["mandatory_clients[0]"]


# --- resource_spec (job_launcher_utils.validate_portable_resource_spec) -------------------------
@pytest.mark.parametrize(("spec", "path"), [
    pytest.param([], "resource_spec", id="validator-resource_spec-not-a-mapping"),
    pytest.param({"site-1": []}, "resource_spec.site-1", id="validator-site-spec-list"),
    pytest.param({"site-1": ""}, "resource_spec.site-1", id="validator-site-spec-string"),
    pytest.param({"site-1": 0}, "resource_spec.site-1", id="validator-site-spec-number"),
    pytest.param({"@default": {"image": "x"}}, "resource_spec.@default.image",
                 id="utils-@default-unsupported-field"),
    pytest.param({"@default": {"num_of_gpus": True}}, "resource_spec.@default.num_of_gpus",
                 id="utils-num_of_gpus-bool"),
    pytest.param({"@default": {"num_of_gpus": -1}}, "resource_spec.@default.num_of_gpus",
                 id="utils-num_of_gpus-negative"),
    pytest.param({"site-1": {"num_of_gpus": "1"}}, "resource_spec.site-1.num_of_gpus",
                 id="utils-num_of_gpus-string"),
    pytest.param({"@default": {"num_of_cpus": 0}}, "resource_spec.@default.num_of_cpus",
                 id="utils-num_of_cpus-below-1"),
    pytest.param({"@default": {"memory": "8G"}}, "resource_spec.@default.memory",
                 id="utils-memory-needs-Mi-Gi-Ti"),
])
def test_resource_spec_refusals(spec, path):
    paths = [i.path for i in issues_of(load_meta, meta(resource_spec=spec))]
    assert path in paths, paths


@pytest.mark.parametrize("spec", [
    pytest.param({}, id="validator-empty-resource_spec"),
    pytest.param({"site-1": {"num_of_gpus": 2, "mem_per_gpu_in_GiB": 16}},
                 id="utils-custom-site-resources-pass-through"),
    pytest.param({"@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"}},
                 id="utils-portable-@default"),
])
def test_resource_specs_flare_accepts(spec):
    assert load_meta(meta(resource_spec=spec)).resource_spec == spec


# --- launcher_spec (validator._validate_launcher_spec, utils.validate_docker_job_launcher_spec)
@pytest.mark.parametrize("block", [
    pytest.param({"slurm": {"nodes": 2}}, id="validator-slurm-launcher_spec-accepted"),
    pytest.param({"docker": {"image": "trusted/image:1", "num_of_gpus": 1, "shm_size": "8g"}},
                 id="validator-docker-allowlist-image-num_of_gpus-shm_size"),
    pytest.param({"docker": {"shm_size": 1073741824}}, id="utils-docker-shm_size-integer-bytes"),
    pytest.param({"docker": {"shm_size": "1.5g"}}, id="utils-docker-shm_size-decimal"),
    pytest.param({"k8s": {"cpu": "500m", "memory": "2Gi", "ephemeral_storage": "4Gi"}},
                 id="design-doc-k8s-cpu-memory-ephemeral_storage"),
    pytest.param({"slurm": {"nodes": 2, "gpus_per_node": 1, "cpus_per_node": 8,
                            "mem_per_node": 32768, "time": "02:00:00"}},
                 id="design-doc-slurm-mem_per_node-integer-MiB"),
])
@pytest.mark.parametrize("where", ["default", "site-1"])
def test_launcher_specs_flare_accepts(block, where):
    assert load_meta(meta(launcher_spec={where: block})).launcher_spec == {where: block}


@pytest.mark.parametrize("field", [
    "privileged", "pid_mode", "ipc_mode", "devices", "device_requests", "cap_add",
    "security_opt", "network_mode", "volumes",
])
def test_validator_isolation_sensitive_docker_options_are_refused(field):
    doc = meta(launcher_spec={"site-1": {"docker": {field: "attacker-controlled"}}})
    issues = issues_of(load_meta, doc)
    assert issues[0].path == f"launcher_spec.site-1.docker.{field}"
    assert "not settable by a job" in issues[0].message


@pytest.mark.parametrize("value", [True, "1", 1.5, -1, None])
def test_validator_invalid_docker_num_of_gpus_is_refused(value):
    doc = meta(launcher_spec={"default": {"docker": {"num_of_gpus": value}}})
    assert [i.path for i in issues_of(load_meta, doc)] == [
        "launcher_spec.default.docker.num_of_gpus"]


@pytest.mark.parametrize(("block", "path"), [
    pytest.param({"docker": {"shm_size": {"unexpected": 1}}}, "docker.shm_size",
                 id="validator-docker-shm_size-mapping"),
    pytest.param({"slurm_typo": {}}, "slurm_typo", id="validator-unknown-launcher-mode"),
    pytest.param({"docker": []}, "docker", id="validator-legacy-docker-block-not-a-dict"),
    pytest.param({"k8s": {"cpu": "two"}}, "k8s.cpu", id="k8s-cpu-not-a-quantity"),
])
def test_launcher_spec_refusals(block, path):
    doc = meta(launcher_spec={"site-1": block})
    assert f"launcher_spec.site-1.{path}" in [i.path for i in issues_of(load_meta, doc)]


@pytest.mark.parametrize(("block", "key"), [
    pytest.param({"docker": {"python_path": "/usr/bin/python"}}, "docker.python_path",
                 id="deliberate-docker-python_path"),
    pytest.param({"docker": {"entrypoint": "/bin/sh"}}, "docker.entrypoint",
                 id="deliberate-docker-entrypoint"),
    pytest.param({"k8s": {"python_path": "/usr/bin/python"}}, "k8s.python_path",
                 id="deliberate-k8s-python_path"),
    pytest.param({"slurm": {"image": "/images/job.sif"}}, "slurm.image",
                 id="deliberate-slurm-job-image-is-a-host-path"),
    pytest.param({"slurm": {"additional_node_command": ["x"]}}, "slurm.additional_node_command",
                 id="deliberate-slurm-additional_node_command"),
])
def test_flare_keys_atoll_refuses_on_purpose_say_so(block, key):
    issues = issues_of(load_meta, meta(launcher_spec={"site-1": block}))
    assert issues[0].path == f"launcher_spec.site-1.{key}"
    assert issues[0].message.startswith("accepted by NVIDIA FLARE but not by atoll: ")


# --- portable vs native (utils.validate_portable_resource_conflicts) ---------------------------
@pytest.mark.parametrize(("portable", "native", "field"), [
    pytest.param({"num_of_gpus": 1}, {"k8s": {"num_of_gpus": 8}}, "k8s.num_of_gpus",
                 id="validator-portable-k8s-gpu-conflict"),
    pytest.param({"num_of_gpus": 1}, {"docker": {"num_of_gpus": 2}}, "docker.num_of_gpus",
                 id="utils-portable-docker-gpu-conflict"),
    pytest.param({"num_of_cpus": 2}, {"k8s": {"cpu": "2"}}, "k8s.cpu", id="utils-k8s-cpu"),
    pytest.param({"num_of_cpus": 2}, {"k8s": {"cpu_request": "1"}}, "k8s.cpu_request",
                 id="utils-k8s-cpu_request"),
    pytest.param({"memory": "2Gi"}, {"k8s": {"memory": "2Gi"}}, "k8s.memory",
                 id="utils-k8s-memory"),
    pytest.param({"memory": "2Gi"}, {"k8s": {"memory_request": "1Gi"}}, "k8s.memory_request",
                 id="utils-k8s-memory_request"),
    pytest.param({"num_of_cpus": 2}, {"slurm": {"cpus_per_node": 2}}, "slurm.cpus_per_node",
                 id="utils-slurm-cpus_per_node"),
    pytest.param({"memory": "2Gi"}, {"slurm": {"mem_per_node": 2048}}, "slurm.mem_per_node",
                 id="utils-slurm-mem_per_node"),
])
def test_a_resource_given_portably_and_natively_is_refused(portable, native, field):
    doc = meta(deploy_map={"app": S3}, resource_spec={"site-1": portable},
               launcher_spec={"site-1": native})
    issues = issues_of(load_meta, doc)
    assert issues[0].path == f"launcher_spec.site-1.{field}"
    assert "conflicts with resource_spec" in issues[0].message


def test_utils_default_blocks_conflict_too():
    doc = meta(resource_spec={"@default": {"num_of_cpus": 2}},
               launcher_spec={"default": {"k8s": {"cpu": "2"}}})
    assert "launcher_spec.default.k8s.cpu" in [i.path for i in issues_of(load_meta, doc)]


@pytest.mark.parametrize(("gpus", "slurm", "path"), [
    pytest.param(4, {"nodes": 2, "gpus_per_node": 1}, "gpus_per_node",
                 id="slurm_launcher-num_of_gpus-must-equal-nodes-times-gpus_per_node"),
    pytest.param(4, {"nodes": 2}, "nodes", id="slurm_launcher-multi-node-gpu-needs-gpus_per_node"),
])
def test_slurm_topology_refusals(gpus, slurm, path):
    doc = meta(resource_spec={"@default": {"num_of_gpus": gpus}},
               launcher_spec={"default": {"slurm": slurm}})
    assert f"launcher_spec.default.slurm.{path}" in [i.path for i in issues_of(load_meta, doc)]


# --- the legacy nested resource_spec (utils.get_job_launcher_spec's fallback) -----------------
def test_utils_nested_resource_spec_blocks_are_the_launcher_spec():
    doc = meta(resource_spec={"site-1": {"process": {"num_of_gpus": 1},
                                         "docker": {"image": "repo/nvflare:2.9"}}})
    loaded = load_meta(doc)
    assert loaded.resource_spec == {"site-1": {"num_of_gpus": 1}}
    assert loaded.launcher_spec == {"site-1": {"docker": {"image": "repo/nvflare:2.9"}}}


def test_utils_launcher_spec_wins_over_the_nested_fallback():
    doc = meta(resource_spec={"site-1": {"docker": {"image": "old:1"}}},
               launcher_spec={"site-1": {"docker": {"image": "new:2"}}})
    assert load_meta(doc).launcher_spec == {"site-1": {"docker": {"image": "new:2"}}}


def test_validator_legacy_nested_gpu_mismatch_is_refused():
    doc = meta(deploy_map={"app": S3}, resource_spec={
        "site-1": {"process": {"num_of_gpus": 1}, "docker": {"num_of_gpus": 8}}})
    issues = issues_of(load_meta, doc)
    assert issues[0].path == "resource_spec.site-1.docker.num_of_gpus"


def test_utils_legacy_nested_equal_gpus_are_one_request():
    doc = meta(resource_spec={
        "site-1": {"process": {"num_of_gpus": 2}, "k8s": {"num_of_gpus": 2}}})
    assert load_meta(doc).resource_spec == {"site-1": {"num_of_gpus": 2}}


def test_validator_legacy_docker_resource_spec_uses_same_allowlist():
    doc = meta(resource_spec={"site-1": {"docker": {"privileged": True}}})
    assert [i.path for i in issues_of(load_meta, doc)] == [
        "resource_spec.site-1.docker.privileged"]


def test_deliberate_nested_process_gpus_are_the_workers_on_every_backend():
    """FLARE (k8s_launcher_test: flat_gpu_ignored_when_resource_spec_has_mode_keys) schedules
    the process block's GPUs but attaches none to a Docker/K8s worker without its own
    num_of_gpus; atoll gives the worker what the site reserved (docs/job-format.md)."""
    from atoll.spec.resources import resolve_resources

    loaded = load_meta(meta(resource_spec={"site-1": {"process": {"num_of_gpus": 2},
                                                      "k8s": {"image": "repo/x:1"}}}))
    assert resolve_resources(loaded.resource_spec, "site-1").num_of_gpus == 2
