from __future__ import annotations

from pathlib import Path

import pytest

from atoll.spec.site_config import (
    DockerSettings,
    K8sSettings,
    ProcessSettings,
    SiteConfig,
    SlurmSettings,
    load_site_config,
    parse_site_config,
)

from .helpers import by_path, issues_of

FIXTURES = Path(__file__).parents[2] / "fixtures/seed"


def test_every_field_of_every_model_is_documented():
    for model in (SiteConfig, ProcessSettings, DockerSettings, K8sSettings, SlurmSettings):
        assert all(f.description for f in model.model_fields.values()), model


def test_design_example_and_defaults():
    cfg = parse_site_config(
        {
            "launcher": "slurm",
            "slurm": {
                "partition": "gpu",
                "account": "fl",
                "qos": "normal",
                "sandbox": "none",
                "pending_timeout": 600,
            },
            "capacity": {"gpus": 8, "cpus": 64, "memory": "512Gi"},
        }
    )
    assert cfg.settings.partition == "gpu"
    assert cfg.settings.sbatch == "sbatch"
    assert (cfg.capacity.gpus, cfg.capacity.cpus, cfg.capacity.memory) == (8, 64, "512Gi")
    assert (cfg.worker_endpoint.host, cfg.worker_endpoint.port) == ("127.0.0.1", 0)


def test_settings_default_when_the_block_is_absent():
    cfg = parse_site_config({"launcher": "k8s"})
    assert isinstance(cfg.settings, K8sSettings)
    assert (cfg.settings.namespace, cfg.settings.pending_timeout) == ("default", 600)
    assert cfg.capacity.gpus is None


def test_process_block_from_the_fixture_file():
    cfg = load_site_config(FIXTURES / "site_process.yaml")
    assert cfg.settings.gpu_ids == ["0", "1"]
    assert cfg.settings.cpu_ids == list(range(8))


def test_a_block_for_another_launcher_is_an_error_naming_it():
    issues = by_path(issues_of(parse_site_config, {"launcher": "docker", "slurm": {}, "k8s": {}}))
    assert issues["slurm"] == (
        "settings for the slurm launcher, but this site's launcher is "
        "docker: remove this block or set launcher: slurm"
    )
    assert "k8s" in issues


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        ({"launcher": "lsf"}, "launcher", "must be one of 'process', 'docker', 'k8s' or 'slurm'"),
        ({}, "launcher", "required key is missing"),
        (
            {"launcher": "process", "process": {"gpu_ids": [0, 0]}},
            "process.gpu_ids[1]",
            "listed twice",
        ),
        (
            {"launcher": "process", "process": {"gpus": [0]}},
            "process.gpus",
            "unknown key; allowed keys: python, workdir, gpu_ids, cpu_ids",
        ),
        (
            {"launcher": "docker", "docker": {"run_kwargs": {"privileged": True}}},
            "docker.run_kwargs.privileged",
            "control of this host",
        ),
        (
            {"launcher": "docker", "docker": {"run_kwargs": {"volumes": {}}}},
            "docker.run_kwargs.volumes",
            "set by the docker launcher",
        ),
        (
            {"launcher": "k8s", "k8s": {"in_cluster": True, "kubeconfig": "/k"}},
            "k8s",
            "choose one: kubeconfig or in_cluster",
        ),
        (
            {"launcher": "k8s", "k8s": {"namespace": "Bad_NS"}},
            "k8s.namespace",
            "not a Kubernetes name",
        ),
        (
            {"launcher": "slurm", "slurm": {"sandbox": "docker"}},
            "slurm.sandbox",
            "must be one of 'none', 'apptainer' or 'pyxis'",
        ),
        ({"launcher": "slurm", "slurm": {"time": "soon"}}, "slurm.time", "is not a Slurm time"),
        (
            {"launcher": "slurm", "slurm": {"pending_timeout": 0}},
            "slurm.pending_timeout",
            "at least 1",
        ),
        ({"launcher": "process", "capacity": {"memory": "1TB"}}, "capacity.memory", "Mi, Gi or Ti"),
        ({"launcher": "process", "capacity": {"gpus": -1}}, "capacity.gpus", "at least 0"),
        (
            {"launcher": "process", "worker_endpoint": {"port": 70000}},
            "worker_endpoint.port",
            "at most 65535",
        ),
        ({"launcher": "process", "capacity": None}, "capacity", "null is not allowed"),
    ],
)
def test_rules(doc, path, message):
    issues = by_path(issues_of(parse_site_config, doc))
    assert message in issues[path], issues


def test_all_errors_together_with_the_file_name(tmp_path):
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True)
    (local / "site.yaml").write_text(
        "launcher: slurm\nslurm: {qos: true, bogus: x}\ncapacity: {cpus: 0}\n"
    )
    with pytest.raises(Exception) as info:
        load_site_config(tmp_path / "kit")
    text = str(info.value)
    assert text.startswith(f"{local / 'site.yaml'}: 3 problems")
    for part in ("slurm.qos: must be a string", "slurm.bogus: unknown key", "capacity.cpus"):
        assert part in text


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    (tmp_path / "site.yaml").write_text("launcher: [process\n")
    (issue,) = issues_of(load_site_config, tmp_path / "site.yaml")
    assert issue.message.startswith("not valid YAML at line 2")


def test_relative_paths_are_relative_to_the_kit(tmp_path):
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True)
    (local / "site.yaml").write_text("launcher: process\nprocess: {workdir: runs}\n")
    cfg = load_site_config(local)
    assert cfg.kit_dir == (tmp_path / "kit").resolve()
    assert cfg.resolve_path(cfg.settings.workdir) == (tmp_path / "kit").resolve() / "runs"
    assert cfg.resolve_path("/abs") == Path("/abs")


def test_worker_endpoint_listening_everywhere_needs_an_advertised_address():
    from atoll.spec.errors import SpecError
    from atoll.spec.site_config import parse_site_config

    with pytest.raises(SpecError, match="worker_endpoint.advertise: host 0.0.0.0 listens"):
        parse_site_config({"launcher": "process", "worker_endpoint": {"host": "0.0.0.0"}})
    endpoint = parse_site_config({"launcher": "process", "worker_endpoint": {
        "host": "0.0.0.0", "advertise": "node-7.cluster"}}).worker_endpoint
    assert (endpoint.dial_host, endpoint.uses_tls) == ("node-7.cluster", True)
    loopback = parse_site_config({"launcher": "process"}).worker_endpoint
    assert not loopback.uses_tls


def _process(block):
    return parse_site_config({"launcher": "process", "process": block}).settings


def test_process_network_is_isolated_by_default_and_host_is_an_explicit_opt_out():
    assert _process({}).network.mode == "isolated" and _process({}).isolated_network
    assert not _process({"network": "host"}).isolated_network
    assert _process({"network": "isolated"}).network.mode == "isolated"
    # sandbox: none has no namespace to give: it shares the host's network
    assert not _process({"sandbox": "none"}).isolated_network
    assert not _process({"sandbox": "none", "network": "host"}).isolated_network


def test_allowed_destinations_get_an_address_in_the_sandbox():
    settings = _process({"network": {"allow": ["127.0.0.1:5000", "mlflow.example.org:443",
                                               "localhost:80", "Tracking-2.local:5000"]}})
    assert settings.network.destinations() == [
        ("127.0.0.1", 5000, "127.0.0.1"), ("mlflow.example.org", 443, "127.0.100.1"),
        ("localhost", 80, "127.0.0.1"), ("Tracking-2.local", 5000, "127.0.100.2")]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("10.0.0.5:5000", "name the destination by its host name"),
        ("[::1]:5000", "name the destination by its host name"),
        ("mlflow", "must be host:port"),
        ("mlflow:0", "port from 1 to 65535"),
        ("mlflow:99999", "port from 1 to 65535"),
        ("ml flow:80", "is not a host name"),
        ("-bad.example:80", "is not a host name"),
        ("1.2.3:80", "is not a host name"),
        ("a/b:80", "is not a host name"),
    ],
)
def test_an_allowed_destination_must_be_a_host_name_or_loopback_and_a_port(entry, message):
    issues = by_path(issues_of(parse_site_config, {
        "launcher": "process", "process": {"network": {"allow": [entry]}}}))
    assert message in issues["process.network.allow[0]"], issues


def test_allowed_destinations_are_bounded():
    allow = [f"host-{i}.example:443" for i in range(201)]  # one relay (two threads) each
    issues = by_path(issues_of(parse_site_config, {
        "launcher": "process", "process": {"network": {"allow": allow}}}))
    assert "at most 200 destinations" in issues["process.network.allow"], issues
    assert len(_process({"network": {"allow": allow[:200]}}).network.destinations()) == 200


@pytest.mark.parametrize(
    ("block", "path", "message"),
    [
        ({"network": "open"}, "process.network.mode", "must be one of 'isolated' or 'host'"),
        ({"network": {"mode": "host", "allow": ["a.b:1"]}}, "process.network.allow",
         "reaches every destination already"),
        ({"network": {"allow": ["127.0.0.1:80", "localhost:80"]}}, "process.network.allow[1]",
         "listed twice"),
        ({"network": {"allow": ["a.b:1"], "open": True}}, "process.network.open", "unknown key"),
        ({"sandbox": "none", "network": {"allow": ["a.b:1"]}}, "process.network",
         "sandbox: none shares the host's network"),
    ],
)
def test_process_network_rules(block, path, message):
    issues = by_path(issues_of(parse_site_config, {"launcher": "process", "process": block}))
    assert message in issues[path], issues
