from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.spec.resources import Resources, resolve_resources, validate_resource_spec

from .helpers import by_path, issues_of

SEED = json.loads((Path(__file__).parents[2] / "fixtures/seed/resource_spec.json").read_text())


def test_seed_example_exactly():
    assert SEED == {
        "@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"},
        "server": {"num_of_gpus": 0},
        "university": {"num_of_gpus": 8},
    }
    for hospital in ("hospital-a", "hospital-b"):
        assert resolve_resources(SEED, hospital) == Resources(1, 4, "64Gi")
    assert resolve_resources(SEED, "university") == Resources(8, 4, "64Gi")
    assert resolve_resources(SEED, "server") == Resources(0, 4, "64Gi")
    assert resolve_resources(SEED, "server").memory_bytes == 68719476736


def test_absent_spec_and_absent_keys_give_the_defaults():
    assert resolve_resources(None, "site-a") == Resources(num_of_gpus=0, num_of_cpus=None, memory=None)
    assert resolve_resources({}, "server") == Resources()
    assert resolve_resources({"site-a": {"memory": "1Gi"}}, "site-b").memory is None
    assert Resources().memory_bytes is None


def test_default_applies_to_the_server_too():
    assert resolve_resources({"@default": {"num_of_gpus": 2}}, "server").num_of_gpus == 2


def test_shallow_merge_overrides_only_what_differs():
    spec = {
        "@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"},
        "site-a": {"memory": "8Gi"},
    }
    assert resolve_resources(spec, "site-a") == Resources(1, 4, "8Gi")


def test_null_is_rejected_everywhere_an_inherited_field_cannot_be_removed():
    spec = {"@default": {"memory": None}, "site-a": {"num_of_gpus": None, "quota": None}}
    issues = by_path(issues_of(resolve_resources, spec, "site-a"))
    assert issues["resource_spec.@default.memory"].startswith("null is not allowed")
    assert "inherit the value from @default" in issues["resource_spec.site-a.num_of_gpus"]
    assert issues["resource_spec.site-a.quota"].startswith("null is not allowed")


@pytest.mark.parametrize("value", [True, False, 1.0, "1", [1], {"n": 1}])
def test_a_bool_or_anything_but_an_int_is_not_a_gpu_count(value):
    issues = validate_resource_spec({"site-a": {"num_of_gpus": value}})
    assert [i.path for i in issues] == ["resource_spec.site-a.num_of_gpus"]
    assert issues[0].message.startswith("must be an integer")


def test_ranges_of_gpus_and_cpus():
    issues = by_path(validate_resource_spec({"@default": {"num_of_gpus": -1, "num_of_cpus": 0}}))
    assert issues == {
        "resource_spec.@default.num_of_gpus": "must be at least 0, not -1",
        "resource_spec.@default.num_of_cpus": "must be at least 1, not 0",
    }
    assert validate_resource_spec({"@default": {"num_of_gpus": 0, "num_of_cpus": 1}}) == []


@pytest.mark.parametrize("memory", ["64G", "0Gi", "1.5Gi", "64gi", 64])
def test_memory_format(memory):
    (issue,) = validate_resource_spec({"server": {"memory": memory}})
    assert issue.path == "resource_spec.server.memory"
    assert "Mi, Gi or Ti" in issue.message or "must be a string" in issue.message


def test_default_accepts_only_the_three_portable_keys():
    (issue,) = validate_resource_spec({"@default": {"num_of_gpus": 1, "gpu_type": "a100"}})
    assert issue.path == "resource_spec.@default.gpu_type"
    assert issue.message == "unknown key; allowed keys: num_of_gpus, num_of_cpus, memory"


def test_other_per_site_keys_pass_through_to_capacity_accounting():
    spec = {"@default": {"num_of_cpus": 2}, "site-a": {"gpu_type": "a100", "scratch": 10}}
    assert resolve_resources(spec, "site-a").extra == {"gpu_type": "a100", "scratch": 10}
    assert resolve_resources(spec, "site-b").extra == {}


def test_a_site_named_default_is_an_ordinary_site():
    spec = {"@default": {"num_of_gpus": 1}, "default": {"num_of_gpus": 3, "custom": 1}}
    assert resolve_resources(spec, "default") == Resources(3, None, None, {"custom": 1})
    assert resolve_resources(spec, "other").num_of_gpus == 1


def test_unknown_special_keys_and_bad_target_names():
    issues = by_path(validate_resource_spec({"@defaults": {}, "bad/name": {}, "ok": []}))
    assert issues["resource_spec.@defaults"] == "unknown special key; the only one is @default"
    assert issues["resource_spec.bad/name"] == "'bad/name' is not a site name (or 'server')"
    assert issues["resource_spec.ok"] == "must be a mapping, not a list"


def test_not_a_mapping():
    (issue,) = validate_resource_spec(["x"])
    assert issue.path == "resource_spec"
    assert issue.message.startswith("must be a mapping of target name to resources")


def test_every_problem_is_reported_together():
    spec = {"@default": {"num_of_gpus": True, "memory": "1G"}, "s": {"num_of_cpus": 0}}
    assert len(issues_of(resolve_resources, spec, "s")) == 3
