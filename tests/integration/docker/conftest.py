"""The real Docker Engine of scripts/backends/docker.sh, and a DockerLauncher wired to it.

Start it once with ``scripts/backends/docker.sh up`` (about 2 minutes on a fresh machine,
seconds after). Without it these tests skip, or fail when ``CI=true``. Every container the tests
create carries ``atoll.test.session=<id>`` and is removed by that label at the end of the session.

Note for the federation: a worker container has no network (``network_mode: none``) and reaches
a site parent listening on 127.0.0.1 through the relay socket in its run folder
(launchers/socket_relay.py); ``test_worker_reaches_a_loopback_parent_with_its_token`` proves it
with a real TCP listener.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.launchers.docker import DockerLauncher
from atoll.spec.resources import Resources
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.integration.backend_env import read_env_file

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "backends" / "docker.sh"
SESSION_ID = uuid.uuid4().hex[:12]
SESSION_LABEL = "atoll.test.session"
STUDY = "imaging"


def _engine_env() -> dict[str, str]:
    """The env file `docker.sh up` wrote (DOCKER_HOST and the test image names)."""
    return read_env_file("ATOLL_DOCKER_BASE", "/tmp/atoll-docker")


@dataclass
class Engine:
    env: dict[str, str]
    client: Any  # docker.DockerClient

    @property
    def job_image(self) -> str:
        return self.env["ATOLL_TEST_JOB_IMAGE"]

    def session_containers(self) -> list[Any]:
        return self.client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={SESSION_ID}"}
        )


# The engine of this session: tests/security reuses this fixture from its own conftest, and
# pytest then sets it up twice; the second gets the first's engine, the first tears down.
_ACTIVE: list[Engine] = []


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    if _ACTIVE:
        yield _ACTIVE[0]
        return
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        why = f"no test Docker Engine ({status.stderr.strip()}); start it: {SCRIPT} up"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    import docker
    env = _engine_env()
    client = docker.DockerClient(base_url=env["DOCKER_HOST"])
    engine = Engine(env, client)
    _ACTIVE.append(engine)
    yield engine
    _ACTIVE.clear()
    for container in engine.session_containers():
        container.remove(force=True)
    images = client.images.list(filters={"label": f"{SESSION_LABEL}={SESSION_ID}"})
    for image in images:
        client.images.remove(image.id, force=True)
    left = engine.session_containers()
    client.close()
    assert not left, f"containers of this test session left behind: {[c.name for c in left]}"


def site_config(engine: Engine, **docker: Any) -> Any:
    settings = {
        "base_url": engine.env["DOCKER_HOST"],
        "default_image": engine.job_image,
        "pull_policy": "never",  # nothing leaves this machine
        "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID},
        **docker,
    }
    return parse_site_config({"launcher": "docker", "docker": settings})


def study_entry(**entry: Any) -> Any:
    runtime = parse_study_runtime({"format_version": 2, "studies": {STUDY: entry}}, "docker")
    return runtime.entry(STUDY)


def make_request(
    workdir: Path,
    program: str,
    *,
    site_config: Any,
    study: Any = None,
    resources: Resources | None = None,
    launcher_spec: dict[str, Any] | None = None,
    parent_address: str = "127.0.0.1:9",
    credentials: dict[str, str] | None = None,
) -> LaunchRequest:
    """A request whose worker runs ``python3 -c program`` under the launcher's rules."""
    job_id = uuid.uuid4().hex
    identity = JobIdentity(job_id, "docker-it", STUDY, "site-1", "site")
    return LaunchRequest(
        identity=identity,
        resources=resources or Resources(num_of_gpus=0, num_of_cpus=1, memory="256Mi"),
        launcher_spec=launcher_spec or {},
        study_runtime=study,
        site_config=site_config,
        workdir=workdir,
        parent_address=parent_address,
        worker_env={
            "ATOLL_JOB_ID": job_id,
            "ATOLL_ROLE": "site",
            "ATOLL_SITE": "site-1",
            "ATOLL_STUDY": STUDY,
            "ATOLL_PARENT": parent_address,
        },
        credentials={"ATOLL_JOB_TOKEN": f"token-{job_id}", **(credentials or {})},
        worker_args=("-c", program),
    )


@pytest.fixture
def launcher(docker_engine: Engine) -> Iterator[DockerLauncher]:
    launcher = DockerLauncher(site_config(docker_engine))
    yield launcher
    launcher.close()
