from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from atoll.spec.study_runtime import (
    StudyEntry,
    dataset_mount_path,
    load_study_runtime,
    parse_study_runtime,
)

from .helpers import by_path, issues_of

FIXTURES = Path(__file__).parents[2] / "fixtures/seed"
SEED = yaml.safe_load((FIXTURES / "study_runtime.yaml").read_text())


def entry(launcher, **fields):
    return {"format_version": 2, "studies": {"pathology": fields}}, launcher


def problems(launcher, **fields):
    doc, launcher = entry(launcher, **fields)
    return by_path(issues_of(parse_study_runtime, doc, launcher))


def test_seed_pathology_study_on_kubernetes(tmp_path):
    (tmp_path / "study_runtime.yaml").write_text((FIXTURES / "study_runtime.yaml").read_text())
    study = load_study_runtime(tmp_path, "k8s").entry("pathology")
    assert study.container.image == "registry.example.com/pathology-trainer:1.0"
    assert (study.datasets["slides"].source, study.datasets["slides"].mode) == (
        "pathology-data-pvc",
        "ro",
    )
    assert {n: (r.source, r.key) for n, r in study.secret_env.items()} == {
        "DB_USER": ("pathology-db", "username"),
        "DB_PASSWORD": ("pathology-db", "password"),
    }
    assert dataset_mount_path("pathology", "slides") == "/data/pathology/slides"


@pytest.mark.parametrize(
    ("name", "launcher"),
    [
        ("study_runtime_host.yaml", "docker"),
        ("study_runtime_host.yaml", "slurm"),
        ("study_runtime_process.yaml", "process"),
    ],
)
def test_seed_variants_for_the_other_launchers(tmp_path, name, launcher):
    (tmp_path / "study_runtime.yaml").write_text((FIXTURES / name).read_text())
    study = load_study_runtime(tmp_path, launcher).entry("pathology")
    assert study.datasets["slides"].source == "/srv/pathology/slides"
    assert study.secret_env["DB_USER"].source == "env"


def test_no_file_means_no_study_is_mapped(tmp_path):
    runtime = load_study_runtime(tmp_path, "docker")
    assert runtime.entry("pathology") is None


def test_the_kubernetes_seed_is_wrong_for_docker_and_says_why():
    issues = by_path(issues_of(parse_study_runtime, SEED, "docker"))
    assert (
        issues["studies.pathology.datasets.slides.source"]
        == "must be an absolute host path, e.g. /srv/data/slides"
    )
    assert issues["studies.pathology.secret_env.DB_USER.source"] == (
        "with the docker launcher a secret comes from the site parent's environment: "
        "write source: env and key: <VARIABLE NAME>"
    )


@pytest.mark.parametrize(
    ("field", "value", "launcher", "owners"),
    [
        ("docker_kwargs", {"shm_size": "1g"}, "k8s", "docker"),
        ("pod_template", {"kind": "Pod"}, "docker", "k8s"),
        ("slurm", {"partition": "gpu"}, "k8s", "slurm"),
        ("container", {"image": "x"}, "process", "docker / k8s / slurm"),
        (
            "secret_mounts",
            {"db": {"source": "/s", "mount_path": "/m"}},
            "process",
            "docker / k8s / slurm",
        ),
    ],
)
def test_a_field_of_another_launcher_is_an_error(field, value, launcher, owners):
    message = problems(launcher, **{field: value})[f"studies.pathology.{field}"]
    assert message == (
        f"{field} is read by the {owners} launcher(s), but this site's launcher "
        f"is {launcher}: remove it"
    )


@pytest.mark.parametrize(
    "name", ["PYTHONPATH", "ATOLL_JOB_TOKEN", "ATOLL_ANYTHING", "CUDA_VISIBLE_DEVICES"]
)
def test_launcher_owned_environment_names(name):
    for field, value in (("env", "x"), ("secret_env", {"source": "env", "key": "X"})):
        message = problems("docker", **{field: {name: value}})[f"studies.pathology.{field}.{name}"]
        assert message.startswith(f"{name} is set by the launcher")


def test_env_rules():
    issues = problems(
        "docker",
        env={"EMPTY": "", "my-var": "x", "NUM": [5], "OK": "fine"},
        secret_env={"OK": {"source": "env", "key": "OK_SECRET"}},
    )
    assert (
        issues["studies.pathology.env.EMPTY"]
        == "empty value; give it a value or remove the variable"
    )
    assert "is not an environment variable name" in issues["studies.pathology.env.my-var"]
    assert (
        issues["studies.pathology.env.NUM"]
        == "must be a text, number or true/false, not a list"
    )
    assert (
        issues["studies.pathology.secret_env.OK"]
        == "OK is also in env; keep it in one of env or secret_env"
    )


@pytest.mark.parametrize(
    "key",
    [
        "image",
        "volumes",
        "command",
        "entrypoint",
        "environment",
        "mounts",
        "device_requests",
        "nano_cpus",
        "mem_limit",
        "labels",
        "name",
        "network_mode",
    ],
)
def test_launcher_owned_docker_kwargs(key):
    message = problems("docker", docker_kwargs={key: "x"})[f"studies.pathology.docker_kwargs.{key}"]
    assert message.startswith("set by the docker launcher; remove it: ")


def test_host_control_and_unknown_docker_kwargs():
    issues = problems(
        "docker",
        docker_kwargs={
            "privileged": True,
            "cap_add": ["X"],
            "shm_sz": 1,
            "shm_size": "2g",
            "ulimits": [],
        },
    )
    assert set(issues) == {
        f"studies.pathology.docker_kwargs.{k}" for k in ("privileged", "cap_add", "shm_sz")
    }
    assert "control of this host" in issues["studies.pathology.docker_kwargs.privileged"]
    assert (
        "not a Docker containers.run argument" in issues["studies.pathology.docker_kwargs.shm_sz"]
    )


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"source": "/srv/x"}, "mode: required key is missing"),
        ({"source": "/srv/x", "mode": "rx"}, "mode: must be one of 'ro' or 'rw', not 'rx'"),
        ({"source": "relative", "mode": "ro"}, "source: must be an absolute host path"),
        ({"source": "/srv/../etc", "mode": "ro"}, "source: must not contain '..'"),
        (
            {"source": "/srv/x", "mode": "ro", "subpath": "a"},
            "subpath: unknown key; allowed keys: source, mode",
        ),
    ],
)
def test_dataset_rules(dataset, message):
    issues = problems("docker", datasets={"slides": dataset})
    assert any(f"{p.rsplit('.', 1)[1]}: {m}".startswith(message) for p, m in issues.items()), issues


def test_dataset_and_study_names():
    doc = {
        "format_version": 2,
        "studies": {"Bad_Study": {"datasets": {"Bad_Set": {"source": "pvc", "mode": "ro"}}}},
    }
    issues = by_path(issues_of(parse_study_runtime, doc, "k8s"))
    assert "is not a valid name" in issues["studies.Bad_Study"]
    assert "is not a valid name" in issues["studies.Bad_Study.datasets.Bad_Set"]


def test_k8s_references_must_be_kubernetes_names():
    issues = problems(
        "k8s",
        datasets={"s": {"source": "/host/path", "mode": "ro"}},
        secret_env={"X": {"source": "Not_A_Secret", "key": "k"}},
    )
    assert "is not a PVC name" in issues["studies.pathology.datasets.s.source"]
    assert "is not a Kubernetes Secret name" in issues["studies.pathology.secret_env.X.source"]


def test_secret_mounts():
    ok = {"db": {"source": "pathology-db", "mount_path": "/run/secrets/db"}}
    doc, _ = entry("k8s", secret_mounts=ok)
    assert (
        parse_study_runtime(doc, "k8s").entry("pathology").secret_mounts["db"].mount_path
        == "/run/secrets/db"
    )
    issues = problems(
        "k8s",
        secret_mounts={
            "a": {"source": "s", "mount_path": "relative"},
            "b": {"source": "s", "mount_path": "/m"},
            "c": {"source": "s", "mount_path": "/m/"},
            "d": {"source": "s", "mount_path": "/m", "readOnly": False},
        },
    )
    assert (
        "must be an absolute path inside the worker"
        in issues["studies.pathology.secret_mounts.a.mount_path"]
    )
    assert "same mount_path as 'b'" in issues["studies.pathology.secret_mounts.c.mount_path"]
    assert "unknown key" in issues["studies.pathology.secret_mounts.d.readOnly"]


def test_pod_template_inline_or_a_file_under_local(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nspec: {}\n")
    (tmp_path / "deploy.yaml").write_text("kind: Deployment\n")
    doc = {
        "format_version": 2,
        "studies": {
            "a": {"pod_template": "templates/pod.yaml"},
            "b": {
                "pod_template": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "spec": {"nodeSelector": {"x": "y"}},
                }
            },
        },
    }
    runtime = parse_study_runtime(doc, "k8s", tmp_path)
    assert runtime.entry("a").pod_template == {"apiVersion": "v1", "kind": "Pod", "spec": {}}
    assert runtime.entry("b").pod_template["spec"]["nodeSelector"] == {"x": "y"}
    bad = {
        "format_version": 2,
        "studies": {
            "up": {"pod_template": "../pod.yaml"},
            "abs": {"pod_template": "/etc/pod.yaml"},
            "kind": {"pod_template": "deploy.yaml"},
            "none": {"pod_template": "missing.yaml"},
            "inline": {"pod_template": {"kind": "Job"}},
        },
    }
    issues = by_path(issues_of(parse_study_runtime, bad, "k8s", tmp_path))
    assert "no '..', not absolute" in issues["studies.up.pod_template"]
    assert "no '..', not absolute" in issues["studies.abs.pod_template"]
    assert (
        issues["studies.kind.pod_template"]
        == "must be a Pod manifest with kind: Pod, not kind: 'Deployment'"
    )
    assert "file not found" in issues["studies.none.pod_template"]
    assert "kind: Pod" in issues["studies.inline.pod_template"]


def test_pod_template_symlink_out_of_local_is_refused(tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("kind: Pod\n")
    local = tmp_path / "local"
    local.mkdir()
    (local / "pod.yaml").symlink_to(outside)
    doc = {"format_version": 2, "studies": {"a": {"pod_template": "pod.yaml"}}}
    assert (
        "leads out of local/"
        in by_path(issues_of(parse_study_runtime, doc, "k8s", local))["studies.a.pod_template"]
    )


def test_slurm_block():
    doc, _ = entry(
        "slurm",
        slurm={
            "sandbox": "apptainer",
            "partition": "gpu",
            "account": "a",
            "qos": "q",
            "python_path": "/opt/py/bin/python",
        },
    )
    assert parse_study_runtime(doc, "slurm").entry("pathology").slurm.sandbox == "apptainer"
    assert (
        "must be one of 'none', 'apptainer' or 'pyxis'"
        in problems("slurm", slurm={"sandbox": "docker"})["studies.pathology.slurm.sandbox"]
    )


def test_format_version_and_document_shape():
    issues = by_path(issues_of(parse_study_runtime, {"format_version": 1, "studies": {}}, "k8s"))
    assert issues["format_version"].startswith("this atoll reads format_version 2, not 1")
    assert issues_of(parse_study_runtime, None, "k8s")[0].message.startswith("must be a mapping")
    assert "format_version" in by_path(issues_of(parse_study_runtime, {"studies": {}}, "k8s"))


def test_all_errors_of_a_file_together_with_their_yaml_paths(tmp_path):
    (tmp_path / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  pathology:\n    datasets: {slides: {source: pvc}}\n"
        "    env: {PYTHONPATH: /x, E: ''}\n    docker_kwargs: {image: x}\n    unknown: 1\n"
    )
    issues = issues_of(load_study_runtime, tmp_path, "k8s")
    assert [i.path for i in issues] == [
        "studies.pathology.datasets.slides.mode",
        "studies.pathology.docker_kwargs",
        "studies.pathology.env.E",
        "studies.pathology.env.PYTHONPATH",
        "studies.pathology.unknown",
    ]


def test_secret_values_never_appear_in_errors():
    issues = problems("docker", secret_env={"DB": "hunter2-the-password"})
    assert "hunter2" not in "".join(issues.values())


def test_study_entry_documents_every_field():
    assert all(f.description for f in StudyEntry.model_fields.values())
