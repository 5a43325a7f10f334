from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.spec.meta import JobMeta, load_meta

from .helpers import by_path, issues_of

SEED_META = Path(__file__).parents[2] / "fixtures/seed/meta.json"


def meta(**fields):
    doc = {"name": "job", "deploy_map": {"app": ["@ALL"]}}
    doc.update(fields)
    return doc


def test_seed_meta_loads_from_a_job_folder_and_a_file(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "meta.json").write_text(SEED_META.read_text())
    for source in (job, job / "meta.json"):
        m = load_meta(source)
        assert m.name == "pathology-fedavg"
        assert m.min_clients == 3
        assert m.mandatory_clients == ["university"]


def test_minimal_meta_and_defaults():
    m = load_meta(meta())
    assert (m.min_clients, m.mandatory_clients, m.resource_spec, m.launcher_spec) == (
        None,
        [],
        {},
        {},
    )


def test_study_and_submitter_from_the_user_are_ignored_and_set_by_the_server():
    m = load_meta(meta(study="someone-elses", submitter="mallory@evil.org"))
    assert (m.study, m.submitter) == (None, None)
    stamped = m.with_server_fields("pathology", "lead@hospital-a.org")
    assert (stamped.study, stamped.submitter) == ("pathology", "lead@hospital-a.org")
    assert m.study is None  # a copy


def test_targets_expand_and_app_for():
    m = load_meta(meta(deploy_map={"srv": ["server"], "trainer": ["site-a", "site-b"]}))
    assert m.targets() == ["server", "site-a", "site-b"]
    assert m.sites() == ["site-a", "site-b"]
    assert m.expand_targets(["site-x"]) == ["server", "site-a", "site-b"]
    assert (m.app_for("server"), m.app_for("site-b"), m.app_for("site-z")) == (
        "srv",
        "trainer",
        None,
    )
    everyone = load_meta(meta())
    assert everyone.targets() == ["@ALL"]
    assert everyone.expand_targets(["site-a", "site-b"]) == ["server", "site-a", "site-b"]
    assert everyone.app_for("anything") == "app"


@pytest.mark.parametrize(
    ("deploy_map", "path", "message"),
    [
        ({}, "deploy_map", "is empty; map at least one app"),
        ({"app": []}, "deploy_map.app", "has no targets"),
        ({"a/b": ["@ALL"]}, "deploy_map.a/b", "app name must be a folder name"),
        ({"..": ["@ALL"]}, "deploy_map...", "app name must be a folder name"),
        ({"x..y": ["@ALL"]}, "deploy_map.x..y", "app name must be a folder name"),
        ({"/abs": ["@ALL"]}, "deploy_map./abs", "app name must be a folder name"),
        ({"": ["@ALL"]}, 'deploy_map.""', "app name must be a folder name"),
        ({"app": ["@ALL", "server"]}, "deploy_map.app", "@ALL already means the server"),
        (
            {"a": ["server", "site-a"], "b": ["site-a"]},
            "deploy_map.b[0]",
            "'site-a' appears in apps 'a' and 'b'; a target runs one app",
        ),
        ({"a": ["server", "site-a", "site-a"]}, "deploy_map.a[2]", "'site-a' appears twice"),
        ({"a": ["site-a"]}, "deploy_map", "no app runs on the server"),
        ({"a": ["server", "bad name!"]}, "deploy_map.a[1]", "is not a target"),
        ({"a": ["@ALL"], "b": ["site-x"]}, "deploy_map.b", "already runs on every target (@ALL)"),
        ({"a": 5}, "deploy_map.a", "must be a list"),
    ],
)
def test_deploy_map_rules(deploy_map, path, message):
    issues = by_path(issues_of(load_meta, meta(deploy_map=deploy_map)))
    assert path in issues, issues
    assert message in issues[path]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be at least 1, not 0"),
        (1_000_001, "must be at most 1000000"),
        (True, "must be an integer"),
        ("two", "must be an integer"),
    ],
)
def test_min_clients_range(value, message):
    assert message in by_path(issues_of(load_meta, meta(min_clients=value)))["min_clients"]


def test_min_clients_bounds_pass():
    assert load_meta(meta(min_clients=1_000_000)).min_clients == 1_000_000


def test_min_clients_above_the_named_sites():
    doc = meta(deploy_map={"app": ["server", "a", "b"]}, min_clients=3)
    assert "more than the 2 site(s)" in by_path(issues_of(load_meta, doc))["min_clients"]


def test_mandatory_clients_must_be_in_the_deploy_map():
    doc = meta(deploy_map={"app": ["server", "a"]}, mandatory_clients=["a", "b", "server"])
    issues = by_path(issues_of(load_meta, doc))
    assert set(issues) == {"mandatory_clients[1]", "mandatory_clients[2]"}
    assert "'b' is not a site of deploy_map" in issues["mandatory_clients[1]"]
    assert load_meta(meta(mandatory_clients=["any-site"])).mandatory_clients == ["any-site"]


def test_required_and_unknown_keys():
    issues = by_path(issues_of(load_meta, {"deploy_map": {"app": ["@ALL"]}, "nmae": "x"}))
    assert issues["name"] == "required key is missing; add it"
    assert issues["nmae"].startswith("unknown key; allowed keys: name, deploy_map, min_clients")
    assert by_path(issues_of(load_meta, meta(name="")))["name"] == "must not be empty"


def test_resource_and_launcher_spec_errors_carry_their_full_path():
    doc = meta(
        resource_spec={"@default": {"num_of_gpus": True}},
        launcher_spec={"default": {"docker": {"privileged": True}}},
    )
    issues = by_path(issues_of(load_meta, doc))
    assert issues["resource_spec.@default.num_of_gpus"].startswith("must be an integer")
    assert issues["launcher_spec.default.docker.privileged"] == (
        "not settable by a job for the docker launcher; allowed keys: image, shm_size, "
        "num_of_gpus, processes_per_node"
    )


def test_conflicts_are_checked_at_submit():
    doc = meta(
        deploy_map={"app": ["server", "university"]},
        resource_spec={"@default": {"num_of_cpus": 4}},
        launcher_spec={"university": {"slurm": {"cpus_per_node": 8}}},
    )
    issues = by_path(issues_of(load_meta, doc))
    assert (
        "site 'university' on slurm, cpus_per_node conflicts with resource_spec num_of_cpus"
        in issues["launcher_spec.university.slurm.cpus_per_node"]
    )


def test_all_errors_of_the_document_together():
    doc = {"name": 5, "deploy_map": {}, "min_clients": 0, "resource_spec": [], "extra": 1}
    assert {i.path for i in issues_of(load_meta, doc)} == {
        "name",
        "deploy_map",
        "min_clients",
        "resource_spec",
        "extra",
    }


def test_file_problems(tmp_path):
    (tmp_path / "meta.json").write_text("{not json")
    (issue,) = issues_of(load_meta, tmp_path)
    assert issue.message.startswith("not valid JSON")
    (tmp_path / "meta.json").write_text(json.dumps(["a"]))
    assert issues_of(load_meta, tmp_path)[0].message == "must be a JSON object, not a list"
    missing = tmp_path / "none"
    missing.mkdir()
    assert "needs a meta.json" in issues_of(load_meta, missing)[0].message


def test_jobmeta_documents_every_field():
    assert all(f.description for f in JobMeta.model_fields.values())
