"""The Docker launcher's pure half: containers.run kwargs from a job and a site (golden files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.launchers.base import JobIdentity, LaunchError, Outcome
from atoll.launchers.docker import exit_to_outcome
from atoll.launchers.docker_render import render_docker
from atoll.launchers.request import build_request
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.golden import assert_golden

SEED = Path(__file__).parents[2] / "fixtures" / "seed"
JOB_ID = "0123456789abcdef0123456789abcdef"
WORKDIR = Path("/srv/atoll/site-a/workspace") / JOB_ID
SEED_RESOURCES = json.loads((SEED / "meta.json").read_text())["resource_spec"]
# The seed's pathology study at a docker site: host paths, parent-environment secrets.
PATHOLOGY = yaml.safe_load((SEED / "study_runtime_host.yaml").read_text())["studies"]["pathology"]


def request_for(
    site: str = "hospital-a",
    *,
    docker: dict[str, Any] | None = None,
    study: dict[str, Any] | None = None,
    resource_spec: dict[str, Any] | None = None,
    launcher_spec: dict[str, Any] | None = None,
    parent: str = "127.0.0.1:7001",
) -> Any:
    """A LaunchRequest built the way the site parent builds it, from parsed documents."""
    # The host's eight GPUs, listed as a site lists them (each container gets its own ids).
    docker = {"gpu_ids": list(range(8)), **(docker or {})}
    site_config = parse_site_config({"launcher": "docker", "docker": docker})
    runtime = parse_study_runtime(
        {"format_version": 2, "studies": {"pathology": PATHOLOGY if study is None else study}},
        "docker",
    )
    meta = load_meta(
        {
            "name": "pathology-fedavg",
            "deploy_map": {"app": ["@ALL"]},
            "resource_spec": SEED_RESOURCES if resource_spec is None else resource_spec,
            "launcher_spec": launcher_spec or {},
        }
    )
    role = "server" if site == "server" else "site"
    identity = JobIdentity(JOB_ID, "pathology-fedavg", "pathology", site, role)
    return build_request(
        meta=meta,
        identity=identity,
        site_config=site_config,
        study_runtime=runtime,
        workdir=WORKDIR,
        parent_address=parent,
        credentials={"ATOLL_JOB_TOKEN": "tok-SECRET-VALUE"},
        check_capacity=False,
    )


def run_kwargs(request: Any, **options: Any) -> dict[str, Any]:
    return render_docker(request, **options)["containers.run"]


# --- the seed's example --------------------------------------------------------------------------


def test_seed_hospital_golden() -> None:
    rendered = render_docker(request_for("hospital-a"))
    assert_golden("docker/seed_hospital_a", rendered)
    kwargs = rendered["containers.run"]
    assert kwargs["nano_cpus"] == 4_000_000_000
    assert kwargs["mem_limit"] == 68_719_476_736
    assert kwargs["device_requests"] == [
        {"driver": "", "count": 0, "device_ids": ["0"], "capabilities": [["gpu"]]}
    ]
    assert kwargs["image"] == "registry.example.com/pathology-trainer:1.0"
    assert rendered["image_source"] == "local/study_runtime.yaml studies.pathology.container.image"


def test_seed_pathology_dataset_is_a_read_only_bind() -> None:
    mounts = run_kwargs(request_for())["mounts"]
    slides = [m for m in mounts if m["Target"] == "/data/pathology/slides"]
    assert slides == [
        {
            "Type": "bind",
            "Source": "/srv/pathology/slides",
            "Target": "/data/pathology/slides",
            "ReadOnly": True,
        }
    ]


def test_seed_server_and_university_golden() -> None:
    server = render_docker(request_for("server"))
    university = render_docker(request_for("university"))
    assert_golden("docker/seed_server", server)
    assert_golden("docker/seed_university", university)
    # An explicit 0 drops the GPU @default asked for: no device request at all.
    assert server["containers.run"]["device_requests"] == []
    assert server["containers.run"]["labels"]["atoll.role"] == "server"
    university_gpus = university["containers.run"]["device_requests"][0]
    assert university_gpus["device_ids"] == [str(i) for i in range(8)]
    assert university_gpus["count"] == 0


def test_no_memory_asked_means_no_limit() -> None:
    kwargs = run_kwargs(request_for(resource_spec={"@default": {"num_of_cpus": 2}}))
    assert "mem_limit" not in kwargs and "memswap_limit" not in kwargs
    assert kwargs["nano_cpus"] == 2_000_000_000


# --- secrets -------------------------------------------------------------------------------------


def test_secret_values_never_rendered_only_references() -> None:
    rendered = render_docker(request_for())
    assert "tok-SECRET-VALUE" not in json.dumps(rendered)
    env = rendered["containers.run"]["environment"]
    assert not {"ATOLL_JOB_TOKEN", "DB_USER", "DB_PASSWORD"} & env.keys()
    assert rendered["secret_env"] == {
        "ATOLL_JOB_TOKEN": "credential of this job, set at launch",
        "DB_PASSWORD": "$PATHOLOGY_DB_PASSWORD of the site parent's environment",
        "DB_USER": "$PATHOLOGY_DB_USER of the site parent's environment",
    }


def test_worker_environment() -> None:
    env = run_kwargs(request_for(study={**PATHOLOGY, "env": {"OMP_NUM_THREADS": "4"}}))
    env = env["environment"]
    assert env == {
        "ATOLL_DATA_ROOT": "/data/pathology",
        "ATOLL_DATASETS": '{"slides": "/data/pathology/slides"}',
        "ATOLL_JOB_ID": JOB_ID,
        "ATOLL_PARENT": "unix:/atoll/job/.atoll-parent.sock",  # the relay to 127.0.0.1:7001
        "ATOLL_ROLE": "site",
        "ATOLL_SITE": "hospital-a",
        "ATOLL_STUDY": "pathology",
        "ATOLL_WORKDIR": "/atoll/job",
        "OMP_NUM_THREADS": "4",
    }


# --- image precedence ----------------------------------------------------------------------------


def job_image(image: str) -> dict[str, Any]:
    return {"default": {"docker": {"image": image}}}


def test_job_image_used_when_the_site_allows_it() -> None:
    rendered = render_docker(
        request_for(
            docker={"allow_job_images": ["registry.example.com/fl/*"]},
            launcher_spec=job_image("registry.example.com/fl/trainer:2"),
        )
    )
    assert rendered["containers.run"]["image"] == "registry.example.com/fl/trainer:2"
    assert rendered["image_source"] == "the job's meta.json launcher_spec (docker.image)"


def test_job_image_not_allowed_is_refused_naming_the_setting() -> None:
    request = request_for(
        docker={"allow_job_images": ["registry.example.com/fl/*"]},
        launcher_spec=job_image("evil.example.net/miner:1"),
    )
    with pytest.raises(LaunchError) as err:
        render_docker(request)
    message = str(err.value)
    assert "evil.example.net/miner:1" in message
    assert "docker.allow_job_images in local/site.yaml: registry.example.com/fl/*" in message
    assert "registry.example.com/pathology-trainer:1.0" in message  # what it would use instead


def test_site_default_image_when_the_study_names_none() -> None:
    study = {k: v for k, v in PATHOLOGY.items() if k != "container"}
    rendered = render_docker(request_for(docker={"default_image": "site/job:1"}, study=study))
    assert rendered["containers.run"]["image"] == "site/job:1"
    assert rendered["image_source"] == "local/site.yaml docker.default_image"


def test_no_image_anywhere_says_where_to_set_one() -> None:
    study = {k: v for k, v in PATHOLOGY.items() if k != "container"}
    with pytest.raises(LaunchError, match=r"studies\.pathology\.container\.image.*default_image"):
        render_docker(request_for(study=study))


# --- kwargs precedence and forbidden kwargs -----------------------------------------------------


def test_kwargs_precedence_site_then_study_then_job() -> None:
    site = {"run_kwargs": {"shm_size": "1g", "pids_limit": 512, "init": False}}
    study = {**PATHOLOGY, "docker_kwargs": {"shm_size": "2g", "ulimits": [], "user": "0:0"}}
    kwargs = run_kwargs(request_for(docker=site, study=study))
    assert kwargs["shm_size"] == "2g"  # the study's docker_kwargs over the site's run_kwargs
    assert kwargs["pids_limit"] == 512 and kwargs["init"] is False and kwargs["ulimits"] == []
    assert kwargs["user"] == "0:0"  # an operator's explicit choice
    job = {"default": {"docker": {"shm_size": "4Gi"}}}
    kwargs = run_kwargs(request_for(docker=site, study=study, launcher_spec=job))
    assert kwargs["shm_size"] == 4 * 1024**3  # the job's launcher_spec over both


@pytest.mark.parametrize("key", ["volumes", "image", "environment", "network_mode", "labels"])
def test_launcher_owned_kwargs_refused_in_study_runtime(key: str) -> None:
    with pytest.raises(SpecError, match=rf"docker_kwargs\.{key}: set by the docker launcher"):
        request_for(study={**PATHOLOGY, "docker_kwargs": {key: "x"}})


@pytest.mark.parametrize("key", ["privileged", "cap_add", "pid_mode", "volumes_from"])
def test_host_control_kwargs_refused_in_site_yaml(key: str) -> None:
    with pytest.raises(SpecError, match=rf"run_kwargs\.{key}: not allowed"):
        request_for(docker={"run_kwargs": {key: True}})


def test_forbidden_kwargs_refused_by_render_even_without_the_spec_layer() -> None:
    request = request_for()
    request.study_runtime.docker_kwargs["volumes"] = {"/var/run/docker.sock": {"bind": "/s"}}
    with pytest.raises(
        LaunchError,
        match=r"^local/study_runtime\.yaml: studies\.pathology\.docker_kwargs\.volumes: set by",
    ):
        render_docker(request)


@pytest.mark.parametrize("source", ["/var/run/docker.sock", "/var/run", "/run", "/"])
def test_engine_socket_is_never_mounted(source: str) -> None:
    study = {**PATHOLOGY, "datasets": {"sock": {"source": source, "mode": "ro"}}}
    with pytest.raises(LaunchError, match=r"datasets\.sock\.source .*socket"):
        render_docker(request_for(study=study))


def test_the_sites_own_engine_socket_is_never_mounted() -> None:
    study = {**PATHOLOGY, "secret_mounts": {"s": {"source": "/opt/engine", "mount_path": "/s"}}}
    request = request_for(study=study)
    render_docker(request)  # fine for an engine elsewhere
    with pytest.raises(LaunchError, match=r"secret_mounts\.s\.source"):
        render_docker(request, engine_socket="/opt/engine/docker.sock")


# --- network and user ----------------------------------------------------------------------------


def test_default_is_no_network_and_the_parent_through_the_relay_socket() -> None:
    for parent in ("127.0.0.1:7001", "localhost:7001", "[::1]:7001", "10.0.0.5:7001"):
        for network in (None, "none"):
            kwargs = run_kwargs(request_for(parent=parent, docker={"network": network}
                                            if network else {}))
            assert kwargs["network_mode"] == "none" and "network" not in kwargs
            assert kwargs["environment"]["ATOLL_PARENT"] == "unix:/atoll/job/.atoll-parent.sock"
            # The socket is in the run folder: no mount of its own.
            assert [m["Target"] for m in kwargs["mounts"]] == ["/atoll/job",
                                                               "/data/pathology/slides"]


def test_site_network_with_a_routable_parent_dials_it_directly() -> None:
    kwargs = run_kwargs(request_for(docker={"network": "atoll-net"}, parent="site-a-parent:7001"))
    assert kwargs["network"] == "atoll-net" and "network_mode" not in kwargs
    assert kwargs["environment"]["ATOLL_PARENT"] == "site-a-parent:7001"
    assert kwargs["environment"]["ATOLL_PARENT"] == "site-a-parent:7001"


def test_site_network_with_a_loopback_parent_goes_through_the_relay() -> None:
    # Once a refusal at every launch; a loopback parent is reachable through the socket.
    kwargs = run_kwargs(request_for(docker={"network": "atoll-net"}))
    assert kwargs["network"] == "atoll-net" and "network_mode" not in kwargs
    assert kwargs["environment"]["ATOLL_PARENT"] == "unix:/atoll/job/.atoll-parent.sock"


def test_host_network_only_when_the_site_opts_out() -> None:
    kwargs = run_kwargs(request_for(docker={"network": "host"}))
    assert kwargs["network_mode"] == "host"
    assert kwargs["environment"]["ATOLL_PARENT"] == "127.0.0.1:7001"


def test_a_relayed_worker_gets_no_parent_certificate() -> None:
    # The relay reaches the parent's unix socket: no TLS there, so no certificate to pin.
    request = request_for(parent="10.0.0.5:7001")
    request.worker_env["ATOLL_PARENT_CERT"] = "-----BEGIN CERTIFICATE-----"
    env = run_kwargs(request)["environment"]
    assert "ATOLL_PARENT_CERT" not in env and env["ATOLL_PARENT"] == "unix:/atoll/job/.atoll-parent.sock"


@pytest.mark.parametrize("docker, endpoint, where", [
    ({"base_url": "tcp://gpu-host:2376"}, {}, "docker.network"),
    ({"base_url": "tcp://gpu-host:2376", "network": "none"}, {}, "docker.network"),
    ({"base_url": "ssh://gpu-host", "network": "fl"}, {}, "worker_endpoint.host"),
])
def test_network_combinations_that_cannot_reach_the_parent_fail_validation(
    docker: dict[str, Any], endpoint: dict[str, Any], where: str
) -> None:
    with pytest.raises(SpecError, match=where):
        parse_site_config({"launcher": "docker", "docker": docker, "worker_endpoint": endpoint})


def test_network_combinations_with_a_remote_engine_that_work_pass_validation() -> None:
    for docker, endpoint in (
        ({"base_url": "tcp://gpu-host:2376", "network": "fl"},
         {"host": "0.0.0.0", "advertise": "site-a"}),
        ({"base_url": "tcp://gpu-host:2376", "network": "host"}, {}),
        ({"base_url": "unix:///run/docker.sock", "network": "fl"}, {}),
    ):
        parse_site_config({"launcher": "docker", "docker": docker, "worker_endpoint": endpoint})


# --- GPUs ----------------------------------------------------------------------------------------


def test_gpus_are_the_reserved_device_ids_never_a_count() -> None:
    request = request_for(resource_spec={"@default": {"num_of_gpus": 2}})
    gpus = run_kwargs(request, gpu_ids=["3", "5"])["device_requests"]
    assert gpus == [{"driver": "", "count": 0, "device_ids": ["3", "5"],
                     "capabilities": [["gpu"]]}]


def test_a_job_without_gpus_asks_the_engine_for_none() -> None:
    request = request_for(resource_spec={"@default": {"num_of_gpus": 0}})
    assert run_kwargs(request)["device_requests"] == []  # never a request the engine fills


def test_gpu_ids_default_to_the_site_capacity_and_a_site_without_gpus_refuses() -> None:
    site = parse_site_config({"launcher": "docker", "capacity": {"gpus": 2}})
    from atoll.launchers.docker_render import site_gpu_ids

    assert site_gpu_ids(site) == ["0", "1"]
    with pytest.raises(LaunchError, match="docker.gpu_ids"):
        render_docker(request_for(docker={"gpu_ids": []}))  # the seed asks one GPU


def test_job_user_follows_the_parent() -> None:
    assert run_kwargs(request_for(), parent_ids=(0, 0))["user"] == "1000:1000"
    assert run_kwargs(request_for(), parent_ids=(1234, 2345))["user"] == "1234:2345"


def test_labels_name_job_site_and_study_plus_site_labels() -> None:
    labels = run_kwargs(request_for(docker={"labels": {"team": "fl"}}))["labels"]
    assert labels == {
        "atoll.job_id": JOB_ID,
        "atoll.job_name": "pathology-fedavg",
        "atoll.role": "site",
        "atoll.site": "hospital-a",
        "atoll.study": "pathology",
        "team": "fl",
    }


def test_site_labels_may_not_take_atoll_labels() -> None:
    with pytest.raises(SpecError, match=r"labels\.atoll\.job_id"):
        request_for(docker={"labels": {"atoll.job_id": "x"}})


# --- exit codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "oom", "error", "outcome", "reason"),
    [
        (0, False, "", Outcome.COMPLETED, "worker exited with code 0"),
        (137, True, "", Outcome.FAILED, "out of memory (limit 64Gi)"),
        (137, False, "", Outcome.FAILED, "worker killed by SIGKILL (exit code 137)"),
        (143, False, "", Outcome.FAILED, "worker killed by SIGTERM (exit code 143)"),
        (3, False, "", Outcome.FAILED, "worker exited with code 3; see logs/worker.log"),
        (1, False, "no space left", Outcome.FAILED, "the engine reports: no space left"),
    ],
)
def test_exit_codes_map_to_outcomes(
    code: int, oom: bool, error: str, outcome: Outcome, reason: str
) -> None:
    result = exit_to_outcome(code, oom, error, "64Gi")
    assert result.outcome is outcome and result.exit_code == code
    assert reason in result.reason


def test_a_job_of_several_ranks_runs_them_in_one_container() -> None:
    ranks = {"default": {"docker": {"processes_per_node": 4}}}
    env = run_kwargs(request_for(resource_spec={"@default": {"num_of_gpus": 4}},
                                 launcher_spec=ranks))["environment"]
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == ("4", "4",
                                                                               "127.0.0.1")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the container's GPUs, one per rank
    # Names (no values) of what rank 0 alone keeps: the token and the study's secrets.
    assert env["ATOLL_RANK0_ONLY_ENV"] == "ATOLL_JOB_TOKEN,DB_PASSWORD,DB_USER"
    one = run_kwargs(request_for(resource_spec={"@default": {"num_of_gpus": 1}}))["environment"]
    assert "WORLD_SIZE" not in one and "CUDA_VISIBLE_DEVICES" not in one
    # GPUs without ranks: one process, which sees every GPU the runtime gives the container
    all4 = run_kwargs(request_for(resource_spec={"@default": {"num_of_gpus": 4}}))
    assert "WORLD_SIZE" not in all4["environment"]
    assert "CUDA_VISIBLE_DEVICES" not in all4["environment"]
    assert len(all4["device_requests"][0]["device_ids"]) == 4
