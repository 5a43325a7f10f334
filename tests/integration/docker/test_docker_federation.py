"""A federated job whose site runs its worker in a container of the real engine (marker: docker).

The server and the site parent are real processes with mutual TLS (the federation harness); the
site's launcher is docker, so its worker is a container of the test job image (built from
docker/job.Dockerfile with this working tree's atoll by ``scripts/backends/docker.sh up``). The
parent listens for its worker on 127.0.0.1: the container reaches it through the host network.
"""

from __future__ import annotations

import pytest
import yaml

from tests.integration.docker.conftest import SESSION_ID, SESSION_LABEL, Engine
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job

pytestmark = pytest.mark.docker

ADMIN = "admin@docker.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
STUDIES = {"dockerized": {"sites": ["site-d"], "admins": [ADMIN]}}


@pytest.fixture(scope="module")
def docker_federation(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory):
    runtime = {"site-d": "format_version: 2\nstudies:\n  dockerized: {}\n"}
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
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_a_job_completes_on_a_docker_site(docker_federation: Federation, tmp_path) -> None:
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
