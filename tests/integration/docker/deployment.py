"""The parents as containers of the parent image, as docs/deploy-docker.md's `docker run` lines
start them: shared by tests/integration/docker/test_docker_deployment.py and
bench/deploy_start.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from atoll.admin.errors import ConnectionFailed
from tests.integration.docker.conftest import SESSION_ID, SESSION_LABEL, Engine
from tests.integration.federation.harness import Federation

SOCKET = "/var/run/docker.sock"  # where the parents see the engine


def parent_container(engine: Engine, image: str, role: str, kit: Path, socket_gid: int) -> Any:
    """docker run -d --network host --user 1000:1000 --group-add GID
         -v SOCKET:/var/run/docker.sock -v KIT:KIT IMAGE ROLE start KIT"""
    host_socket = engine.env["DOCKER_HOST"].removeprefix("unix://")
    return engine.client.containers.run(
        image, [role, "start", str(kit)], detach=True, name=f"atoll-{role}-{SESSION_ID}",
        network_mode="host", user="1000:1000", group_add=[str(socket_gid)],
        environment={"DOCKER_HOST": f"unix://{SOCKET}"},
        volumes={host_socket: {"bind": SOCKET, "mode": "rw"},
                 str(kit): {"bind": str(kit), "mode": "rw"}},
        labels={"atoll.test": "1", SESSION_LABEL: SESSION_ID})


def write_local(fed: Federation, name: str, job_image: str) -> None:
    """local/site.yaml: the docker launcher, on the engine the parent container was given."""
    site_yaml = {"launcher": "docker",
                 "docker": {"default_image": job_image, "pull_policy": "never",
                            "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID}}}
    (fed.kit(name) / "local").mkdir(exist_ok=True)
    (fed.kit(name) / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))


def own_kit(path: Path, uid: int = 1000) -> None:
    """The kit belongs to the parent image's user, as the guide's `chown -R 1000:1000`."""
    for folder, dirs, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chown(name, uid, uid)


def wait_online(fed: Federation, admin: str, containers: list[Any], seconds: float) -> None:
    """Until the server answers and sees every site online (the containers may be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fed.wait_online(admin, timeout=max(deadline - time.monotonic(), 1))
            return
        except (ConnectionFailed, TimeoutError) as exc:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {c.name}\n{c.logs(tail=30).decode()}" for c in containers)
                raise AssertionError(f"site not online: {exc}\n{logs}") from None
            time.sleep(0.25)
