"""Slurm renders of FLARE-format inputs against NVIDIA FLARE 2.9's Slurm launcher
(app_opt/job_launcher/slurm/launcher.py _resolve_resources and _effective_study_values,
slurm/batch.py _submission_argv, slurm/config.py normalize_slurm_directives; their tests
slurm_launcher_test.py, slurm_batch_test.py). Ids name the behaviour checked."""

from __future__ import annotations

import pytest

from atoll.launchers.base import LaunchError
from atoll.launchers.slurm_render import render_slurm
from atoll.spec.errors import SpecError
from atoll.spec.site_config import parse_site_config
from tests.compat.flare_requests import flare_request, site_block


def argv(**kwargs) -> list[str]:
    return render_slurm(flare_request("slurm", **kwargs))["sbatch_argv"]


def flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


@pytest.mark.parametrize(("resource_spec", "slurm", "expected"), [
    pytest.param({}, {"mem_per_node": 32768}, {"mem": "32768M"},
                 id="batch-mem_per_node-integer-MiB"),
    pytest.param({}, {"mem_per_node": "32Gi"}, {"mem": "32768M"},
                 id="atoll-mem_per_node-32Gi-keeps-working"),
    pytest.param({}, {"cpus_per_node": 8}, {"cpus-per-task": "8"},
                 id="batch-cpus_per_node"),
    pytest.param({"@default": {"num_of_cpus": 4, "memory": "16Gi"}}, {"nodes": 2},
                 {"cpus-per-task": "4", "mem": "16384M", "nodes": "2", "ntasks": "2"},
                 id="launcher-num_of_cpus-and-memory-are-per-node"),
    pytest.param({"@default": {"num_of_gpus": 8}}, {"nodes": 2, "gpus_per_node": 4},
                 {"gres": "gpu:4", "nodes": "2"}, id="launcher-gpus_per_node-on-two-nodes"),
    pytest.param({"@default": {"num_of_gpus": 2}}, {}, {"gres": "gpu:2"},
                 id="launcher-one-node-gets-every-gpu"),
    pytest.param({}, {"time": "02:00:00"}, {"time": "02:00:00"}, id="batch-time-directive"),
])
def test_slurm_resources_render_as_flare_renders_them(resource_spec, slurm, expected):
    args = argv(resource_spec=resource_spec, launcher_spec=site_block("slurm", **slurm))
    assert {name: flag(args, name) for name in expected} == expected


def test_batch_no_resource_spec_sets_no_cpus_or_mem_directive():
    args = argv()
    assert flag(args, "cpus-per-task") is None and flag(args, "mem") is None
    assert flag(args, "gres") is None


def test_launcher_without_cpus_srun_gets_no_cpus_per_task_either():
    script = render_slurm(flare_request(
        "slurm", launcher_spec=site_block("slurm", nodes=2)))["script"]
    assert "exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --export=ALL" in script


@pytest.mark.parametrize(("value", "text"), [
    pytest.param(1234, "1234", id="config-directive-account-integer"),
    pytest.param("fl-lab", "fl-lab", id="config-directive-account-text"),
])
def test_config_site_account_as_a_number(value, text):
    args = argv(settings={"partition": "gpu", "account": value})
    assert flag(args, "account") == text


@pytest.mark.parametrize("key", ["partition", "account", "qos"])
def test_config_site_directive_with_whitespace_is_refused(key):
    with pytest.raises(SpecError, match=rf"slurm\.{key}: .* contains whitespace"):
        parse_site_config({"launcher": "slurm", "slurm": {key: "gpu long"}})


def test_study_runtime_study_directives_as_numbers_win_over_the_sites():
    study = {"slurm": {"account": 4242, "qos": "high"}}
    args = argv(study=study)
    assert (flag(args, "account"), flag(args, "qos"), flag(args, "partition")) == (
        "4242", "high", "gpu")


@pytest.mark.parametrize("key", ["partition", "account", "qos"])
def test_study_runtime_study_directive_with_whitespace_is_refused(key):
    with pytest.raises(SpecError, match=rf"studies\.lung\.slurm\.{key}"):
        flare_request("slurm", study={"slurm": {key: "a b"}})


def test_study_runtime_slurm_setup_runs_before_the_worker():
    setup = "source /opt/studies/lung-cancer.sh\nmodule load cuda"
    script = render_slurm(flare_request("slurm", study={"slurm": {"setup": setup}}))["script"]
    assert setup in script
    assert script.index(setup) < script.index("# Start the worker.")


def test_study_runtime_secret_env_source_only_on_slurm():
    """FLARE Slurm: source names a parent variable, key may be left out."""
    rendered = render_slurm(flare_request(
        "slurm", study={"secret_env": {"DB_PASSWORD": {"source": "LUNG_DB_PASSWORD"}}}))
    assert "DB_PASSWORD" in rendered["secrets_file"]["variables"]
    assert "LUNG_DB_PASSWORD" not in rendered["script"]


def test_study_runtime_empty_env_value_is_kept_on_slurm():
    script = render_slurm(flare_request("slurm", study={"env": {"DEBUG_FLAGS": ""}}))["script"]
    assert "export DEBUG_FLAGS=''" in script


@pytest.mark.parametrize("name", [
    "SLURM_CPUS_PER_TASK", "APPTAINER_BIND", "APPTAINERENV_X", "SINGULARITY_BIND",
    "SINGULARITYENV_X", "BASHOPTS", "UID",
])
def test_study_runtime_slurm_owned_env_names_are_refused(name):
    with pytest.raises(SpecError, match=rf"studies\.lung\.env\.{name}"):
        flare_request("slurm", study={"env": {name: "1"}})


def test_study_runtime_slurm_owned_secret_env_names_are_refused():
    with pytest.raises(SpecError, match=r"studies\.lung\.secret_env\.SLURM_JOB_NAME"):
        flare_request("slurm", study={"secret_env": {"SLURM_JOB_NAME": {"source": "X"}}})


def test_study_runtime_container_with_study_sandbox_none_is_refused():
    study = {"container": {"image": "/images/lung.sif"}, "slurm": {"sandbox": "none"}}
    with pytest.raises(SpecError, match=r"studies\.lung\.container"):
        flare_request("slurm", study=study)


def test_effective_study_values_container_with_site_sandbox_none_is_refused():
    request = flare_request("slurm", study={"container": {"image": "/images/lung.sif"}})
    with pytest.raises(LaunchError, match="studies.lung.container"):
        render_slurm(request)


def test_effective_study_values_container_with_apptainer_is_used():
    study = {"container": {"image": "/images/lung.sif"}, "slurm": {"sandbox": "apptainer"}}
    assert "/images/lung.sif" in render_slurm(flare_request("slurm", study=study))["script"]


@pytest.mark.parametrize(("study", "path"), [
    pytest.param({"datasets": {"ref": {"source": "/srv/a:b", "mode": "ro"}},
                  "slurm": {"sandbox": "apptainer"}}, "datasets.ref.source",
                 id="study_runtime-mount-operand-colon"),
    pytest.param({"datasets": {"ref": {"source": "/srv/a,b", "mode": "ro"}},
                  "slurm": {"sandbox": "apptainer"}}, "datasets.ref.source",
                 id="study_runtime-mount-operand-comma"),
    pytest.param({"secret_mounts": {"db": {"source": "/srv/db", "mount_path": "/run/a:b"}},
                  "slurm": {"sandbox": "apptainer"}}, "secret_mounts.db.mount_path",
                 id="study_runtime-secret-mount-path-colon"),
    pytest.param({"secret_mounts": {"db": {"source": "/srv/db", "mount_path": "/proc/db"}},
                  "slurm": {"sandbox": "apptainer"}}, "secret_mounts.db.mount_path",
                 id="config-mount-destination-under-proc"),
    pytest.param({"secret_mounts": {"db": {"source": "/srv/db", "mount_path": "/dev/db"}},
                  "slurm": {"sandbox": "apptainer"}}, "secret_mounts.db.mount_path",
                 id="config-mount-destination-under-dev"),
])
def test_slurm_mount_paths_flare_refuses(study, path):
    with pytest.raises(SpecError, match=rf"studies\.lung\.{path}"):
        flare_request("slurm", study=study)


def test_per_node_resources_count_once_per_node_in_the_sites_capacity():
    """num_of_cpus and memory are per node (FLARE 2.9): a 2-node job of 4 CPUs and 16Gi holds
    8 CPUs and 32Gi of the site's capacity (atoll's admission; FLARE's resource manager does
    not count CPUs or memory)."""
    from atoll.spec.admission import fits

    request = flare_request("slurm", resource_spec={"@default": {"num_of_cpus": 4,
                                                                 "memory": "16Gi"}},
                            launcher_spec=site_block("slurm", nodes=2))
    res = request.resources
    assert (res.nodes, res.cpus_counted, res.memory_counted) == (2, 8, 32 << 30)
    assert fits({"cpus": 8, "memory": "32Gi"}, [], res) is None
    assert fits({"cpus": 7}, [], res) == "8 CPU(s) asked, 7 free"
    assert fits({"memory": "24Gi"}, [], res) == (
        "16Gi memory asked on each of 2 nodes, 24576Mi free")
