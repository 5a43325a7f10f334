"""The parents deployed as containers of the parent image, as docs/deploy-docker.md's `docker run`
lines do it, on the real engine of scripts/backends/docker.sh; a federated job completes.

The server and the site parent each run in a container of docker/parent.Dockerfile's image (uid
1000), with their kit bound at the same path as on the host and the engine's socket, so that
their launcher (docker) starts the job containers on the host's engine. The job containers get
neither the socket nor the engine's address. The test engine has no bridge network: the parents
use the host's network (the guide's `--network host` variant); the job containers have none and
reach their parent through the relay socket in their run folder.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from tests.integration.docker.conftest import SESSION_ID, SESSION_LABEL, Engine
from tests.integration.docker.deployment import own_kit, parent_container, wait_online, write_local
from tests.integration.federation.harness import PROJECT, Federation, free_port, project_doc
from tests.integration.federation.jobs import make_job

pytestmark = pytest.mark.docker

ADMIN = "admin@compose.test"
SITE = "site-c"


class WorkerLog:
    """What each job container looked like while it ran (the launcher removes it at the end)."""

    def __init__(self, engine: Engine):
        self.seen: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(engine,), daemon=True)
        self._thread.start()

    def _poll(self, engine: Engine) -> None:
        while not self._stop.wait(0.2):
            for container in engine.client.containers.list(
                    filters={"label": ["atoll.job_id", f"{SESSION_LABEL}={SESSION_ID}"]}):
                self.seen.setdefault(container.name, container.attrs)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_parent_containers_run_a_federated_job(docker_engine: Engine, tmp_path: Path) -> None:
    parent_image = docker_engine.env.get("ATOLL_TEST_PARENT_IMAGE")
    if not parent_image or not docker_engine.client.images.list(name=parent_image):
        why = 'no parent image: ATOLL_DOCKER_IMAGES="busybox python job parent" docker.sh up'
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    doc = project_doc(free_port(), [SITE], [{"name": ADMIN, "org": "test", "role": "project_admin"}])
    provision(parse_project(doc, "test"), tmp_path)
    fed = Federation(tmp_path / PROJECT, [SITE])
    (fed.kit(SITE) / "local" / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  default: {}\n")
    for name in ("server", SITE):
        write_local(fed, name, docker_engine.job_image)
        own_kit(fed.kit(name))
    socket_gid = os.stat(docker_engine.env["DOCKER_HOST"].removeprefix("unix://")).st_gid
    workers = WorkerLog(docker_engine)
    containers = []
    try:
        started = time.monotonic()
        containers.append(parent_container(docker_engine, parent_image, "server", fed.kit("server"),
                                  socket_gid))
        containers.append(parent_container(docker_engine, parent_image, "site", fed.kit(SITE), socket_gid))
        wait_online(fed, ADMIN, containers, 120)
        print(f"\nparent containers started -> site online: {time.monotonic() - started:.1f} s")

        job_dir = make_job(tmp_path / "compose-echo", rounds=2)
        meta = json.loads((job_dir / "meta.json").read_text())
        meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "512Mi"}}
        (job_dir / "meta.json").write_text(json.dumps(meta))
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=240)
        logs = "\n".join(f"--- {c.name}\n{c.logs(tail=30).decode()}" for c in containers)
        assert job["state"] == "FINISHED:COMPLETED", f"{job['reason']} {job['parts']}\n{logs}"
    finally:
        workers.stop()
        exits = {}
        for container in containers:  # stopped, then gone: a later test counts this session's
            container.stop(timeout=20)
            container.reload()
            exits[container.name] = (container.attrs["State"]["ExitCode"],
                                     container.logs(tail=20).decode())
            container.remove(force=True)
    ran = {attrs["Config"]["Labels"]["atoll.role"]: attrs for attrs in workers.seen.values()
           if attrs["Config"]["Labels"].get("atoll.job_id") == job["job_id"]}
    assert sorted(ran) == ["server", "site"]
    for attrs in ran.values():  # the engine stays with the parents
        sources = [m["Source"] for m in attrs["Mounts"]]
        assert not [s for s in sources if s.endswith(".sock")], sources
        assert not [e for e in attrs["Config"]["Env"] if e.startswith("DOCKER_HOST=")]
    assert (fed.workspace(SITE) / "jobs" / job["job_id"] / "logs" / "worker.log").exists()
    for code, logs in exits.values():
        assert code == 0, logs
