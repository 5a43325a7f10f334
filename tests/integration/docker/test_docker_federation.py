"""A federated job whose site runs its worker in a container of the real engine (marker: docker).

The server and the site parent are real processes with mutual TLS (the federation harness); the
site's launcher is docker, so its worker is a container of the test job image (built from
docker/job.Dockerfile with this working tree's atoll by ``scripts/backends/docker.sh up``). The
parent listens for its worker on 127.0.0.1: the container, without a network, reaches it through
the relay socket in its run folder.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from tests.integration.docker.conftest import SESSION_ID, SESSION_LABEL, Engine
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job
from tests.integration.federation.provenance_check import verified_launch_entry

pytestmark = pytest.mark.docker

ADMIN = "admin@docker.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
STUDIES = {"dockerized": {"sites": ["site-d"], "admins": [ADMIN]}}


@pytest.fixture(scope="module")
def docker_federation(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory):
    runtime = {"site-d": "format_version: 2\nstudies:\n  dockerized:\n    secret_env:\n"
                         "      DDP_SECRET: {source: env, key: ATOLL_TEST_DDP_SECRET}\n"}
    fed = Federation.provisioned(
        tmp_path_factory.mktemp("docker-fed"), ["site-d"], USERS, STUDIES, runtime=runtime
    )
    site_yaml = {
        "launcher": "docker",
        "docker": {
            "base_url": docker_engine.env["DOCKER_HOST"],
            "default_image": docker_engine.job_image,
            "pull_policy": "never",
            "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID},
        },
        "capacity": {"gpus": 0, "cpus": 2, "memory": "2Gi"},
    }
    (fed.kit("site-d") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site("site-d", env={"ATOLL_TEST_DDP_SECRET": "s3cr3t"})
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_a_job_completes_on_a_docker_site(docker_federation: Federation, docker_engine: Engine,
                                          tmp_path) -> None:
    job_dir = make_job(tmp_path / "docker-echo", sites=["site-d"])
    meta = job_dir / "meta.json"
    meta.write_text(
        meta.read_text()[:-1] + ', "resource_spec": {"@default": {"num_of_cpus": 1, '
        '"memory": "512Mi"}}}'
    )
    with docker_federation.session(ADMIN, study="dockerized") as session:
        job = session.submit(job_dir, wait=True, timeout=180)
    site_log = docker_federation.log("site-d")
    assert job["state"] == "FINISHED:COMPLETED", f"{job}\nsite-d log:\n{site_log}"
    worker_log = docker_federation.workspace("site-d") / "jobs" / job["job_id"] / "logs"
    assert (worker_log / "worker.log").exists()
    # its provenance record verifies offline and names the image's id as the engine has it
    launch = verified_launch_entry(docker_federation, ADMIN, job["job_id"], "site-d", tmp_path,
                                   study="dockerized")
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", docker_engine.job_image],
        env={**os.environ, "DOCKER_HOST": docker_engine.env["DOCKER_HOST"]},
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert inspected.startswith("sha256:") and launch["image_id"] == inspected, launch
    assert launch["image"] == docker_engine.job_image and launch["launcher"] == "docker"



# The test job image has no torch (docker.sh builds it without): the ranks only record what they
# were given, then exit without answering; the DDP training itself runs in the process and
# Slurm federation tests.
RANK_PROBE = """
import json, os
rank = os.environ["RANK"]
with open(os.path.join(os.environ["ATOLL_WORKDIR"], f"probe-{rank}.json"), "w") as out:
    json.dump({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ATOLL_JOB_TOKEN",
               "ATOLL_CREDENTIALS_FD", "DDP_SECRET")}, out)
"""


def test_two_ranks_start_in_the_jobs_one_container(docker_federation: Federation,
                                                   tmp_path) -> None:
    """launcher_spec docker.processes_per_node 2: the worker in the job's one container becomes
    rank 0 (it alone registers and holds the token and the study's secrets) and starts rank 1
    beside it."""
    job_dir = make_job(tmp_path / "docker-ranks", script=RANK_PROBE, sites=["site-d"],
                       round_timeout=20)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "512Mi"}}
    meta["launcher_spec"] = {"site-d": {"docker": {"processes_per_node": 2}}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    with docker_federation.session(ADMIN, study="dockerized") as session:
        job = session.submit(job_dir, wait=True, timeout=180)
    folder = docker_federation.workspace("site-d") / "jobs" / job["job_id"]
    assert job["parts"]["site-d"]["state"] == "FINISHED:COMPLETED", job
    probes = [json.loads((folder / f"probe-{r}.json").read_text()) for r in (0, 1)]
    for rank, probe in enumerate(probes):
        assert (probe["RANK"], probe["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (probe["WORLD_SIZE"], probe["LOCAL_WORLD_SIZE"]) == ("2", "2")
        assert probe["MASTER_ADDR"] == "127.0.0.1" and probe["MASTER_PORT"].isdigit()
        assert probe["ATOLL_JOB_TOKEN"] is None and probe["ATOLL_CREDENTIALS_FD"] is None
    assert probes[0]["MASTER_PORT"] == probes[1]["MASTER_PORT"]
    # The study's secret is in the container's environment: rank 0 keeps it, rank 1 never
    # gets it.
    assert (probes[0]["DDP_SECRET"], probes[1]["DDP_SECRET"]) == ("s3cr3t", None)
    log = (folder / "logs" / "worker.log").read_text()
    assert log.count("registered with") == 1, log


def test_the_server_workers_results_come_home_from_its_container(
        docker_engine: Engine, tmp_path) -> None:
    """The server's own worker as a container: what the workflow writes reaches `atoll job
    download` (issue 36: results come home from every launcher)."""
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    server_yaml = {"launcher": "docker", "docker": {
        "base_url": docker_engine.env["DOCKER_HOST"], "default_image": docker_engine.job_image,
        "pull_policy": "never", "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID}}}
    (fed.kit("server") / "local" / "site.yaml").write_text(yaml.safe_dump(server_yaml))
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(make_job(tmp_path / "server-in-a-container", rounds=2),
                                 wait=True, timeout=180)
            out = session.download(job["job_id"], tmp_path / "download")
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"], fed.log("server"))
    assert "registered with" in (out / "logs" / "server" / "worker.log").read_text()
    report = json.loads((out / "results" / "scatter_gather.json").read_text())
    assert len(report["rounds"]) == 2, report
