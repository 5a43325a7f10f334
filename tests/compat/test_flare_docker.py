"""Docker renders of FLARE-format inputs against what NVIDIA FLARE 2.9's Docker launcher passes
to ``containers.run`` (FLARE's app_opt/job_launcher/docker_launcher.py and
utils/job_launcher_utils.py; their tests docker_launcher_test.py). Ids name the behaviour."""

from __future__ import annotations

import pytest

from atoll.launchers.docker_render import render_docker
from tests.compat.flare_requests import flare_request, site_block

GIB = 1 << 30


def run_kwargs(**kwargs):
    return render_docker(flare_request("docker", **kwargs))["containers.run"]


@pytest.mark.parametrize(("shm_size", "bytes_"), [
    pytest.param("8g", 8 * GIB, id="utils-shm_size-8g"),
    pytest.param("8gb", 8 * GIB, id="utils-shm_size-8gb"),
    pytest.param("8G", 8 * GIB, id="utils-shm_size-upper-case-unit"),
    pytest.param("512m", 512 << 20, id="utils-shm_size-512m"),
    pytest.param("1.5g", int(1.5 * GIB), id="utils-shm_size-decimal"),
    pytest.param("64k", 64 << 10, id="utils-shm_size-k"),
    pytest.param("1024", 1024, id="utils-shm_size-digits-are-bytes"),
    pytest.param("100b", 100, id="utils-shm_size-b"),
    pytest.param(1073741824, GIB, id="utils-shm_size-integer-bytes"),
    pytest.param("2Gi", 2 * GIB, id="atoll-shm_size-2Gi-keeps-working"),
])
def test_shm_size_in_dockers_units_renders_the_same_bytes(shm_size, bytes_):
    assert run_kwargs(launcher_spec=site_block("docker", shm_size=shm_size))["shm_size"] == bytes_


@pytest.mark.parametrize("shm_size", [
    pytest.param("8t", id="utils-shm_size-unknown-unit"),
    pytest.param("-1g", id="utils-shm_size-negative"),
    pytest.param("9999999999g", id="utils-shm_size-above-docker-64-bit-limit"),
    pytest.param(True, id="utils-shm_size-bool"),
])
def test_shm_sizes_flare_refuses(shm_size):
    from atoll.spec.errors import SpecError

    with pytest.raises(SpecError, match=r"launcher_spec\.site-1\.docker\.shm_size"):
        flare_request("docker", launcher_spec=site_block("docker", shm_size=shm_size))


def test_docker_launcher_no_resource_spec_sets_no_cpu_or_memory_limit():
    kwargs = run_kwargs()
    assert "nano_cpus" not in kwargs and "mem_limit" not in kwargs
    assert kwargs["device_requests"] == []


def test_docker_launcher_portable_cpus_and_memory():
    kwargs = run_kwargs(resource_spec={"@default": {"num_of_cpus": 4, "memory": "64Gi"}})
    assert kwargs["nano_cpus"] == 4_000_000_000
    assert kwargs["mem_limit"] == 64 * GIB


def test_docker_launcher_native_num_of_gpus_becomes_a_device_request():
    # FLARE asks the engine for a count (always its first N GPUs); atoll for the reserved ids.
    kwargs = run_kwargs(launcher_spec=site_block("docker", num_of_gpus=2))
    assert [r["device_ids"] for r in kwargs["device_requests"]] == [["0", "1"]]
    assert "NVIDIA_VISIBLE_DEVICES" not in kwargs["environment"]


def test_docker_launcher_explicit_zero_gpus_declines_gpus():
    kwargs = run_kwargs(launcher_spec=site_block("docker", num_of_gpus=0))
    assert kwargs["device_requests"] == []
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_docker_launcher_default_block_merges_under_the_site_block():
    spec = {"default": {"docker": {"shm_size": "1g", "num_of_gpus": 1}},
            "site-1": {"docker": {"shm_size": "2g"}}}
    kwargs = run_kwargs(launcher_spec=spec)
    assert kwargs["shm_size"] == 2 * GIB
    assert [r["device_ids"] for r in kwargs["device_requests"]] == [["0"]]


def test_design_doc_nested_resource_spec_docker_block_is_used():
    kwargs = run_kwargs(resource_spec={"site-1": {"docker": {"shm_size": "8g"}}})
    assert kwargs["shm_size"] == 8 * GIB


def test_study_runtime_secret_env_source_is_a_parent_variable_on_docker():
    """FLARE's docker launcher reads os.environ[source]; key is unused."""
    study = {"secret_env": {"DB_PASSWORD": {"source": "LUNG_DB_PASSWORD", "key": "unused"}}}
    rendered = render_docker(flare_request("docker", study=study))
    assert rendered["secret_env"]["DB_PASSWORD"] == "$LUNG_DB_PASSWORD of the site parent's " \
        "environment"
    assert "DB_PASSWORD" not in rendered["containers.run"]["environment"]


@pytest.mark.parametrize(("value", "text"), [
    pytest.param(5, "5", id="study_runtime-env-int"),
    pytest.param(0.5, "0.5", id="study_runtime-env-float"),
    pytest.param(True, "true", id="study_runtime-env-true-lowercase"),
    pytest.param(False, "false", id="study_runtime-env-false-lowercase"),
])
def test_study_runtime_scalar_env_values_become_text(value, text):
    env = run_kwargs(study={"env": {"EPOCHS": value}})["environment"]
    assert env["EPOCHS"] == text


def test_study_runtime_docker_kwargs_shm_size_passes_to_the_sdk_as_written():
    """FLARE's design doc example: docker_kwargs {shm_size: 8g} is an SDK kwarg as is."""
    assert run_kwargs(study={"docker_kwargs": {"shm_size": "8g"}})["shm_size"] == "8g"


def test_job_shm_size_wins_over_the_studys_docker_kwargs():
    """FLARE: site kwargs -> study docker_kwargs -> job launcher_spec (job wins)."""
    kwargs = run_kwargs(study={"docker_kwargs": {"shm_size": "8g"}},
                        launcher_spec=site_block("docker", shm_size="1g"))
    assert kwargs["shm_size"] == GIB
