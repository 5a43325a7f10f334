from __future__ import annotations

import pytest

from atoll.spec.launcher_spec import (
    ALLOWED_KEYS,
    JOB_SPEC_MODELS,
    launcher_spec_issues,
    merged_block,
    resolve_launcher_spec,
    slurm_time_to_seconds,
    validate_launcher_spec,
)
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config

from .helpers import by_path, issues_of

SEED_RESOURCES = {
    "@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"},
    "server": {"num_of_gpus": 0},
    "university": {"num_of_gpus": 8},
}


def job(launcher_spec, resource_spec=None, deploy_map=None):
    return load_meta(
        {
            "name": "j",
            "deploy_map": deploy_map or {"app": ["@ALL"]},
            "resource_spec": resource_spec or {},
            "launcher_spec": launcher_spec,
        }
    )


def site(launcher, **block):
    return parse_site_config(
        {"launcher": launcher, launcher: block} if block else {"launcher": launcher}
    )


def test_allowlists_per_backend():
    assert ALLOWED_KEYS == {
        "process": ("processes_per_node",),
        "docker": ("image", "shm_size", "num_of_gpus", "processes_per_node"),
        "k8s": (
            "image",
            "cpu",
            "memory",
            "cpu_request",
            "memory_request",
            "ephemeral_storage",
            "num_of_gpus",
            "pending_timeout",
            "processes_per_node",
        ),
        "slurm": (
            "nodes",
            "gpus_per_node",
            "cpus_per_node",
            "mem_per_node",
            "time",
            "pending_timeout",
            "processes_per_node",
        ),
    }
    for model in JOB_SPEC_MODELS.values():
        assert all(f.description for f in model.model_fields.values())


@pytest.mark.parametrize(
    ("backend", "key"),
    [
        ("docker", "privileged"),
        ("docker", "volumes"),
        ("slurm", "partition"),
        ("slurm", "account"),
        ("k8s", "service_account"),
        ("k8s", "hostNetwork"),
        ("process", "python"),
    ],
)
def test_keys_outside_the_allowlist_are_rejected_with_the_allowed_keys(backend, key):
    (issue,) = validate_launcher_spec({"site-a": {backend: {key: True}}})
    assert issue.path == f"launcher_spec.site-a.{backend}.{key}"
    allowed = ", ".join(ALLOWED_KEYS[backend]) or None
    expected = f"allowed keys: {allowed}" if allowed else "it takes no job settings"
    assert issue.message == f"not settable by a job for the {backend} launcher; {expected}"


def test_a_full_valid_spec():
    spec = {
        "default": {"docker": {"image": "img:1", "shm_size": "2Gi"}, "process": {}},
        "university": {
            "slurm": {"nodes": 2, "gpus_per_node": 4, "time": "1-00:00:00", "pending_timeout": 60}
        },
        "server": {
            "k8s": {
                "image": "x",
                "cpu_request": "500m",
                "memory_request": "1Gi",
                "ephemeral_storage": "10Gi",
                "pending_timeout": 30,
            }
        },
    }
    assert validate_launcher_spec(spec) == []


@pytest.mark.parametrize(
    ("block", "path", "message"),
    [
        ({"docker": {"shm_size": "lots"}}, "docker.shm_size", "is not a size"),
        ({"k8s": {"cpu_request": "two"}}, "k8s.cpu_request", "is not a positive quantity"),
        ({"k8s": {"cpu_request": "0"}}, "k8s.cpu_request", "is not a positive quantity"),
        ({"k8s": {"pending_timeout": 0}}, "k8s.pending_timeout", "must be at least 1"),
        ({"slurm": {"nodes": 0}}, "slurm.nodes", "must be at least 1"),
        ({"slurm": {"nodes": True}}, "slurm.nodes", "must be an integer"),
        ({"slurm": {"time": "forever"}}, "slurm.time", "is not a Slurm time"),
        ({"slurm": {"time": "0"}}, "slurm.time", "longer than zero"),
        ({"slurm": {"mem_per_node": "8G"}}, "slurm.mem_per_node", "is not a memory size"),
        ({"slurm": {"gpus_per_node": None}}, "slurm.gpus_per_node", "null is not allowed"),
        ({"podman": {}}, "podman", "unknown launcher; use one of process, docker, k8s, slurm"),
        ({"slurm": []}, "slurm", "must be a mapping"),
    ],
)
def test_value_rules(block, path, message):
    issues = by_path(validate_launcher_spec({"default": block}))
    assert message in issues[f"launcher_spec.default.{path}"]


def test_k8s_cpu_request_accepts_an_integer_and_quantities():
    for value in (2, "2", "500m", "0.5"):
        assert validate_launcher_spec({"default": {"k8s": {"cpu_request": value}}}) == []


def test_document_shape_errors():
    assert validate_launcher_spec([])[0].message.startswith("must be a mapping of 'default'")
    issues = by_path(validate_launcher_spec({"bad name": {}, "s": "slurm"}))
    assert "is not 'default', 'server' or a site name" in issues["launcher_spec.bad name"]
    assert "must be a mapping of backend to settings" in issues["launcher_spec.s"]


def test_slurm_time_formats():
    assert [
        slurm_time_to_seconds(t) for t in ("90", "5:30", "1:00:00", "2-3", "2-3:04", "1-0:0:1")
    ] == [5400, 330, 3600, 183600, 183840, 86401]


def test_default_then_site_merge_site_wins():
    spec = {
        "default": {"slurm": {"nodes": 1, "time": "1:00:00"}},
        "university": {"slurm": {"time": "4:00:00"}},
    }
    assert merged_block(spec, "university", "slurm") == {"nodes": 1, "time": "4:00:00"}
    assert merged_block(spec, "hospital-a", "slurm") == {"nodes": 1, "time": "1:00:00"}
    assert merged_block(spec, "university", "docker") == {}
    meta = job(spec)
    assert resolve_launcher_spec(meta, "university", "slurm", site("slurm")) == {
        "nodes": 1,
        "time": "4:00:00",
    }


@pytest.mark.parametrize(
    ("backend", "native", "portable", "value"),
    [
        ("k8s", "cpu_request", "num_of_cpus", "2"),
        ("k8s", "memory_request", "memory", "8Gi"),
        ("slurm", "cpus_per_node", "num_of_cpus", 8),
        ("slurm", "mem_per_node", "memory", "8Gi"),
    ],
)
def test_a_resource_given_portably_and_natively_is_a_conflict(backend, native, portable, value):
    spec = {"university": {backend: {native: value}}}
    issues = by_path(issues_of(job, spec, SEED_RESOURCES))
    message = issues[f"launcher_spec.university.{backend}.{native}"]
    assert (
        f"for site 'university' on {backend}, {native} conflicts with resource_spec {portable}"
        in message
    )
    assert f"remove {native} or {portable}" in message


def test_native_only_is_fine():
    meta = job(
        {"university": {"k8s": {"cpu_request": "2", "memory_request": "8Gi"}}},
        {"university": {"num_of_gpus": 1}},
    )
    assert resolve_launcher_spec(meta, "university", "k8s", site("k8s"))["cpu_request"] == "2"


def test_a_conflict_from_the_default_block_names_each_site():
    issues = launcher_spec_issues(
        {"default": {"slurm": {"mem_per_node": "1Gi"}}},
        {"@default": {"memory": "2Gi"}},
        ["server", "site-a"],
    )
    assert {i.path for i in issues} == {"launcher_spec.default.slurm.mem_per_node"}
    assert any("the server on slurm" in i.message for i in issues)
    assert any("site 'site-a' on slurm" in i.message for i in issues)


def test_slurm_total_gpus_must_equal_nodes_times_gpus_per_node():
    spec = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 2}}}
    message = by_path(issues_of(job, spec, SEED_RESOURCES))[
        "launcher_spec.university.slurm.gpus_per_node"
    ]
    assert "nodes (2) * gpus_per_node (2) = 4 GPUs but resource_spec num_of_gpus is 8" in message
    ok = job({"university": {"slurm": {"nodes": 2, "gpus_per_node": 4}}}, SEED_RESOURCES)
    assert resolve_launcher_spec(ok, "university", "slurm", site("slurm"))["nodes"] == 2


def test_slurm_multi_node_gpu_jobs_need_gpus_per_node():
    message = by_path(issues_of(job, {"university": {"slurm": {"nodes": 2}}}, SEED_RESOURCES))[
        "launcher_spec.university.slurm.nodes"
    ]
    assert (
        "a multi-node GPU job (2 nodes, 8 GPUs) needs gpus_per_node; add gpus_per_node: 4"
        in message
    )
    cpu_only = job({"server": {"slurm": {"nodes": 2}}}, SEED_RESOURCES)  # the server has 0 GPUs
    assert resolve_launcher_spec(cpu_only, "server", "slurm", site("slurm")) == {"nodes": 2}


@pytest.mark.parametrize("backend", ["k8s", "slurm"])
def test_pending_timeout_may_be_lowered_never_raised(backend):
    the_site = site(backend, pending_timeout=300)
    lowered = job({"default": {backend: {"pending_timeout": 120}}})
    assert resolve_launcher_spec(lowered, "site-a", backend, the_site) == {"pending_timeout": 120}
    raised = job({"site-a": {backend: {"pending_timeout": 900}}})
    (issue,) = issues_of(resolve_launcher_spec, raised, "site-a", backend, the_site)
    assert issue.path == f"launcher_spec.site-a.{backend}.pending_timeout"
    assert issue.message == (
        f"900 s is above this site's {backend} pending_timeout of 300 s; "
        "a job may only lower it: write at most 300"
    )


def test_blocks_of_other_backends_are_ignored_at_this_site():
    meta = job({"default": {"slurm": {"nodes": 2}, "docker": {"shm_size": "1Gi"}}})
    assert resolve_launcher_spec(meta, "site-a", "docker", site("docker")) == {"shm_size": "1Gi"}
    assert resolve_launcher_spec(meta, "site-a", "process", site("process")) == {}
